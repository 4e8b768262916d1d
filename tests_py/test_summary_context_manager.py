"""SummaryContextManager: thresholds, keep_recent, where the summary goes, what a failed summary
call does, and its use by an Agent inside a graph, through the real OpenAI SDK against the local
stand-in; the trim and the summary request compared with 10xGraph 0.10's."""

from __future__ import annotations

import asyncio
import logging

import pytest

pytest.importorskip("openai")

from tenxgraph.core.graph import Agent, StateGraph  # noqa: E402
from tenxgraph.core.llm import ModelConfigError  # noqa: E402
from tenxgraph.core.state import AgentState, Message, SummaryContextManager  # noqa: E402
from tenxgraph.core.state.summary_context_manager import DEFAULT_SUMMARY_PROMPT, estimate_tokens  # noqa: E402
from tenxgraph.storage.checkpointer import InMemoryCheckpointer  # noqa: E402
from tenxgraph.testing.providers import OpenAIStandIn  # noqa: E402
from tenxgraph.utils import END  # noqa: E402
from tests_py.llm_agents.stand_in_env import serving  # noqa: E402


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    yield from serving(OpenAIStandIn, monkeypatch, drop=("AGENTFLOW_LLM_TIMEOUT",))


def conversation(n: int) -> list[Message]:
    """A system prompt and n alternating user / assistant turns u0, a1, u2, ..."""
    out = [Message.text_message("You are helpful.", role="system")]
    for i in range(n):
        out.append(Message.text_message(f"{'u' if i % 2 == 0 else 'a'}{i}", role="user" if i % 2 == 0 else "assistant"))
    return out


def texts(messages: list[Message]) -> list[str]:
    return [m.text() for m in messages]


def summary_input(llm: OpenAIStandIn, index: int = -1) -> str:
    body = llm.requests[index].body
    items = body["input"]
    return items if isinstance(items, str) else items[-1]["content"]


def test_below_both_thresholds_nothing_is_sent(llm: OpenAIStandIn) -> None:
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=10, token_budget=1000)
    state = AgentState(context=conversation(6))
    out = asyncio.run(mgr.atrim_context(state))
    assert texts(out.context) == texts(conversation(6)) and out.context_summary is None
    assert llm.requests == []


def test_over_max_messages_the_oldest_are_summarised(llm: OpenAIStandIn) -> None:
    llm.reply_text("The user said u0 and u2.")
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=5, keep_recent=3)
    out = asyncio.run(mgr.atrim_context(AgentState(context=conversation(6))))
    # System kept, the last keep_recent kept verbatim, the rest replaced by the summary.
    assert texts(out.context) == ["You are helpful.", "a3", "u4", "a5"]
    assert out.context_summary == "The user said u0 and u2."
    (req,) = llm.requests
    assert summary_input(llm) == "Conversation to summarize:\n\nUSER: u0\nASSISTANT: a1\nUSER: u2"
    assert req.body["instructions"] == DEFAULT_SUMMARY_PROMPT
    assert req.body["max_output_tokens"] == 600


def test_the_summary_is_appended_to_an_earlier_one(llm: OpenAIStandIn) -> None:
    llm.reply_text("Later part.")
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=3, keep_recent=2)
    state = AgentState(context=conversation(4), context_summary="Earlier part.")
    out = asyncio.run(mgr.atrim_context(state))
    assert out.context_summary == "Earlier part.\n\nLater part."
    assert texts(out.context) == ["You are helpful.", "u2", "a3"]


def test_the_token_budget_triggers_alone(llm: OpenAIStandIn) -> None:
    llm.reply_text("short")
    ctx = [Message.text_message("x" * 400), Message.text_message("y" * 400, role="assistant"),
           Message.text_message("z")]
    assert estimate_tokens(ctx) == 200
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=None, token_budget=150, keep_recent=1)
    out = asyncio.run(mgr.atrim_context(AgentState(context=ctx)))
    assert texts(out.context) == ["z"] and out.context_summary == "short"
    under = SummaryContextManager("gpt-4o-mini", max_messages=None, token_budget=200, keep_recent=1)
    assert asyncio.run(under.atrim_context(AgentState(context=list(ctx)))).context_summary is None
    assert len(llm.requests) == 1


def test_a_failed_summary_call_leaves_the_context_as_it_was(llm: OpenAIStandIn,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    llm.reply_error(400, "bad request")
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=2, keep_recent=1)
    state = AgentState(context=conversation(4), context_summary="kept")
    with caplog.at_level(logging.ERROR, logger="tenxgraph.state.summary"):
        out = asyncio.run(mgr.atrim_context(state))
    assert texts(out.context) == texts(conversation(4)) and out.context_summary == "kept"
    assert "summary call" in caplog.text
    # An empty summary is no summary either.
    llm.reply_text("")
    out = asyncio.run(mgr.atrim_context(AgentState(context=conversation(4))))
    assert len(out.context) == 5 and out.context_summary is None


def test_a_later_turn_summarises_only_what_left_the_window(llm: OpenAIStandIn) -> None:
    llm.reply_text("S1")
    llm.reply_text("S2")
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=4, keep_recent=2)
    history = conversation(6)
    first = asyncio.run(mgr.atrim_context(AgentState(context=list(history))))
    assert first.context_summary == "S1"
    history += [Message.text_message("u6"), Message.text_message("a7", role="assistant")]
    second = asyncio.run(mgr.atrim_context(AgentState(context=list(history))))
    assert second.context_summary == "S1\n\nS2"
    assert texts(second.context) == ["You are helpful.", "u6", "a7"]
    assert summary_input(llm, 1) == "Conversation to summarize:\n\nUSER: u4\nASSISTANT: a5"
    # The same window again costs no request.
    third = asyncio.run(mgr.atrim_context(AgentState(context=list(history))))
    assert third.context_summary == "S1\n\nS2" and len(llm.requests) == 2


def test_an_empty_summary_is_not_remembered_as_covering_its_messages(llm: OpenAIStandIn) -> None:
    """(Red-team, session 35) An empty reply (a reasoning model that spent its tokens thinking, a
    content filter) left the context as it was, but was remembered as the summary of those
    messages: the next turn summarised only the later ones, and the first were in neither the
    prompt nor any summary. After an earlier summary, the chunk was dropped on the same turn."""
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=3, keep_recent=2)
    history = conversation(8)  # one thread's messages, growing turn by turn
    llm.reply_text("")
    out = asyncio.run(mgr.atrim_context(AgentState(context=history[:5])))
    assert texts(out.context) == texts(history[:5]) and out.context_summary is None
    llm.reply_text("S")
    out = asyncio.run(mgr.atrim_context(AgentState(context=history[:7])))
    assert summary_input(llm) == "Conversation to summarize:\n\nUSER: u0\nASSISTANT: a1\nUSER: u2\nASSISTANT: a3"
    assert out.context_summary == "S" and texts(out.context) == ["You are helpful.", "u4", "a5"]
    # An earlier summary, then an empty one for the next chunk: the context stays whole.
    llm.reply_text("")
    out = asyncio.run(mgr.atrim_context(AgentState(context=history[:9])))
    assert texts(out.context) == texts(history[:9]) and out.context_summary is None


def test_keep_recent_zero_summarises_everything_but_the_system_prompt(llm: OpenAIStandIn) -> None:
    """(Red-team, session 35) It raised IndexError (NODE_001 on every turn past the threshold);
    10xGraph summarises every message but the system ones."""
    llm.reply_text("all of it")
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=2, keep_recent=0)
    out = asyncio.run(mgr.atrim_context(AgentState(context=conversation(4))))
    assert texts(out.context) == ["You are helpful."] and out.context_summary == "all of it"
    assert summary_input(llm) == "Conversation to summarize:\n\nUSER: u0\nASSISTANT: a1\nUSER: u2\nASSISTANT: a3"


@pytest.mark.parametrize("kwargs", [{"model": ""}, {"max_messages": -1}, {"keep_recent": "8"},
                                    {"token_budget": 1.5}, {"max_summary_tokens": 0}, {"api_style": "grpc"}])
def test_bad_settings_are_refused(kwargs: dict) -> None:
    args = {"model": "gpt-4o-mini", **kwargs}
    with pytest.raises(ModelConfigError) as err:
        SummaryContextManager(args.pop("model"), **args)
    assert err.value.error_code == "LLM_CONFIG_003" and isinstance(err.value, ValueError)


def test_inside_a_graph_the_model_sees_the_summary_and_the_thread_keeps_everything(llm: OpenAIStandIn) -> None:
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=3, keep_recent=2, api_style="chat")
    g = StateGraph(context_manager=mgr)
    g.add_node("MAIN", Agent(model="gpt-4o-mini", trim_context=True, retry_config=False,
                             system_prompt=[{"role": "system", "content": "S"}]))
    g.set_entry_point("MAIN")
    g.add_edge("MAIN", END)
    cp = InMemoryCheckpointer()
    app = g.compile(checkpointer=cp)
    cfg = {"thread_id": "sum"}
    llm.reply_text("re: one")
    app.invoke({"messages": [Message.text_message("one")]}, cfg)
    llm.reply_text("re: two")
    app.invoke({"messages": [Message.text_message("two")]}, cfg)
    assert [r.body.get("model") for r in llm.requests] == ["gpt-4o-mini", "gpt-4o-mini"]
    # Third turn: 5 messages > 3, so all but the last 2 are summarised first, then the agent asks.
    llm.reply_text("They greeted.")
    llm.reply_text("re: three")
    app.invoke({"messages": [Message.text_message("three")]}, cfg)
    summary_req, agent_req = llm.requests[2], llm.requests[3]
    assert summary_req.messages[-1]["content"] == \
        "Conversation to summarize:\n\nUSER: one\nASSISTANT: re: one\nUSER: two"
    assert agent_req.messages == [{"role": "system", "content": "S"},
                                  {"role": "assistant", "content": "They greeted."},
                                  {"role": "assistant", "content": "re: two"},
                                  {"role": "user", "content": "three"}]
    state = asyncio.run(cp.aget_state(cfg))
    assert texts(state.context) == ["one", "re: one", "two", "re: two", "three", "re: three"]


DIFF_SCRIPT = """
import asyncio
from tenxgraph.core.state import AgentState, Message, SummaryContextManager
ctx = [Message.text_message("sys", role="system")]
for i in range(7):
    ctx.append(Message.text_message(f"m{i}", role="user" if i % 2 == 0 else "assistant"))
ctx[3].tools_calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
state = AgentState(context=ctx, context_summary="before")
mgr = SummaryContextManager("gpt-4o-mini", max_messages=6, keep_recent=3)
out = asyncio.run(mgr.atrim_context(state))
under = asyncio.run(SummaryContextManager("gpt-4o-mini").atrim_context(AgentState(context=list(ctx[:4]))))
emit({"context": [m.text() for m in out.context], "summary": out.context_summary,
      "under": [m.text() for m in under.context], "defaults": [mgr.keep_recent, mgr.max_summary_tokens,
      SummaryContextManager("gpt-4o-mini").max_messages, SummaryContextManager("gpt-4o-mini").token_budget]})
"""


def test_trim_and_summary_request_match_10xgraph(oracle, llm: OpenAIStandIn) -> None:  # type: ignore[no-untyped-def]
    llm.reply_text("It went on.")
    theirs = oracle.run_theirs(DIFF_SCRIPT, env=llm.env)
    llm.reply_text("It went on.")
    ours = oracle.run_ours(DIFF_SCRIPT, env=llm.env)
    assert ours == theirs, (theirs, ours)
    assert ours["summary"] == "before\n\nIt went on."
    assert ours["defaults"] == [3, 600, 30, None]
    # The same transcript (tool calls included) sent to the model; the instruction is worded
    # differently (ours), so only the conversation part is compared.
    assert summary_input(llm, 0) == summary_input(llm, 1)
    assert "[Tool calls:" in summary_input(llm, 1)
    assert llm.requests[0].body["max_output_tokens"] == llm.requests[1].body["max_output_tokens"] == 600


def test_a_run_killed_after_its_summary_resumes_and_summarises_again(llm: OpenAIStandIn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tenxgraph.storage.checkpointer import SqliteCheckpointer
    from tenxgraph.testing.crash import resume, run_until_crash
    from tests_py.crash_agents.summary_agent import build

    db = str(tmp_path / "summary.db")
    target = "tests_py.crash_agents.summary_agent:build"

    async def first_turns() -> None:
        app = build(SqliteCheckpointer(db))
        for text in ("one", "two"):
            llm.reply_text(f"re: {text}")
            await app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": "k"})
        await app.aclose()

    asyncio.run(first_turns())
    # Turn three: the summary call and the model call are made, then the process is SIGKILLed
    # inside the step's transaction, before its commit.
    llm.reply_text("They greeted.")
    llm.reply_text("re: three (lost)")
    crashed = run_until_crash(target, "k", failpoints="in_step_tx:MAIN=kill", db=db, input="three",
                              env=llm.env, timeout=120)
    assert crashed.killed
    assert len(llm.requests) == 4
    # A fresh process resumes the step: the summary is not stored anywhere (derived data), so it is
    # asked for again, then the model; the thread ends with one answer to "three".
    llm.reply_text("They greeted again.")
    llm.reply_text("re: three")
    resumed = resume(target, "k", db=db, env=llm.env, timeout=120)
    assert resumed.status == "completed"
    summary_req, agent_req = llm.requests[4], llm.requests[5]
    assert summary_req.messages[-1]["content"] == \
        "Conversation to summarize:\n\nUSER: one\nASSISTANT: re: one\nUSER: two"
    assert agent_req.messages[1] == {"role": "assistant", "content": "They greeted again."}
    assert len(llm.requests) == 6

    async def stored() -> list[str]:
        cp = SqliteCheckpointer(db)
        try:
            return texts((await cp.aget_state({"thread_id": "k"})).context)
        finally:
            await cp.arelease()

    assert asyncio.run(stored()) == ["one", "re: one", "two", "re: two", "three", "re: three"]
