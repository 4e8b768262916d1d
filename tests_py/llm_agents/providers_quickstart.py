"""10xGraph's quick start on the two other providers, for the crash kit's child processes: the
README's own model string (``gemini/gemini-2.5-flash``, served by the test's GoogleStandIn through
``GOOGLE_GEMINI_BASE_URL``) and a Claude one (AnthropicStandIn, ``ANTHROPIC_BASE_URL``). The tools
are quickstart.py's, which record their side effects in the test's EffectCounter."""

from __future__ import annotations

from typing import Any

from tenxgraph.prebuilt.agent import ReactAgent
from tests_py.llm_agents.quickstart import lookup_order, refund_order


def _build(model: str, checkpointer: Any):
    return ReactAgent(
        model=model,
        system_prompt=[{"role": "system", "content": "You are a support agent for an online store."}],
        tools=[lookup_order, refund_order],
    ).compile(checkpointer=checkpointer)


def build_gemini(checkpointer: Any):
    """The quick start exactly as the README writes it."""
    return _build("gemini/gemini-2.5-flash", checkpointer)


def build_claude(checkpointer: Any):
    """The quick start on a Claude model."""
    return _build("anthropic/claude-sonnet-4-5", checkpointer)
