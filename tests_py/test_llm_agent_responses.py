"""Agent(api_style="responses"): the OpenAI Responses API through the real SDK against the stand-in."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from tenxgraph.core.exceptions import NodeError
from tenxgraph.core.graph import RetryConfig
from tenxgraph.core.llm import ModelCallError
from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.testing.providers import OpenAIStandIn

FAST = RetryConfig(max_retries=2, initial_delay=0.01, max_delay=0.05)


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch):
    with OpenAIStandIn() as server:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        yield server


def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def react(**kw):
    kw.setdefault("retry_config", FAST)
    return ReactAgent(model="openai/gpt-4o-mini", api_style="responses", tools=[weather],
                      system_prompt=[{"role": "system", "content": "Be brief."}], **kw)


def ask(app, text: str, thread: str = "t1"):
    return asyncio.run(app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": thread}))


def test_tool_calling_turn(llm: OpenAIStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Paris"}))
    llm.reply_text("Sunny in Paris.")
    out = ask(react().compile(checkpointer=InMemoryCheckpointer()), "Paris?")
    assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "assistant"]
    call = out["messages"][1]
    assert str(call.message_id).startswith("resp_")
    assert call.tools_calls == [{"id": "call_1", "type": "function",
                                 "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]
    assert call.usages is not None and call.usages.total_tokens > 0
    assert out["messages"][-1].text() == "Sunny in Paris."
    assert all(r.path.endswith("/responses") for r in llm.requests)
    first, second = (r.body for r in llm.requests)
    assert first["instructions"] == "Be brief."
    assert first["input"] == [{"role": "user", "content": "Paris?"}]
    assert first["tools"] == [{"type": "function", "name": "weather", "description": "Current weather for a city.",
                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                              "required": ["city"]}}]
    assert first["reasoning"] == {"effort": "medium"} and "reasoning_effort" not in first
    assert second["input"][1:] == [
        {"type": "function_call", "name": "weather", "arguments": '{"city": "Paris"}', "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny in Paris"},
    ]


def test_streamed_turn(llm: OpenAIStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Oslo"}))
    llm.reply_text("Oslo is sunny today.", pieces=4)
    app = react().compile()

    async def run():
        return [c async for c in app.astream({"messages": [Message.text_message("Oslo?")]}, {"thread_id": "s"})]

    msgs = [c.message for c in asyncio.run(run()) if c.message is not None and c.message.role == "assistant"]
    deltas = [m.text() for m in msgs if m.delta]
    finals = [m for m in msgs if not m.delta]
    assert "".join(deltas) == "Oslo is sunny today." and len(deltas) == 4
    assert finals[0].tools_calls[0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert finals[-1].text() == "Oslo is sunny today." and finals[-1].usages.total_tokens > 0
    assert all(r.stream and r.path.endswith("/responses") for r in llm.requests)


def test_retry_after_429_then_fallback(llm: OpenAIStandIn) -> None:
    llm.reply_error(429, model="gpt-4o-mini")
    for _ in range(2):
        llm.reply_error(503, model="gpt-4o-mini")
    llm.reply_text("from the fallback", model="gpt-4.1-nano")
    out = ask(react(fallback_models=["gpt-4.1-nano"]).compile(), "hi")
    assert out["messages"][-1].text() == "from the fallback"
    assert [r.body["model"] for r in llm.requests] == ["gpt-4o-mini"] * 3 + ["gpt-4.1-nano"]
    assert [r.reply for r in llm.requests] == ["error", "error", "error", "text"]
    assert llm.pending == 0


def test_every_attempt_failing_is_typed(llm: OpenAIStandIn) -> None:
    for _ in range(3):
        llm.reply_error(500)
    with pytest.raises(NodeError) as err:
        ask(react().compile(), "hi")
    assert isinstance(err.value.__cause__, ModelCallError)
    assert err.value.__cause__.error_code == "LLM_PROVIDER_001"


def test_structured_output_uses_chat_completions(llm: OpenAIStandIn) -> None:
    class City(BaseModel):
        name: str

    llm.reply_json({"name": "Rome"})
    app = ReactAgent(model="gpt-4o-mini", api_style="responses", output_schema=City, retry_config=False).compile()
    out = ask(app, "a city")
    assert out["messages"][-1].parsed_content == City(name="Rome")
    assert llm.requests[0].path.endswith("/chat/completions")


def test_a_server_without_the_responses_api_falls_back_to_chat(monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenAIStandIn(apis=("chat",)) as llm:
        llm.reply_text("answered by chat completions")
        app = react(base_url=llm.base_url, api_key="sk-local").compile()
        out = ask(app, "hi")
    assert out["messages"][-1].text() == "answered by chat completions"
    assert [r.reply for r in llm.requests] == ["not_found", "text"]
    assert llm.requests[1].path.endswith("/chat/completions")


def test_a_rate_limit_on_the_responses_api_is_retried_there(llm: OpenAIStandIn) -> None:
    """With base_url=, 10xGraph answers any Responses error by trying chat completions; a 429
    here is retried on the Responses API (only a missing endpoint switches to chat)."""
    llm.reply_error(429)
    llm.reply_text("second try")
    out = ask(react(base_url=llm.base_url).compile(), "hi")
    assert out["messages"][-1].text() == "second try"
    assert [r.path for r in llm.requests] == ["/v1/responses", "/v1/responses"]
