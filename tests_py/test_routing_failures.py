"""Routing out of a node whose step is committed (helper red-team, session 30).

1. After a routing error (an unknown target, ``GRAPH_ROUTING_002``; a router that raised,
   ``GRAPH_ROUTING_001``), each retry ``ainvoke({})`` ran the finished node again and stored its
   output again: a second model call and reply per retry; after a model that asked for tools, its
   calls were never run nor answered (10xGraph 0.10 does the same). A retry now routes again from
   the node; a new message still runs the failed node, as 10xGraph does.
2. A ``path_map`` keyed by bools or ints failed ``compile()`` with a bare TypeError; 10xGraph
   routes on ``result == key``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import GraphError, ThreadBusyError
from tenxgraph.core.graph.tool_node import ToolNode


def _tool_agent(checkpointer: Any, router: Any, paid: list[int], replies: list[int]) -> Any:
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return f"paid {amount}"

    async def model(state: AgentState) -> Message:
        replies.append(1)
        if state.context[-1].role == "user":
            m = Message.text_message("paying", role="assistant")
            m.tools_calls = [{"id": f"call{len(replies)}", "type": "function",
                              "function": {"name": "pay", "arguments": json.dumps({"amount": 10})}}]
            return m
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([pay]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", router)
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


def _router_that_raises_once() -> Any:
    """A router whose backend fails once (GRAPH_ROUTING_001), then routes to the tools while the
    last message asks for them."""
    flaky = {"raise": True}

    def router(state: AgentState) -> str:
        if flaky.pop("raise", False):
            raise ConnectionError("router backend blip")
        return "tools" if state.context[-1].tools_calls else END

    return router


def _calls(context: list[Message]) -> tuple[list[str], list[str]]:
    asked = [c["id"] for m in context for c in (m.tools_calls or [])]
    answered = [b.call_id for m in context if m.role == "tool" for b in m.content if hasattr(b, "call_id")]
    return asked, answered


@pytest.mark.asyncio
async def test_a_retry_after_a_router_that_raised_routes_again_and_answers_the_call(
        checkpointer: Any, make_thread: Any) -> None:
    paid: list[int] = []
    replies: list[int] = []
    app = _tool_agent(checkpointer, _router_that_raises_once(), paid, replies)
    cfg = {"thread_id": make_thread("flaky-router")}
    with pytest.raises(GraphError) as e:
        await app.ainvoke({"messages": [Message.text_message("pay 10")]}, dict(cfg))
    assert e.value.error_code == "GRAPH_ROUTING_001"
    out = await app.ainvoke({}, dict(cfg))
    assert out["messages"][-1].text() == "done"
    context = (await checkpointer.aget_state(dict(cfg))).context
    asked, answered = _calls(context)
    assert asked == answered == ["call1"]
    assert paid == [10] and len(replies) == 2  # the model: its first call, and after the tool


@pytest.mark.asyncio
async def test_a_retry_after_an_unknown_target_does_not_run_the_node_again(checkpointer: Any, make_thread: Any) -> None:
    target = {"name": "nowhere"}
    runs: list[int] = []

    async def model(state: AgentState) -> Message:
        runs.append(1)
        return Message.text_message(f"reply {len(runs)}", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: target["name"])
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("unknown-target")}
    for attempt in ({"messages": [Message.text_message("hi")]}, {}, {}):
        with pytest.raises(GraphError) as e:
            await app.ainvoke(attempt, dict(cfg))
        assert e.value.error_code == "GRAPH_ROUTING_002"
    assert runs == [1]
    state = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in state.context] == ["hi", "reply 1"]
    target["name"] = END  # the router fixed by a deploy: the retry routes on, nothing runs again
    await app.ainvoke({}, dict(cfg))
    state = await checkpointer.aget_state(dict(cfg))
    assert runs == [1] and state.execution_meta.status.value == "completed"
    assert [m.text() for m in state.context] == ["hi", "reply 1"]
    # A new message after a routing failure runs the node again, with the message (10xGraph's rule).
    target["name"] = "nowhere"
    with pytest.raises(GraphError):
        await app.ainvoke({"messages": [Message.text_message("again")]}, dict(cfg))
    target["name"] = END
    await app.ainvoke({"messages": [Message.text_message("and again")]}, dict(cfg))
    assert len(runs) == 3


@pytest.mark.asyncio
@pytest.mark.parametrize("keys", ["bools", "ints"])
async def test_a_path_map_keyed_by_bools_or_ints_routes_on_equality(checkpointer: Any, make_thread: Any,
                                                                    keys: str) -> None:
    async def a(state: AgentState) -> Message:
        return Message.text_message("a", role="assistant")

    async def b(state: AgentState) -> Message:
        return Message.text_message("b", role="assistant")

    async def c(state: AgentState) -> Message:
        return Message.text_message("c", role="assistant")

    g = StateGraph(AgentState)
    for name, fn in (("a", a), ("b", b), ("c", c)):
        g.add_node(name, fn)
    g.add_edge(START, "a")
    if keys == "bools":
        g.add_conditional_edges("a", lambda s: "go" in s.context[0].text(), {True: "b", False: "c"})
    else:
        g.add_conditional_edges("a", lambda s: 1 if "go" in s.context[0].text() else 2, {1: "b", 2: "c"})
    g.add_edge("b", END)
    g.add_edge("c", END)
    app = g.compile(checkpointer=checkpointer)
    for text, last in (("go", "b"), ("stay", "c")):
        out = await app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": make_thread(keys)})
        assert [m.text() for m in out["messages"]][-1] == last


@pytest.mark.asyncio
async def test_a_new_message_after_a_routing_error_waits_for_the_calls_the_node_asked_for(
        checkpointer: Any, make_thread: Any) -> None:
    # The new turn ran the model again and left its first call unanswered for good (10xGraph
    # too): refused like any new input while tool calls wait, until `{}` routes on.
    paid: list[int] = []
    replies: list[int] = []
    app = _tool_agent(checkpointer, _router_that_raises_once(), paid, replies)
    cfg = {"thread_id": make_thread("new-turn")}
    with pytest.raises(GraphError):
        await app.ainvoke({"messages": [Message.text_message("pay 10")]}, dict(cfg))
    c = dict(cfg)
    before = await checkpointer.aget_state(c)
    with pytest.raises(ThreadBusyError) as e:
        await app.ainvoke({"messages": [Message.text_message("hello?")]}, dict(cfg))
    assert e.value.error_code == "STORAGE_BUSY_001" and "'call1'" in str(e.value)
    c2 = dict(cfg)
    after = await checkpointer.aget_state(c2)
    assert (c2["_checkpoint_version"], len(after.context)) == (c["_checkpoint_version"], len(before.context))
    await app.ainvoke({}, dict(cfg))
    await app.ainvoke({"messages": [Message.text_message("hello?")]}, dict(cfg))
    asked, answered = _calls((await checkpointer.aget_state(dict(cfg))).context)
    assert sorted(asked) == sorted(answered) and paid == [10, 10]


def _goto_graph(checkpointer: Any, calls: list[str], *, with_target: bool, goto: Any = "Z") -> Any:
    """A returns ``Command(goto=goto)`` and has a static edge to C; Z is deployed or not."""
    from tenxgraph.utils import Command

    def a(state: AgentState) -> Any:
        calls.append("A")
        return Command(update=Message.text_message(f"A{len(calls)}", role="assistant"), goto=goto)

    def c(state: AgentState) -> Message:
        calls.append("C")
        return Message.text_message("the static path", role="assistant")

    def z(state: AgentState) -> Message:
        calls.append("Z")
        return Message.text_message("the chosen path", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("A", a)
    g.add_node("C", c)
    g.add_edge(START, "A")
    g.add_edge("A", "C")
    g.add_edge("C", END)
    if with_target:
        g.add_node("Z", z)
        g.add_edge("Z", END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
async def test_a_retry_after_a_goto_to_an_unknown_node_goes_where_the_command_said(
    checkpointer: Any, make_thread: Any
) -> None:
    """The goto is kept with the failure: until the graph has the node a retry fails again, and
    once a deploy adds it the retry runs it (10xGraph does both). Before, a retry routed by A's
    edges alone and ran C, a path nobody chose (differential red-team, session 38)."""
    calls: list[str] = []
    cfg = {"thread_id": make_thread()}
    for _ in range(2):
        with pytest.raises(GraphError) as failed:
            await _goto_graph(checkpointer, calls, with_target=False).ainvoke(
                {"messages": [Message.text_message("go")]} if not calls else {}, dict(cfg))
        assert failed.value.error_code == "GRAPH_ROUTING_002"
    assert calls == ["A"]  # the retry ran nothing: it failed to route again
    out = await _goto_graph(checkpointer, calls, with_target=True).ainvoke({}, dict(cfg))
    assert calls == ["A", "Z"]
    assert [m.text() for m in out["messages"]][-1] == "the chosen path"
    stored = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in stored.context] == ["go", "A1", "the chosen path"]
    assert stored.execution_meta.interrupt_data is None


@pytest.mark.asyncio
@pytest.mark.parametrize("goto", [["C"], 5], ids=["list", "int"])
async def test_a_goto_that_is_not_a_name_stores_nothing_of_the_node(checkpointer: Any, make_thread: Any,
                                                                     goto: Any) -> None:
    """``Command(goto=["C"])`` (LangGraph's list style) failed after the node's update was merged:
    the failure stored it and the retry stored it again (two replies). The goto is checked before
    anything merges (10xGraph fails too, with a bare TypeError, and stores the list as its next
    node)."""
    from tenxgraph.core.exceptions import NodeError

    calls: list[str] = []
    cfg = {"thread_id": make_thread()}
    with pytest.raises(NodeError) as failed:
        await _goto_graph(checkpointer, calls, with_target=True, goto=goto).ainvoke(
            {"messages": [Message.text_message("go")]}, dict(cfg))
    assert "Command.goto must be the name of a node" in str(failed.value)
    stored = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in stored.context] == ["go"]
    await _goto_graph(checkpointer, calls, with_target=True, goto="Z").ainvoke({}, dict(cfg))
    stored = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in stored.context] == ["go", "A2", "the chosen path"]
