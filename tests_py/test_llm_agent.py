"""Agent with the OpenAI provider, through the real ``openai`` SDK against the local stand-in:
a tool-calling turn, a streamed turn, retries, fallbacks, structured output and the bad inputs."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel

from tenxgraph.core.exceptions import NodeError
from tenxgraph.core.graph import Agent, RetryConfig, StateGraph, ToolNode
from tenxgraph.core.llm import ModelCallError, ModelConfigError
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.stream_chunks import StreamEvent
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.testing.providers import OpenAIStandIn
from tenxgraph.utils.constants import END

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
    return ReactAgent(model="openai/gpt-4o-mini", system_prompt=[{"role": "system", "content": "Be brief."}],
                      tools=[weather], **kw)


def ask(app, text: str, thread: str = "t1", **config):
    return asyncio.run(app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": thread, **config}))


def test_tool_calling_turn(llm: OpenAIStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Paris"}), usage={"prompt_tokens": 11, "completion_tokens": 7,
                                                                  "total_tokens": 18})
    llm.reply_text("It is sunny in Paris.", usage={"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26})
    out = ask(react().compile(checkpointer=InMemoryCheckpointer()), "Weather in Paris?")
    roles = [m.role for m in out["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call = out["messages"][1]
    assert call.tools_calls == [{"id": "call_1", "type": "function",
                                 "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]
    assert str(call.message_id).startswith("chatcmpl-")  # the completion's id, as in 10xGraph
    assert call.usages is not None and call.usages.prompt_tokens == 11 and call.usages.completion_tokens == 7
    assert out["messages"][2].text() == "sunny in Paris"
    assert out["messages"][3].text() == "It is sunny in Paris."
    assert out["token_usage"] == {"total_input_tokens": 31, "total_output_tokens": 13, "total_reasoning_tokens": 0,
                                  "total_tokens": 44}
    first, second = (r.body for r in llm.requests)
    assert first["tools"][0]["function"]["name"] == "weather"
    assert first["messages"] == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Weather in Paris?"}]
    assert second["messages"][-1] == {"role": "tool", "content": "sunny in Paris", "tool_call_id": "call_1"}


def test_system_prompt_fields_come_from_the_state(llm: OpenAIStandIn) -> None:
    class Shop(AgentState):
        user_name: str = "Guest"

    llm.reply_text("Hi Ada")
    app = ReactAgent(model="gpt-4o-mini", state=Shop(user_name="Ada"), retry_config=False,
                     system_prompt=[{"role": "system", "content": "Help {user_name}. Unknown: {nope}"},
                                    {"role": "system", "content": "You serve {user_name}."}]).compile()
    ask(app, "hello")
    sent = llm.requests[0].body["messages"]
    # A prompt with a field the state lacks is sent as written; the others are filled.
    assert sent[0]["content"] == "Help {user_name}. Unknown: {nope}"
    assert sent[1]["content"] == "You serve Ada."
    assert "tools" not in llm.requests[0].body  # no tools: none offered


def test_streamed_turn_deltas_then_the_committed_message(llm: OpenAIStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Oslo"}))
    llm.reply_text("Oslo is sunny today, enjoy.", pieces=4)
    app = react().compile(checkpointer=InMemoryCheckpointer())

    async def run():
        return [c async for c in app.astream({"messages": [Message.text_message("Oslo?")]}, {"thread_id": "s1"})]

    chunks = asyncio.run(run())
    msgs = [c.message for c in chunks if c.event == StreamEvent.MESSAGE and c.message is not None]
    deltas = [m for m in msgs if m.delta]
    finals = [m for m in msgs if not m.delta and m.role == "assistant"]
    # The tool call's arguments came in pieces: they were put back together.
    assert finals[0].tools_calls[0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert "".join(d.text() for d in deltas) == "Oslo is sunny today, enjoy."
    assert len(deltas) == 4
    assert finals[-1].text() == "Oslo is sunny today, enjoy."
    # Every delta comes before the final message of its turn.
    last_delta = max(i for i, m in enumerate(msgs) if m.delta)
    assert msgs.index(finals[-1]) > last_delta
    assert all(r.stream for r in llm.requests)
    assert finals[-1].usages is not None  # the usage chunk of the stream was kept






def test_permanent_error_is_not_retried_and_is_typed(llm: OpenAIStandIn) -> None:
    llm.reply_error(400, "bad request")
    with pytest.raises(NodeError) as err:
        ask(react().compile(), "hi")
    cause = err.value.__cause__
    assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_001"
    assert cause.context["status_code"] == 400 and len(cause.context["attempts"]) == 1
    assert len(llm.requests) == 1


def test_fallback_model_after_retries(llm: OpenAIStandIn) -> None:
    for _ in range(3):
        llm.reply_error(503, "overloaded", model="gpt-4o-mini")
    llm.reply_text("from the fallback", model="gpt-4.1-nano")
    out = ask(react(fallback_models=["gpt-4.1-nano"]).compile(), "hi")
    assert out["messages"][-1].text() == "from the fallback"
    assert [r.body["model"] for r in llm.requests] == ["gpt-4o-mini"] * 3 + ["gpt-4.1-nano"]


def test_every_model_failing_gives_a_typed_error_and_keeps_the_thread(llm: OpenAIStandIn) -> None:
    for _ in range(3):
        llm.reply_error(500, model="gpt-4o-mini")
    for _ in range(3):
        llm.reply_error(429, model="gpt-4.1-nano")
    cp = InMemoryCheckpointer()
    app = react(fallback_models=[("gpt-4.1-nano", "openai")]).compile(checkpointer=cp)
    with pytest.raises(NodeError) as err:
        ask(app, "hi", thread="f1")
    cause = err.value.__cause__
    assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_001"
    assert [a["model"] for a in cause.context["attempts"]] == ["gpt-4o-mini"] * 3 + ["gpt-4.1-nano"] * 3
    assert cause.context["status_code"] == 429
    # Nothing half-way: the thread holds the user's message and no assistant reply.
    state = asyncio.run(cp.aget_state({"thread_id": "f1"}))
    assert [m.role for m in state.context] == ["user"]
    # The same thread answers once the provider is back.
    llm.reply_text("back")
    out = asyncio.run(app.ainvoke({}, {"thread_id": "f1"}))
    assert out["messages"][-1].text() == "back"


def test_a_hung_provider_times_out_into_a_typed_error(llm: OpenAIStandIn) -> None:
    llm.reply_hang()
    app = react(retry_config=False, timeout=1.0).compile()
    with pytest.raises(NodeError) as err:
        ask(app, "hi")
    cause = err.value.__cause__
    assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_002"
    llm.release()


def test_timeout_is_retried(llm: OpenAIStandIn) -> None:
    llm.reply_hang()
    llm.reply_text("second try")
    out = ask(react(timeout=1.0).compile(), "hi")
    assert out["messages"][-1].text() == "second try"
    llm.release()


def test_missing_api_key_is_refused_before_any_request(llm: OpenAIStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ModelConfigError) as err:
        react()
    assert err.value.error_code == "LLM_CONFIG_001" and "OPENAI_API_KEY" in str(err.value)
    assert isinstance(err.value, ValueError)
    assert llm.requests == []
    Agent(model="gpt-4o-mini", api_key="sk-explicit")  # an explicit key is enough


@pytest.mark.parametrize(("kwargs", "code"), [
    ({"model": "gemini/gemini-2.5-flash", "use_vertex_ai": True}, "LLM_CONFIG_002"),
    ({"model": "claude-sonnet-5", "anthropic_backend": "vertex"}, "LLM_CONFIG_002"),
    ({"model": "gpt-4o", "fallback_models": [("mistral-large", "mistral")]}, "LLM_CONFIG_002"),
    ({"model": "gpt-4o", "provider": "mistral"}, "LLM_CONFIG_002"),
    ({"model": "gpt-4o", "api_style": "soap"}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "output_type": "image"}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "output_type": "hologram"}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "skills": object()}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "retry_config": 3}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "fallback_models": [42]}, "LLM_CONFIG_003"),
    ({"model": ""}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "system_prompt": "You are a support agent."}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "system_prompt": [{"content": "no role"}]}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "extra_messages": ["a str"]}, "LLM_CONFIG_003"),
    ({"model": "gpt-4o", "tool_node": 42}, "LLM_CONFIG_003"),
])
def test_bad_agent_options_are_typed(llm: OpenAIStandIn, kwargs: dict, code: str) -> None:
    with pytest.raises(ModelConfigError) as err:
        Agent(**kwargs)
    assert err.value.error_code == code


def test_bad_retry_config() -> None:
    with pytest.raises(ModelConfigError) as err:
        RetryConfig(max_retries=-1)
    assert err.value.error_code == "LLM_CONFIG_003"


def test_unknown_tool_node_name_is_a_typed_error(llm: OpenAIStandIn) -> None:
    g = StateGraph()
    g.add_node("MAIN", Agent(model="gpt-4o-mini", tool_node="TOOLS"))
    g.set_entry_point("MAIN")
    g.add_edge("MAIN", END)
    with pytest.raises(NodeError) as err:
        ask(g.compile(), "hi")
    assert isinstance(err.value.__cause__, ModelConfigError) and "TOOLS" in str(err.value.__cause__)
    assert llm.requests == []


def test_structured_output(llm: OpenAIStandIn) -> None:
    class Verdict(BaseModel):
        refund: bool
        reason: str

    llm.reply_json({"refund": True, "reason": "arrived broken"})
    g = StateGraph()
    g.add_node("MAIN", Agent(model="gpt-4o-mini", output_schema=Verdict, retry_config=False))
    g.set_entry_point("MAIN")
    g.add_edge("MAIN", END)
    cp = InMemoryCheckpointer()
    out = ask(g.compile(checkpointer=cp), "Refund?", thread="so")
    reply = out["messages"][-1]
    assert reply.parsed_content == Verdict(refund=True, reason="arrived broken")
    fmt = llm.requests[0].body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Verdict"
    stored = asyncio.run(cp.aget_state({"thread_id": "so"})).context[-1]
    assert stored.parsed_content == {"refund": True, "reason": "arrived broken"}


@pytest.mark.parametrize("reply", ["not json at all", '{"refund": "maybe"}'], ids=["not_json", "fails_schema"])
def test_a_structured_reply_that_does_not_validate_is_kept_as_text(llm: OpenAIStandIn, reply: str) -> None:
    """The SDK's ``parse`` raised on it, so the node failed (NODE_001) and StructuredOutputAgent
    never got to repair it; now it is the reply, with no ``parsed_content`` (session 32)."""
    class Verdict(BaseModel):
        refund: bool

    llm.reply_text(reply)
    g = StateGraph()
    g.add_node("MAIN", Agent(model="gpt-4o-mini", output_schema=Verdict, retry_config=False))
    g.set_entry_point("MAIN")
    g.add_edge("MAIN", END)
    out = ask(g.compile(checkpointer=InMemoryCheckpointer()), "Refund?", thread="bad")
    assert out["messages"][-1].text() == reply
    assert out["messages"][-1].parsed_content is None
    assert llm.requests[0].body["response_format"]["json_schema"]["strict"] is True


def test_structured_output_with_tools(llm: OpenAIStandIn) -> None:
    class Answer(BaseModel):
        city: str

    llm.reply_tool_calls(("weather", {"city": "Rome"}))
    llm.reply_json({"city": "Rome"})
    out = ask(react(output_schema=Answer).compile(), "weather?")
    assert out["messages"][1].parsed_content is None  # a tool-calling reply has nothing to parse
    assert out["messages"][-1].parsed_content == Answer(city="Rome")
    assert all(r.body["response_format"]["type"] == "json_schema" for r in llm.requests)


def test_malformed_tool_arguments_become_a_tool_error_the_model_reads(llm: OpenAIStandIn) -> None:
    llm.reply_tool_calls(("weather", '{"city": "Par'))
    llm.reply_text("Sorry, let me retry.")
    out = ask(react().compile(), "weather?")
    tool_msg = out["messages"][2]
    assert tool_msg.role == "tool"
    sent = llm.requests[1].messages[-1]
    assert sent["role"] == "tool" and sent["tool_call_id"] == "call_1"
    assert "json" in sent["content"].lower() or "argument" in sent["content"].lower(), sent


def test_unknown_tool_becomes_a_tool_error_the_model_reads(llm: OpenAIStandIn) -> None:
    llm.reply_tool_calls(("teleport", {"to": "Mars"}))
    llm.reply_text("I cannot do that.")
    out = ask(react().compile(), "go")
    assert out["messages"][-1].text() == "I cannot do that."
    assert "teleport" in llm.requests[1].messages[-1]["content"]


def test_empty_reply_ends_the_turn(llm: OpenAIStandIn) -> None:
    llm.reply_text("")
    out = ask(react().compile(), "hi")
    assert out["messages"][-1].role == "assistant" and out["messages"][-1].content == []


def test_sync_invoke_twice_on_one_agent(llm: OpenAIStandIn) -> None:
    """Each sync invoke runs on a loop of its own; the SDK client must follow (10xGraph 0.10
    fails the second call with 'Event loop is closed')."""
    llm.reply_text("one")
    llm.reply_text("two")
    app = react().compile(checkpointer=InMemoryCheckpointer())
    assert app.invoke({"messages": [Message.text_message("a")]}, {"thread_id": "s"})["messages"][-1].text() == "one"
    assert app.invoke({"messages": [Message.text_message("b")]}, {"thread_id": "s"})["messages"][-1].text() == "two"


def test_a_repeated_completion_id_gets_a_fresh_message_id(monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenAIStandIn(id_prefix="same") as a, OpenAIStandIn(id_prefix="same") as b:
        # Two servers with the same id scheme: the second answer repeats the first one's id.
        a.reply_text("first")
        b.reply_text("second")
        cp = InMemoryCheckpointer()
        for server, text in ((a, "q1"), (b, "q2")):
            monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
            monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
            app = react().compile(checkpointer=cp)
            out = ask(app, text, thread="dup")
        state = asyncio.run(cp.aget_state({"thread_id": "dup"}))
        assert [m.text() for m in state.context if m.role == "assistant"] == ["first", "second"]
        ids = [m.message_id for m in state.context]
        assert len(set(ids)) == len(ids)
        assert out["messages"][-1].text() == "second"


def test_extra_messages_and_tools_tags(llm: OpenAIStandIn) -> None:
    from tenxgraph.utils.tool_decorator import tool

    @tool(tags={"billing"})
    def invoice(order_id: str) -> str:
        """Send an invoice."""
        return "sent"

    @tool(tags={"admin"})
    def wipe(order_id: str) -> str:
        """Delete an order."""
        return "gone"

    llm.reply_text("ok")
    g = StateGraph()
    tools = ToolNode([weather, invoice, wipe])
    g.add_node("MAIN", Agent(model="gpt-4o-mini", tool_node=tools, tools_tags={"billing"},
                             extra_messages=[Message.text_message("Remember: be kind.", role="user")]))
    g.add_node("TOOL", tools)
    g.set_entry_point("MAIN")
    g.add_conditional_edges("MAIN", lambda s: "TOOL" if s.context[-1].tools_calls else END, {"TOOL": "TOOL", END: END})
    g.add_edge("TOOL", "MAIN")
    ask(g.compile(), "hi")
    body = llm.requests[0].body
    # Untagged tools are always offered; tagged ones only when a tag matches (10xGraph's rule).
    assert [t["function"]["name"] for t in body["tools"]] == ["weather", "invoice"]
    assert body["messages"][-1] == {"role": "user", "content": "Remember: be kind."}


def test_request_options_and_reasoning(llm: OpenAIStandIn) -> None:
    llm.reply_text("a")
    llm.reply_text("b")
    app = react(temperature=0.2, max_tokens=50).compile()
    ask(app, "x", thread="r1")
    app2 = react(reasoning_config=None).compile()
    ask(app2, "y", thread="r2")
    first, second = (r.body for r in llm.requests)
    assert first["temperature"] == 0.2 and first["max_tokens"] == 50
    assert first["reasoning_effort"] == "medium"  # 10xGraph's default reasoning config
    assert "reasoning_effort" not in second
    assert json.dumps(first).find("timeout") == -1


def test_tool_turn_and_streamed_turn_on_every_backend(llm: OpenAIStandIn, checkpointer, make_thread) -> None:
    app = react().compile(checkpointer=checkpointer)
    thread = make_thread("backend")
    llm.reply_tool_calls(("weather", {"city": "Lima"}))
    llm.reply_text("Sunny in Lima.")
    out = ask(app, "Lima?", thread=thread)
    assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "assistant"]
    # The second turn, streamed, sees the first turn's history as stored by this backend.
    llm.reply_text("Still sunny.", pieces=2)

    async def stream():
        return [c async for c in app.astream({"messages": [Message.text_message("And now?")]}, {"thread_id": thread})]

    chunks = asyncio.run(stream())
    deltas = [c.message.text() for c in chunks if c.message is not None and c.message.delta]
    assert "".join(deltas) == "Still sunny." and len(deltas) == 2
    sent = llm.requests[-1].messages
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[2]["tool_calls"][0]["function"]["name"] == "weather"
    state = asyncio.run(checkpointer.aget_state({"thread_id": thread}))
    assert [m.text() for m in state.context if m.role == "assistant" and not m.tools_calls] == [
        "Sunny in Lima.", "Still sunny."]
    assert not any(m.delta for m in state.context)  # deltas are never stored
    asyncio.run(app.aclose())


def test_a_hung_model_is_bounded_by_node_timeout(llm: OpenAIStandIn) -> None:
    from tenxgraph.core.exceptions import NodeTimeoutError

    llm.reply_hang()
    app = react(retry_config=False).compile()
    with pytest.raises(NodeTimeoutError) as err:
        ask(app, "hi", node_timeout=1.0)
    assert err.value.error_code == "NODE_TIMEOUT_001"
    llm.release()


def test_stop_ends_a_hung_model_call(llm: OpenAIStandIn) -> None:
    llm.reply_hang()
    cp = InMemoryCheckpointer()
    app = react(retry_config=False).compile(checkpointer=cp)

    async def go():
        run = asyncio.ensure_future(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "stop"}))
        for _ in range(2000):  # the request reached the provider: the node is inside the model call
            if llm.requests:
                break
            await asyncio.sleep(0.01)
        assert llm.requests, "the model was never called"
        assert (await app.astop({"thread_id": "stop"}))["running"] is True
        return await asyncio.wait_for(run, 60)

    out = asyncio.run(go())
    assert [m.role for m in out["messages"]] == ["user"]
    llm.release()


def test_circuit_breaker_skips_a_dead_model(llm: OpenAIStandIn) -> None:
    cfg = RetryConfig(max_retries=0, initial_delay=0, circuit_breaker_enabled=True, circuit_breaker_threshold=1,
                      circuit_breaker_reset_timeout=3600)
    llm.reply_error(500, model="gpt-4o-mini")
    llm.reply_text("fallback 1", model="gpt-4.1-nano")
    llm.reply_text("fallback 2", model="gpt-4.1-nano")
    app = react(retry_config=cfg, fallback_models=["gpt-4.1-nano"]).compile()
    assert ask(app, "a", thread="cb1")["messages"][-1].text() == "fallback 1"
    assert ask(app, "b", thread="cb2")["messages"][-1].text() == "fallback 2"
    # The primary failed once, its circuit opened, and the second turn went straight to the fallback.
    assert [r.body["model"] for r in llm.requests] == ["gpt-4o-mini", "gpt-4.1-nano", "gpt-4.1-nano"]


def test_retry_after_header_sets_the_delay(llm: OpenAIStandIn, caplog: pytest.LogCaptureFixture) -> None:
    llm.reply_error(429, retry_after=0)
    llm.reply_text("ok")
    cfg = RetryConfig(max_retries=1, initial_delay=25, max_delay=30)
    with caplog.at_level("WARNING", logger="tenxgraph.agent"):
        assert ask(react(retry_config=cfg).compile(), "x")["messages"][-1].text() == "ok"
    assert any("retrying in 0.0s" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_readme_quick_start_and_stream_as_written(llm: OpenAIStandIn) -> None:
    """The README's quick start (sync invoke, pause, resume) and its "Stream it" snippet, with only
    the model string changed."""
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer
    from tenxgraph.utils import interrupt

    def lookup_order(order_id: str) -> dict:
        """Look up an order by id."""
        return {"order_id": order_id, "status": "delivered", "total": 42.00}

    def refund_order(order_id: str, amount: float) -> str:
        """Refund an order. Requires approval."""
        decision = interrupt({"amount": amount}, message=f"Refund ${amount}?")
        if not decision.get("approved"):
            return "Refund declined by reviewer."
        return f"Refunded ${amount} for order {order_id}."

    llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
    llm.reply_tool_calls(("refund_order", {"order_id": "A-1001", "amount": 42.0}))
    llm.reply_text("Done, refunded.")
    llm.reply_text("It was delivered.")

    app = ReactAgent(
        model="openai/gpt-4o-mini",
        system_prompt=[{"role": "system", "content": "You are a support agent for an online store."}],
        tools=[lookup_order, refund_order],
    ).compile(checkpointer=InMemoryCheckpointer())

    config = {"thread_id": "1"}
    result = app.invoke(
        {"messages": [Message.text_message("Order A-1001 arrived broken, please refund it.")]},
        config=config,
    )
    assert result["messages"][-1].tools_calls[0]["function"]["name"] == "refund_order"
    # The run pauses inside refund_order. After a reviewer approves:
    result = app.invoke({"resume": {"approved": True}}, config)
    assert [m.text() for m in result["messages"][-2:]] == ["Refunded $42.0 for order A-1001.", "Done, refunded."]

    async def stream():
        dumps = []
        async for chunk in app.astream(
            {"messages": [Message.text_message("Where is order A-1001?")]},
            config={"thread_id": "2"},
        ):
            dumps.append(chunk.model_dump())
        return dumps

    dumps = asyncio.run(stream())
    texts = [d["message"]["content"][0]["text"] for d in dumps
             if d.get("message") and d["message"]["role"] == "assistant" and d["message"]["content"]]
    assert texts[-1] == "It was delivered." and "".join(texts[:-1]) == "It was delivered."


def test_base_url_argument_and_its_reasoning_body(llm: OpenAIStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """``base_url=`` wins over OPENAI_BASE_URL; with it, 10xGraph also sends the reasoning config
    in the body (for OpenAI-compatible servers), and so do we."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    llm.reply_text("via base_url")
    app = react(base_url=llm.base_url, reasoning_config={"effort": "low"}).compile()
    assert ask(app, "x")["messages"][-1].text() == "via base_url"
    body = llm.requests[0].body
    assert body["reasoning_effort"] == "low" and body["reasoning"] == {"effort": "low"}


SYNC_LOOPS = """
import gc, os
from tenxgraph.testing.providers import OpenAIStandIn
llm = OpenAIStandIn().start()
os.environ.update(llm.env)
for t in ("a", "b", "c", "d"):
    llm.reply_text(t)
from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import ReactAgent
app = ReactAgent(model="gpt-4o-mini").compile()
for t in ("a", "b", "c", "d"):
    assert app.invoke({"messages": [Message.text_message(t)]}, {"thread_id": "x"})["messages"][-1].text() == t
gc.collect()
print("REQUESTS", len(llm.requests))
llm.close()
"""


def test_sync_invokes_leave_no_connection_open(tmp_path) -> None:
    """Each sync invoke's loop closes the client it used when it shuts down: no unclosed sockets
    pile up (they did, one per call, before)."""
    import subprocess
    import sys

    script = tmp_path / "loops.py"
    script.write_text(SYNC_LOOPS)
    r = subprocess.run([sys.executable, "-X", "dev", "-W", "always::ResourceWarning", str(script)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "REQUESTS 4" in r.stdout
    assert "unclosed" not in r.stderr, r.stderr[-3000:]


def test_sync_stream_yields_the_deltas_too(llm: OpenAIStandIn) -> None:
    llm.reply_text("one two three", pieces=3)
    app = react().compile()
    chunks = list(app.stream({"messages": [Message.text_message("count")]}, {"thread_id": "sync-stream"}))
    msgs = [c.message for c in chunks if c.message is not None and c.message.role == "assistant"]
    assert [m.delta for m in msgs] == [True, True, True, False]
    assert "".join(m.text() for m in msgs[:-1]) == msgs[-1].text() == "one two three"


def test_trim_context_trims_what_the_model_sees_not_the_thread(llm: OpenAIStandIn) -> None:
    from tenxgraph.core.state import MessageContextManager

    for text in ("one", "two", "three"):
        llm.reply_text(f"re: {text}")
    g = StateGraph(context_manager=MessageContextManager(max_messages=1))
    g.add_node("MAIN", Agent(model="gpt-4o-mini", trim_context=True, retry_config=False,
                             system_prompt=[{"role": "system", "content": "S"}]))
    g.set_entry_point("MAIN")
    g.add_edge("MAIN", END)
    cp = InMemoryCheckpointer()
    app = g.compile(checkpointer=cp)
    for text in ("one", "two", "three"):
        ask(app, text, thread="trim")
    assert llm.requests[-1].messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "three"}]
    state = asyncio.run(cp.aget_state({"thread_id": "trim"}))
    assert [m.text() for m in state.context] == ["one", "re: one", "two", "re: two", "three", "re: three"]


def test_concurrent_runs_share_one_agent(llm: OpenAIStandIn) -> None:
    for _ in range(6):
        llm.reply_text("same answer")
    app = react().compile(checkpointer=InMemoryCheckpointer())

    async def go():
        return await asyncio.gather(*(app.ainvoke({"messages": [Message.text_message(f"q{i}")]},
                                                  {"thread_id": f"c{i}"}) for i in range(6)))

    outs = asyncio.run(go())
    assert [o["messages"][-1].text() for o in outs] == ["same answer"] * 6
    assert sorted(r.messages[-1]["content"] for r in llm.requests) == [f"q{i}" for i in range(6)]


def test_count_tokens_is_not_available_for_openai(llm: OpenAIStandIn) -> None:
    with pytest.raises(NotImplementedError, match="no server-side token counting"):
        asyncio.run(Agent(model="gpt-4o-mini").count_tokens([{"role": "user", "content": "hi"}]))
    assert llm.requests == []


def test_a_stream_cut_before_its_finish_reason_is_retried_and_never_committed(llm: OpenAIStandIn) -> None:
    """Before the fix, a chat stream that lost its connection after some text was committed as
    the turn's answer (the SDK ends such a stream quietly, without ``[DONE]``)."""
    llm.reply_cut_stream("A partial answer that never")
    llm.reply_text("The whole answer.")
    cp = InMemoryCheckpointer()
    app = react().compile(checkpointer=cp)

    async def run():
        return [c async for c in app.astream({"messages": [Message.text_message("hi")]}, {"thread_id": "cut"})]

    msgs = [c.message for c in asyncio.run(run()) if c.event == StreamEvent.MESSAGE and c.message is not None]
    assert [m.text() for m in msgs if not m.delta and m.role == "assistant"] == ["The whole answer."]
    stored = asyncio.run(cp.aget_state({"thread_id": "cut"})).context
    assert [m.text() for m in stored if m.role == "assistant"] == ["The whole answer."]
    assert len(llm.requests) == 2
