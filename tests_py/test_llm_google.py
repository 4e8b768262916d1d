"""Agent with the Google GenAI provider, through the real ``google-genai`` SDK against the local
GoogleStandIn: the request 10xGraph sends, a tool-calling turn, a streamed turn, retries,
fallbacks, structured output, a missing key, and the README's quick start as written
(``gemini/gemini-2.5-flash``) killed after the refund and resumed without a second refund."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

pytest.importorskip("google.genai")

from tenxgraph.core.exceptions import NodeError  # noqa: E402
from tenxgraph.core.graph import Agent, RetryConfig, StateGraph  # noqa: E402
from tenxgraph.core.llm import ModelCallError, ModelConfigError  # noqa: E402
from tenxgraph.core.state import Message  # noqa: E402
from tenxgraph.core.state.stream_chunks import StreamEvent  # noqa: E402
from tenxgraph.prebuilt.agent import ReactAgent  # noqa: E402
from tenxgraph.storage.checkpointer import InMemoryCheckpointer  # noqa: E402
from tenxgraph.testing import CrashKit, EffectCounter  # noqa: E402
from tests_py.llm_agents.stand_in_env import serving  # noqa: E402
from tenxgraph.testing.providers import GoogleStandIn  # noqa: E402
from tenxgraph.utils.constants import END  # noqa: E402

FAST = RetryConfig(max_retries=2, initial_delay=0.01, max_delay=0.05)
MODEL = "gemini/gemini-2.5-flash"


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch):
    yield from serving(GoogleStandIn, monkeypatch, drop=["GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"])


def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def react(**kw):
    kw.setdefault("retry_config", FAST)
    kw.setdefault("model", MODEL)
    return ReactAgent(system_prompt=[{"role": "system", "content": "Be brief."}], tools=[weather], **kw)


def ask(app, text: str, thread: str = "t1"):
    return asyncio.run(app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": thread}))


def test_tool_calling_turn_request_and_reply(llm: GoogleStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Paris"}), usage={"prompt_tokens": 11, "completion_tokens": 7})
    llm.reply_text("It is sunny in Paris.", usage={"prompt_tokens": 20, "completion_tokens": 6})
    out = ask(react().compile(checkpointer=InMemoryCheckpointer()), "Weather in Paris?")
    assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "assistant"]
    call = out["messages"][1]
    [tc] = call.tools_calls
    assert tc["type"] == "function" and tc["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}
    assert tc["id"]  # Gemini gives no call id: a fresh one, as 10xGraph makes
    assert call.metadata["provider"] == "google_genai" and call.metadata["model"] == "gemini-2.5-flash"
    assert (call.usages.prompt_tokens, call.usages.completion_tokens, call.usages.total_tokens) == (11, 7, 18)
    assert out["messages"][2].text() == "sunny in Paris"
    assert out["messages"][3].text() == "It is sunny in Paris."
    assert out["token_usage"]["total_tokens"] == 44
    first, second = llm.requests
    assert first.model == "gemini-2.5-flash" and first.headers["x-goog-api-key"] == "stand-in-key"
    body = first.body
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert body["contents"] == [{"parts": [{"text": "Weather in Paris?"}], "role": "user"}]
    [decl] = body["tools"][0]["functionDeclarations"]
    assert decl["name"] == "weather" and decl["description"] == "Current weather for a city."
    assert body["generationConfig"]["thinkingConfig"] == {"include_thoughts": True, "thinking_budget": 8192}
    model_turn, answer = second.body["contents"][1:]
    assert model_turn["role"] == "model"
    assert model_turn["parts"][0]["functionCall"] == {"args": {"city": "Paris"}, "name": "weather"}
    assert answer == {"role": "user", "parts": [
        {"functionResponse": {"name": "weather", "response": {"result": "sunny in Paris"}}}]}


def test_parallel_tool_results_go_back_in_one_user_content(llm: GoogleStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Oslo"}), ("weather", {"city": "Rome"}))
    llm.reply_text("Both sunny.")
    out = ask(react(reasoning_config=None).compile(), "Oslo and Rome?")
    assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]
    ids = [c["id"] for c in out["messages"][1].tools_calls]
    assert len(set(ids)) == 2
    sent = llm.requests[1].body
    assert [p["functionResponse"]["response"]["result"] for p in sent["contents"][2]["parts"]] == \
        ["sunny in Oslo", "sunny in Rome"]
    assert "thinkingConfig" not in (llm.requests[0].body.get("generationConfig") or {})


def test_streamed_turn_deltas_then_the_committed_message(llm: GoogleStandIn) -> None:
    llm.reply_tool_calls(("weather", {"city": "Oslo"}))
    llm.reply_text("Oslo is sunny today, enjoy.", pieces=4, usage={"prompt_tokens": 9, "completion_tokens": 5})
    app = react().compile(checkpointer=InMemoryCheckpointer())

    async def run():
        return [c async for c in app.astream({"messages": [Message.text_message("Oslo?")]}, {"thread_id": "s1"})]

    msgs = [c.message for c in asyncio.run(run()) if c.event == StreamEvent.MESSAGE and c.message is not None]
    finals = [m for m in msgs if not m.delta and m.role == "assistant"]
    assert finals[0].tools_calls[0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    text_deltas = [m for m in msgs if m.delta and m.text()]
    assert "".join(d.text() for d in text_deltas) == "Oslo is sunny today, enjoy."
    assert len(text_deltas) == 4
    assert finals[-1].text() == "Oslo is sunny today, enjoy."
    assert msgs.index(finals[-1]) > max(i for i, m in enumerate(msgs) if m.delta)
    # 10xGraph's streamed Google message carries no usage; ours keeps the stream's usageMetadata.
    assert (finals[-1].usages.prompt_tokens, finals[-1].usages.completion_tokens) == (9, 5)
    assert all(r.stream and ":streamGenerateContent" in r.path for r in llm.requests)






def test_fallback_model_after_retries(llm: GoogleStandIn) -> None:
    for _ in range(3):
        llm.reply_error(503, "unavailable", model="gemini-2.5-flash")
    llm.reply_text("from the fallback", model="gemini-2.5-flash-lite")
    out = ask(react(fallback_models=["gemini-2.5-flash-lite"]).compile(), "hi")
    assert out["messages"][-1].text() == "from the fallback"
    assert [r.model for r in llm.requests] == ["gemini-2.5-flash"] * 3 + ["gemini-2.5-flash-lite"]


def test_every_attempt_failing_is_a_typed_error_and_nothing_is_committed(llm: GoogleStandIn) -> None:
    for _ in range(3):
        llm.reply_error(500)
    llm.reply_error(400, "bad request", model="gemini-2.0-flash")
    cp = InMemoryCheckpointer()
    with pytest.raises(NodeError) as err:
        ask(react(fallback_models=["gemini-2.0-flash"]).compile(checkpointer=cp), "hi", thread="f1")
    cause = err.value.__cause__
    assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_001"
    # A 400 is permanent: the fallback was asked once, not retried.
    assert [a["model"] for a in cause.context["attempts"]] == ["gemini-2.5-flash"] * 3 + ["gemini-2.0-flash"]
    assert cause.context["status_code"] == 400
    assert [m.role for m in asyncio.run(cp.aget_state({"thread_id": "f1"})).context] == ["user"]


def test_a_hung_provider_times_out_into_a_typed_error(llm: GoogleStandIn) -> None:
    llm.reply_hang()
    with pytest.raises(NodeError) as err:
        ask(react(retry_config=False, timeout=1.0).compile(), "hi")
    cause = err.value.__cause__
    assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_002"
    llm.release()


class Verdict(BaseModel):
    refund: bool
    reason: str


def _schema_graph() -> StateGraph:
    g = StateGraph()
    g.add_node("MAIN", Agent(model=MODEL, output_schema=Verdict, retry_config=False))
    g.set_entry_point("MAIN")
    g.add_edge("MAIN", END)
    return g


def test_structured_output(llm: GoogleStandIn) -> None:
    llm.reply_json({"refund": True, "reason": "arrived broken"})
    cp = InMemoryCheckpointer()
    reply = ask(_schema_graph().compile(checkpointer=cp), "Refund?", thread="so")["messages"][-1]
    assert reply.parsed_content == Verdict(refund=True, reason="arrived broken")
    config = llm.requests[0].body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert set(config["responseSchema"]["properties"]) == {"refund", "reason"}
    assert "thinkingConfig" not in config  # 10xGraph sends no thinking with a schema
    stored = asyncio.run(cp.aget_state({"thread_id": "so"})).context[-1]
    assert stored.parsed_content == {"refund": True, "reason": "arrived broken"}


def test_structured_output_with_tools_is_refused_before_any_request(llm: GoogleStandIn) -> None:
    with pytest.raises(NodeError) as err:
        ask(react(output_schema=Verdict).compile(), "hi")
    cause = err.value.__cause__
    assert isinstance(cause, ModelConfigError) and cause.error_code == "LLM_CONFIG_003"
    assert llm.requests == []


def test_missing_api_key_is_refused_before_any_request(llm: GoogleStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY")
    with pytest.raises(ModelConfigError) as err:
        react()
    assert err.value.error_code == "LLM_CONFIG_001"
    assert "GEMINI_API_KEY" in str(err.value) and "GOOGLE_API_KEY" in str(err.value)
    assert llm.requests == []
    monkeypatch.setenv("GOOGLE_API_KEY", "google-key")  # the SDK's other variable works too
    llm.reply_text("with GOOGLE_API_KEY")
    assert ask(react().compile(), "hi")["messages"][-1].text() == "with GOOGLE_API_KEY"
    assert llm.requests[0].headers["x-goog-api-key"] == "google-key"


def test_base_url_and_api_key_options(llm: GoogleStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    llm.reply_text("via base_url=")
    out = ask(react(base_url=llm.base_url, api_key="explicit").compile(), "hi")
    assert out["messages"][-1].text() == "via base_url="
    assert llm.requests[0].headers["x-goog-api-key"] == "explicit"


def test_vertex_ai_is_refused_as_not_supported(llm: GoogleStandIn) -> None:
    with pytest.raises(ModelConfigError) as err:
        Agent(model=MODEL, use_vertex_ai=True)
    assert err.value.error_code == "LLM_CONFIG_002"


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else sqlite_db


def test_readme_quick_start_killed_after_the_refund_resumes_without_refunding_again(
        llm: GoogleStandIn, db: str, tmp_path, effects: EffectCounter) -> None:
    target = "tests_py.llm_agents.providers_quickstart:build_gemini"
    kit = CrashKit(tmp_path / "kit", db=db, effects=effects)
    llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
    llm.reply_tool_calls(("refund_order", {"order_id": "A-1001", "amount": 42.0}))
    paused = kit.resume(target, "t-refund", input="Order A-1001 arrived broken, please refund it.", env=llm.env)
    assert paused.status.startswith("interrupted"), paused.stderr[-2000:]
    assert effects.count("lookup_order") == 1 and effects.count("refund_order") == 0
    crashed = kit.run_until_crash(target, "t-refund", input={"resume": {"approved": True}},
                                  failpoints="after_record:refund_order=kill", env=llm.env)
    assert crashed.killed and effects.count("refund_order") == 1
    assert len(llm.requests) == 2
    llm.reply_text("Refunded $42.0 for order A-1001.")
    resumed = kit.resume(target, "t-refund", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert resumed.last == "Refunded $42.0 for order A-1001."
    assert effects.count("refund_order") == 1 and effects.count("lookup_order") == 1
    answer = llm.requests[-1].body["contents"][-1]
    assert answer == {"role": "user", "parts": [{"functionResponse": {
        "name": "refund_order", "response": {"result": "Refunded $42.0 for order A-1001."}}}]}
    assert llm.pending == 0 and llm.unscripted == 0


def test_a_stream_cut_before_its_finish_is_retried_and_never_committed(llm: GoogleStandIn) -> None:
    llm.reply_cut_stream("A partial answer that never")
    llm.reply_text("The whole answer.")
    cp = InMemoryCheckpointer()
    app = react().compile(checkpointer=cp)

    async def run():
        return [c async for c in app.astream({"messages": [Message.text_message("hi")]}, {"thread_id": "cut"})]

    msgs = [c.message for c in asyncio.run(run()) if c.event == StreamEvent.MESSAGE and c.message is not None]
    finals = [m for m in msgs if not m.delta and m.role == "assistant"]
    assert [m.text() for m in finals] == ["The whole answer."]
    stored = asyncio.run(cp.aget_state({"thread_id": "cut"})).context
    assert [m.text() for m in stored if m.role == "assistant"] == ["The whole answer."]
    assert len(llm.requests) == 2


def test_sync_invoke_twice_on_one_agent(llm) -> None:
    """Each sync invoke runs on a loop of its own; the agent's SDK client follows it."""
    llm.reply_text("one")
    llm.reply_text("two")
    app = react().compile(checkpointer=InMemoryCheckpointer())
    assert app.invoke({"messages": [Message.text_message("a")]}, {"thread_id": "s"})["messages"][-1].text() == "one"
    assert app.invoke({"messages": [Message.text_message("b")]}, {"thread_id": "s"})["messages"][-1].text() == "two"
