"""Agent with the Anthropic provider, through the real ``anthropic`` SDK against the local
AnthropicStandIn: the request 10xGraph sends, a tool-calling turn, a streamed turn, retries,
fallbacks (also onto another provider), structured output, a missing key, and a SIGKILL after a
tool's side effect whose resume does not repeat it."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

pytest.importorskip("anthropic")

from tenxgraph.core.exceptions import NodeError  # noqa: E402
from tenxgraph.core.graph import Agent, RetryConfig, StateGraph  # noqa: E402
from tenxgraph.core.llm import ModelCallError, ModelConfigError  # noqa: E402
from tenxgraph.core.state import Message  # noqa: E402
from tenxgraph.core.state.stream_chunks import StreamEvent  # noqa: E402
from tenxgraph.prebuilt.agent import ReactAgent  # noqa: E402
from tenxgraph.storage.checkpointer import InMemoryCheckpointer  # noqa: E402
from tenxgraph.testing import CrashKit, EffectCounter  # noqa: E402
from tests_py.llm_agents.stand_in_env import serving  # noqa: E402
from tenxgraph.testing.providers import AnthropicStandIn, OpenAIStandIn  # noqa: E402
from tenxgraph.utils.constants import END  # noqa: E402

FAST = RetryConfig(max_retries=2, initial_delay=0.01, max_delay=0.05)
MODEL = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch):
    yield from serving(AnthropicStandIn, monkeypatch, drop=["ANTHROPIC_AUTH_TOKEN"])


def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def react(**kw):
    kw.setdefault("retry_config", FAST)
    kw.setdefault("model", MODEL)
    return ReactAgent(system_prompt=[{"role": "system", "content": "Be brief."}], tools=[weather], **kw)


def _key(headers: dict[str, str]) -> str:
    # Older SDKs send x-api-key, newer ones a bearer token.
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")


def ask(app, text: str, thread: str = "t1"):
    return asyncio.run(app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": thread}))


def test_tool_calling_turn_request_and_reply(llm: AnthropicStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Paris"}, "toolu_1"), usage={"input_tokens": 11, "output_tokens": 7})
    llm.reply_text("It is sunny in Paris.", usage={"input_tokens": 20, "output_tokens": 6})
    out = ask(react().compile(checkpointer=InMemoryCheckpointer()), "Weather in Paris?")
    assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "assistant"]
    call = out["messages"][1]
    assert call.tools_calls == [{"id": "toolu_1", "type": "function",
                                 "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]
    assert str(call.message_id).startswith("msg_")
    assert call.metadata["provider"] == "anthropic" and call.metadata["finish_reason"] == "tool_use"
    assert (call.usages.prompt_tokens, call.usages.completion_tokens, call.usages.total_tokens) == (11, 7, 18)
    assert out["messages"][3].text() == "It is sunny in Paris."
    assert out["token_usage"]["total_tokens"] == 44
    first, second = (r.body for r in llm.requests)
    # The system prompt is top-level, tools are flat, max_tokens and the reasoning default are set.
    assert first["model"] == "claude-sonnet-4-5"
    assert first["system"] == [{"type": "text", "text": "Be brief."}]
    assert first["messages"] == [{"role": "user", "content": "Weather in Paris?"}]
    assert first["tools"] == [{"name": "weather", "description": "Current weather for a city.",
                               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"]}}]
    assert first["max_tokens"] == 16000
    assert first["thinking"] == {"type": "adaptive"} and first["output_config"] == {"effort": "medium"}
    assert second["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny in Paris"}]},
    ]
    assert _key(llm.requests[0].headers) == "sk-ant-stand-in"


def test_parallel_tool_results_go_back_in_one_user_turn(llm: AnthropicStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Oslo"}, "toolu_a"), ("weather", {"city": "Rome"}, "toolu_b"),
                         text="Checking both.")
    llm.reply_text("Both sunny.")
    out = ask(react(reasoning_config=None).compile(), "Oslo and Rome?")
    assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]
    sent = llm.requests[1].body
    assert sent["messages"][1]["content"][0] == {"type": "text", "text": "Checking both."}
    assert sent["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "sunny in Oslo"},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": "sunny in Rome"}]}
    assert "thinking" not in sent and "output_config" not in sent  # reasoning_config=None: none asked


def test_streamed_turn_deltas_then_the_committed_message(llm: AnthropicStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Oslo"}, "toolu_s"))
    llm.reply_text("Oslo is sunny today, enjoy.", pieces=4, usage={"input_tokens": 9, "output_tokens": 5})
    app = react().compile(checkpointer=InMemoryCheckpointer())

    async def run():
        return [c async for c in app.astream({"messages": [Message.text_message("Oslo?")]}, {"thread_id": "s1"})]

    msgs = [c.message for c in asyncio.run(run()) if c.event == StreamEvent.MESSAGE and c.message is not None]
    deltas = [m for m in msgs if m.delta]
    finals = [m for m in msgs if not m.delta and m.role == "assistant"]
    # The tool call's input came as input_json_delta pieces: put back together at its block's end.
    assert finals[0].tools_calls == [{"id": "toolu_s", "type": "function",
                                      "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]
    assert "".join(d.text() for d in deltas) == "Oslo is sunny today, enjoy."
    assert len(deltas) == 4
    assert finals[-1].text() == "Oslo is sunny today, enjoy."
    assert msgs.index(finals[-1]) > max(i for i, m in enumerate(msgs) if m.delta)
    assert (finals[-1].usages.prompt_tokens, finals[-1].usages.completion_tokens) == (9, 5)
    assert all(r.stream for r in llm.requests)
    assert llm.requests[0].body["max_tokens"] == 64000  # 10xGraph's streaming default






def test_overloaded_529_then_fallback_model(llm: AnthropicStandIn) -> None:
    for _ in range(3):
        llm.reply_error(529, "overloaded", model="claude-sonnet-4-5")
    llm.reply_text("from the fallback", model="claude-haiku-4-5")
    out = ask(react(fallback_models=["claude-haiku-4-5"]).compile(), "hi")
    assert out["messages"][-1].text() == "from the fallback"
    assert [r.model for r in llm.requests] == ["claude-sonnet-4-5"] * 3 + ["claude-haiku-4-5"]


def test_fallback_onto_another_provider(llm: AnthropicStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenAIStandIn() as other:
        for k, v in other.env.items():
            monkeypatch.setenv(k, v)
        llm.reply_error(500)
        llm.reply_error(500)
        other.reply_text("answered by OpenAI")
        app = react(retry_config=RetryConfig(max_retries=1, initial_delay=0.01),
                    fallback_models=[("gpt-4o-mini", "openai")]).compile()
        out = ask(app, "hi")
        assert out["messages"][-1].text() == "answered by OpenAI"
        assert out["messages"][-1].metadata["provider"] == "openai"
        assert len(llm.requests) == 2 and [r.body["model"] for r in other.requests] == ["gpt-4o-mini"]


def test_every_attempt_failing_is_a_typed_error_and_nothing_is_committed(llm: AnthropicStandIn) -> None:
    for _ in range(3):
        llm.reply_error(500)
    cp = InMemoryCheckpointer()
    with pytest.raises(NodeError) as err:
        ask(react().compile(checkpointer=cp), "hi", thread="f1")
    cause = err.value.__cause__
    assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_001"
    assert cause.context["status_code"] == 500 and len(cause.context["attempts"]) == 3
    assert [m.role for m in asyncio.run(cp.aget_state({"thread_id": "f1"})).context] == ["user"]


def test_a_hung_provider_times_out_into_a_typed_error(llm: AnthropicStandIn) -> None:
    llm.reply_hang()
    with pytest.raises(NodeError) as err:
        ask(react(retry_config=False, timeout=1.0).compile(), "hi")
    cause = err.value.__cause__
    assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_002"
    llm.release()


class Verdict(BaseModel):
    refund: bool
    reason: str


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_structured_output(llm: AnthropicStandIn, stream: bool) -> None:
    llm.reply_json({"refund": True, "reason": "arrived broken"})
    g = StateGraph()
    g.add_node("MAIN", Agent(model=MODEL, output_schema=Verdict, retry_config=False, reasoning_config=None))
    g.set_entry_point("MAIN")
    g.add_edge("MAIN", END)
    cp = InMemoryCheckpointer()
    app = g.compile(checkpointer=cp)
    if stream:
        async def run():
            return [c async for c in app.astream({"messages": [Message.text_message("Refund?")]},
                                                 {"thread_id": "so"})]
        asyncio.run(run())
        reply = asyncio.run(cp.aget_state({"thread_id": "so"})).context[-1]
        assert reply.parsed_content == {"refund": True, "reason": "arrived broken"}
    else:
        reply = ask(app, "Refund?", thread="so")["messages"][-1]
        assert reply.parsed_content == Verdict(refund=True, reason="arrived broken")
    fmt = llm.requests[0].body["output_config"]["format"]
    assert fmt == {"type": "json_schema", "schema": Verdict.model_json_schema(), "name": "Verdict"}


def test_missing_api_key_is_refused_before_any_request(llm: AnthropicStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ModelConfigError) as err:
        react()
    assert err.value.error_code == "LLM_CONFIG_001" and "ANTHROPIC_API_KEY" in str(err.value)
    assert llm.requests == []
    llm.reply_text("with an explicit key")
    out = ask(react(api_key="sk-ant-explicit").compile(), "hi")
    assert out["messages"][-1].text() == "with an explicit key"
    assert _key(llm.requests[0].headers) == "sk-ant-explicit"


def test_base_url_option_instead_of_the_env(llm: AnthropicStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    llm.reply_text("via base_url=")
    out = ask(react(base_url=llm.base_url).compile(), "hi")
    assert out["messages"][-1].text() == "via base_url="


def test_unsupported_backend_is_typed(llm: AnthropicStandIn) -> None:
    with pytest.raises(ModelConfigError) as err:
        Agent(model=MODEL, anthropic_backend="bedrock")
    assert err.value.error_code == "LLM_CONFIG_002"


def test_count_tokens_uses_the_count_endpoint(llm: AnthropicStandIn) -> None:
    agent = Agent(model=MODEL, system_prompt=[{"role": "system", "content": "Be brief."}])
    with pytest.raises(Exception) as err:
        asyncio.run(agent.count_tokens([{"role": "user", "content": "hi"}]))
    # The stand-in does not serve /v1/messages/count_tokens: the request went there and got a 404.
    assert getattr(err.value, "status_code", None) == 404
    assert llm.requests[-1].path.startswith("/v1/messages/count_tokens")


def test_sigkill_after_the_refund_then_resume_does_not_refund_again(llm: AnthropicStandIn, sqlite_db: str,
                                                                   tmp_path, effects: EffectCounter) -> None:
    target = "tests_py.llm_agents.providers_quickstart:build_claude"
    kit = CrashKit(tmp_path / "kit", db=sqlite_db, effects=effects)
    llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}, "toolu_l"))
    llm.reply_tool_calls(("refund_order", {"order_id": "A-1001", "amount": 42.0}, "toolu_r"))
    paused = kit.resume(target, "t-refund", input="Order A-1001 arrived broken, please refund it.", env=llm.env)
    assert paused.status.startswith("interrupted"), paused.stderr[-2000:]
    crashed = kit.run_until_crash(target, "t-refund", input={"resume": {"approved": True}},
                                  failpoints="after_record:refund_order=kill", env=llm.env)
    assert crashed.killed and effects.count("refund_order") == 1
    assert len(llm.requests) == 2
    llm.reply_text("Refunded $42.0 for order A-1001.")
    resumed = kit.resume(target, "t-refund", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert resumed.last == "Refunded $42.0 for order A-1001."
    assert effects.count("refund_order") == 1 and effects.count("lookup_order") == 1
    last = llm.requests[-1].body["messages"]
    assert last[-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_r", "content": "Refunded $42.0 for order A-1001."}]}
    assert llm.pending == 0 and llm.unscripted == 0


def test_a_stream_cut_before_message_stop_is_retried_and_never_committed(llm: AnthropicStandIn) -> None:
    llm.reply_cut_stream("A partial answer that never")
    llm.reply_text("The whole answer.")
    cp = InMemoryCheckpointer()
    app = react().compile(checkpointer=cp)

    async def run():
        return [c async for c in app.astream({"messages": [Message.text_message("hi")]}, {"thread_id": "cut"})]

    msgs = [c.message for c in asyncio.run(run()) if c.event == StreamEvent.MESSAGE and c.message is not None]
    finals = [m for m in msgs if not m.delta and m.role == "assistant"]
    assert [m.text() for m in finals] == ["The whole answer."]
    # The broken attempt's deltas were shown under another message id than the retry's.
    broken = {m.message_id for m in msgs if m.delta and m.text() in "A partial answer that never"}
    assert broken and finals[0].message_id not in broken
    stored = asyncio.run(cp.aget_state({"thread_id": "cut"})).context
    assert [m.text() for m in stored if m.role == "assistant"] == ["The whole answer."]
    assert [r.reply for r in llm.requests] == ["text", "text"]


def test_sync_invoke_twice_on_one_agent(llm) -> None:
    """Each sync invoke runs on a loop of its own; the agent's SDK client follows it."""
    llm.reply_text("one")
    llm.reply_text("two")
    app = react().compile(checkpointer=InMemoryCheckpointer())
    assert app.invoke({"messages": [Message.text_message("a")]}, {"thread_id": "s"})["messages"][-1].text() == "one"
    assert app.invoke({"messages": [Message.text_message("b")]}, {"thread_id": "s"})["messages"][-1].text() == "two"


def test_streamed_tool_input_that_is_not_json_becomes_a_tool_error_the_model_reads(llm: AnthropicStandIn) -> None:
    """As 10xGraph: input that is not JSON at content_block_stop becomes ``{}`` (with a warning);
    the ToolNode then answers the model that the tool's argument is missing."""
    llm.reply_tool_calls(("weather", '{"city": "Par', "toolu_bad"))
    llm.reply_text("Sorry, which city?")
    app = react().compile(checkpointer=InMemoryCheckpointer())

    async def run():
        return [c async for c in app.astream({"messages": [Message.text_message("weather?")]}, {"thread_id": "b"})]

    asyncio.run(run())
    call = [m for m in llm.requests[1].body["messages"] if m["role"] == "assistant"][0]["content"][0]
    assert call == {"type": "tool_use", "id": "toolu_bad", "name": "weather", "input": {}}
    [result] = llm.requests[1].body["messages"][-1]["content"]
    assert result["tool_use_id"] == "toolu_bad" and "city" in result["content"], result


def test_a_fallback_on_another_provider_without_its_key_is_refused_at_construction(
        llm: AnthropicStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelConfigError) as err:
        react(fallback_models=[("gpt-4o-mini", "openai")])
    assert err.value.error_code == "LLM_CONFIG_001" and "OPENAI_API_KEY" in str(err.value)
    assert "gpt-4o-mini" in str(err.value)
    assert llm.requests == []
