"""The rules every provider path keeps, one test each, run on OpenAI chat, Anthropic and Google
GenAI through their real SDKs against the local stand-ins: a streamed final message is never
shown before its step commits, and an HTTP 429 is retried."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("anthropic")
pytest.importorskip("google.genai")

from tenxgraph.core.graph import RetryConfig  # noqa: E402
from tenxgraph.core.state import Message  # noqa: E402
from tenxgraph.prebuilt.agent import ReactAgent  # noqa: E402
from tenxgraph.storage.checkpointer import InMemoryCheckpointer  # noqa: E402
from tests_py.llm_agents.stand_in_env import serving  # noqa: E402
from tenxgraph.testing.providers import AnthropicStandIn, GoogleStandIn, OpenAIStandIn  # noqa: E402

FAST = RetryConfig(max_retries=2, initial_delay=0.01, max_delay=0.05)
PROVIDERS = {
    "openai": (OpenAIStandIn, "openai/gpt-4o-mini"),
    "anthropic": (AnthropicStandIn, "anthropic/claude-sonnet-4-5"),
    "google": (GoogleStandIn, "gemini/gemini-2.5-flash"),
}
# Variables that would send a provider's SDK elsewhere than its stand-in.
OTHER_ENV = ("ANTHROPIC_AUTH_TOKEN", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI")


@pytest.fixture(params=sorted(PROVIDERS))
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    stand_in, model = PROVIDERS[request.param]
    for server in serving(stand_in, monkeypatch, drop=OTHER_ENV):
        yield server, model


def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def react(model: str):
    return ReactAgent(model=model, system_prompt=[{"role": "system", "content": "Be brief."}], tools=[weather],
                      retry_config=FAST)


def test_streamed_final_message_is_not_shown_when_its_step_does_not_commit(provider) -> None:  # type: ignore[no-untyped-def]
    llm, model = provider
    llm.reply_text("This answer never commits.")
    app = react(model).compile(checkpointer=InMemoryCheckpointer())
    chunks = []

    async def run() -> None:
        async for c in app.astream({"messages": [Message.text_message("hi")]},
                                   {"thread_id": "s2", "failpoints": "in_step_tx:MAIN=raise"}):
            chunks.append(c)

    with pytest.raises(Exception) as err:
        asyncio.run(run())
    assert "FAILPOINT" in str(err.value)
    msgs = [c.message for c in chunks if c.message is not None]
    # The deltas were shown as they came; the final message, whose step did not commit, never.
    assert "".join(m.text() for m in msgs if m.delta) == "This answer never commits."
    assert not [m for m in msgs if not m.delta and m.role == "assistant"]


def test_retry_after_429(provider) -> None:  # type: ignore[no-untyped-def]
    llm, model = provider
    llm.reply_error(429, "rate limited")
    llm.reply_text("ok after a retry")
    out = asyncio.run(react(model).compile().ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t1"}))
    assert out["messages"][-1].text() == "ok after a retry"
    assert [r.reply for r in llm.requests] == ["error", "text"]
