"""A node that pauses at interrupt() runs again from its start on resume: the pause stores the
state the node started from, not what it changed before interrupt() (helper red-team, session 29:
a counter bumped before interrupt() read 2 after the resume, a message appended before it was in
the thread twice; 10xGraph 0.10 does the same)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.utils import interrupt, pending_interrupt


class Counted(AgentState):
    counter: int = 0


def _notes(state: Any) -> int:
    return sum(1 for m in state.context if m.role == "assistant" and m.text() == "progress note")


def _node_graph(checkpointer: Any, asks: int) -> Any:
    async def work(state: Counted) -> Message:
        state.counter += 1
        state.context.append(Message.text_message("progress note", role="assistant"))
        answers = [interrupt(f"question {i}?") for i in range(asks)]
        return Message.text_message(f"done with {answers}", role="assistant")

    g = StateGraph(Counted)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=checkpointer)


def _tool_graph(checkpointer: Any) -> Any:
    def bump(state: Counted) -> str:
        """Counts, then asks."""
        state.counter += 1
        answer = interrupt("go on?")
        return f"bumped: {answer}"

    async def model(state: Counted) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("", role="assistant")
            msg.tools_calls = [{"id": "call-1", "type": "function",
                                "function": {"name": "bump", "arguments": json.dumps({})}}]
            return msg
        return Message.text_message("finished", role="assistant")

    g = StateGraph(Counted)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([bump]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
@pytest.mark.parametrize("asks", [1, 2])
async def test_what_a_node_changed_before_interrupt_is_not_stored_with_the_pause(checkpointer, make_thread,
                                                                                 asks: int) -> None:
    app = _node_graph(checkpointer, asks)
    cfg = {"thread_id": make_thread("pause")}
    r = await app.ainvoke({"messages": [Message.text_message("go")]}, cfg, response_granularity="full")
    for i in range(asks):
        assert pending_interrupt(r["state"]).value == f"question {i}?"
        stored = await checkpointer.aget_state(cfg)
        assert (stored.counter, _notes(stored)) == (0, 0), "the paused node's changes were stored"
        assert (r["state"].counter, _notes(r["state"])) == (0, 0)
        r = await app.ainvoke({"resume": f"a{i}"}, cfg, response_granularity="full")
    assert pending_interrupt(r["state"]) is None
    assert r["messages"][-1].text() == f"done with {[f'a{i}' for i in range(asks)]}"
    for state in (r["state"], await checkpointer.aget_state(cfg)):
        assert state.counter == 1
        assert _notes(state) == 1


@pytest.mark.asyncio
async def test_what_a_tool_changed_in_the_state_before_interrupt_is_not_stored_with_the_pause(
        checkpointer, make_thread) -> None:
    app = _tool_graph(checkpointer)
    cfg = {"thread_id": make_thread("tool-pause")}
    r = await app.ainvoke({"messages": [Message.text_message("go")]}, cfg, response_granularity="full")
    assert pending_interrupt(r["state"]).value == "go on?"
    assert (await checkpointer.aget_state(cfg)).counter == 0
    r = await app.ainvoke({"resume": "yes"}, cfg, response_granularity="full")
    assert r["messages"][-1].text() == "finished"
    assert r["state"].counter == 1
    assert (await checkpointer.aget_state(cfg)).counter == 1


@pytest.mark.asyncio
async def test_a_node_that_pauses_in_a_run_continued_after_a_crash_is_stored_as_loaded(checkpointer,
                                                                                       make_thread) -> None:
    """The continued run commits no input: the pause goes back to the state as the run loaded it."""
    async def first(state: Counted) -> Message:
        return Message.text_message("first", role="assistant")

    async def work(state: Counted) -> Message:
        state.counter += 1
        state.context.append(Message.text_message("progress note", role="assistant"))
        return Message.text_message(f"done: {interrupt('go on?')}", role="assistant")

    g = StateGraph(Counted)
    g.add_node("first", first)
    g.add_node("work", work)
    g.add_edge(START, "first")
    g.add_edge("first", "work")
    g.add_edge("work", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("continued")}
    with pytest.raises(Exception) as crashed:
        await app.ainvoke({"messages": [Message.text_message("go")]}, {**cfg, "failpoints": "after_step:first=raise"})
    assert getattr(crashed.value, "error_code", None) == "FAILPOINT_001"
    r = await app.ainvoke({}, cfg, response_granularity="full")
    assert pending_interrupt(r["state"]).value == "go on?"
    stored = await checkpointer.aget_state(cfg)
    assert (stored.counter, _notes(stored), [m.text() for m in stored.context]) == (0, 0, ["go", "first"])
    r = await app.ainvoke({"resume": "yes"}, cfg, response_granularity="full")
    assert r["messages"][-1].text() == "done: yes"
    stored = await checkpointer.aget_state(cfg)
    assert (stored.counter, _notes(stored)) == (1, 1)


def _one_asking_node(checkpointer: Any, name: str) -> Any:
    async def ask(state: Counted) -> Message:
        return Message.text_message(f"answered {interrupt('approve?')}", role="assistant")

    g = StateGraph(Counted)
    g.add_node(name, ask)
    g.add_edge(START, name)
    g.add_edge(name, END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", [{"resume": "yes"}, {}, {"messages": [Message.text_message("again")]}],
                         ids=["resume", "continue", "new-message"])
async def test_a_graph_without_the_node_a_thread_paused_at_refuses_it_and_writes_nothing(checkpointer, make_thread,
                                                                                       how) -> None:
    """A deploy renamed the paused node: before, NODE_001 "Error in node 'ask': 'ask'" and the
    thread written failed, its question lost (the old graph then had nothing to resume)."""
    from tenxgraph.core.exceptions import GraphError

    old, new = _one_asking_node(checkpointer, "ask"), _one_asking_node(checkpointer, "ask_v2")
    cfg = {"thread_id": make_thread("renamed")}
    await old.ainvoke({"messages": [Message.text_message("go")]}, cfg)
    before = await checkpointer.aget_state(cfg)
    with pytest.raises(GraphError) as refused:
        await new.ainvoke(dict(how), cfg)
    assert refused.value.error_code == "GRAPH_004"
    assert "'ask'" in str(refused.value) and "nothing was run or written" in str(refused.value)
    after = await checkpointer.aget_state(cfg)
    assert after.model_dump() == before.model_dump()
    assert pending_interrupt(after).value == "approve?"
    r = await old.ainvoke({"resume": "yes"}, cfg)  # not left leased or busy
    assert r["messages"][-1].text() == "answered yes"
