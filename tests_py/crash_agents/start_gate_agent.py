"""A one-node agent behind a review gate at START, for crashes around the gated turn's commit.
``build(checkpointer)`` (``"tests_py.crash_agents.start_gate_agent:build"``): ``charge`` records
its effect in the test's :class:`~tenxgraph.testing.EffectCounter`; ``$START_GATE`` is
``before`` (``interrupt_before=[START]``) or ``after`` (``interrupt_after=[START]``)."""

from __future__ import annotations

import os
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.testing import EffectCounter


def charge(state: AgentState) -> Message:
    EffectCounter.from_env().record("charge")
    return Message.text_message("charged", role="assistant")


def build(checkpointer: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("charge", charge)
    g.add_edge(START, "charge")
    g.add_edge("charge", END)
    gate = os.environ.get("START_GATE", "after")
    return g.compile(checkpointer=checkpointer, **{f"interrupt_{gate}": [START]})
