"""Parallel calls' ``ToolResult(state=...)`` updates go through the field's reducer (helper
red-team, session 30).

Two parallel calls of a tool that does not take ``state`` each returned
``ToolResult(state={"items": [x]})`` on ``items: Annotated[list[str], operator.add]``: the last
update simply replaced the field (``["q"]``), where 10xGraph merges each parallel call through
the reducer (``["p", "q"]``). A call replayed from the ledger did the same. A single call still
assigns the field plainly, as in 10xGraph.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.state.tool_result import ToolResult

from .tool_graphs import call, tool_graph


class Collected(AgentState):
    items: Annotated[list[str], operator.add] = []


def _collect(runs: list[str]) -> Any:
    async def collect(x: str) -> ToolResult:
        runs.append(x)
        await asyncio.sleep(0.01 if x == "q" else 0)  # q finishes last: the last write
        return ToolResult(message=f"got {x}", state={"items": [x]})

    return collect


@pytest.mark.asyncio
async def test_parallel_updates_are_merged_through_the_reducer(checkpointer: Any, make_thread: Any) -> None:
    runs: list[str] = []
    turns = [[call("cp", "collect", {"x": "p"}), call("cq", "collect", {"x": "q"})], []]
    app = tool_graph(Collected, [_collect(runs)], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("merged")}
    await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg))
    assert sorted((await checkpointer.aget_state(dict(cfg))).items) == ["p", "q"]


@pytest.mark.asyncio
async def test_replayed_parallel_updates_are_merged_the_same_way(checkpointer: Any, make_thread: Any) -> None:
    runs: list[str] = []
    turns = [[call("cp", "collect", {"x": "p"}), call("cq", "collect", {"x": "q"})], []]
    app = tool_graph(Collected, [_collect(runs)], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("replayed")}
    with pytest.raises(Exception):
        await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg, failpoints="in_step_tx:tools=raise"))
    await app.ainvoke({}, dict(cfg))
    assert sorted(runs) == ["p", "q"]  # answered from the ledger the second time
    assert sorted((await checkpointer.aget_state(dict(cfg))).items) == ["p", "q"]


@pytest.mark.asyncio
async def test_a_single_calls_update_is_assigned_as_in_10xgraph(checkpointer: Any, make_thread: Any) -> None:
    runs: list[str] = []
    app = tool_graph(Collected, [_collect(runs)], [[call("c1", "collect", {"x": "p"})],
                                                   [call("c2", "collect", {"x": "q"})]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("single")}
    await app.ainvoke({"messages": [Message.text_message("one")]}, dict(cfg))
    await app.ainvoke({"messages": [Message.text_message("two")]}, dict(cfg))
    assert (await checkpointer.aget_state(dict(cfg))).items == ["q"]


class Visited(AgentState):
    visits: int = 0
    tags: list[str] = []


@pytest.mark.asyncio
@pytest.mark.parametrize("parallel", [True, False], ids=["beside-a-question", "alone"])
async def test_a_tools_changes_to_its_state_survive_its_replay(checkpointer: Any, make_thread: Any,
                                                               parallel: bool) -> None:
    """A tool that changes its injected ``state`` in place, replayed from the ledger (a resume
    after a sibling's ``interrupt()``; a retry after the step failed): its changes were lost
    (10xGraph 0.10 loses them too); they are recorded with its result now."""
    from tenxgraph.utils import interrupt

    runs: list[str] = []

    async def visit(state: Visited) -> str:
        runs.append("visit")
        state.visits += 1
        state.tags.append("visited")
        return "visited"

    async def approve(x: int) -> str:
        return f"approved {interrupt({'q': 'ok?'})}"

    calls = [call("c1", "visit", {})] + ([call("c2", "approve", {"x": 1})] if parallel else [])
    app = tool_graph(Visited, [visit, approve], [calls, []], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("visit")}
    if parallel:
        await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg))
        await app.ainvoke({"resume": "yes"}, dict(cfg))
    else:
        with pytest.raises(Exception):
            await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg, failpoints="in_step_tx:tools=raise"))
        await app.ainvoke({}, dict(cfg))
    state = await checkpointer.aget_state(dict(cfg))
    assert runs == ["visit"]
    assert (state.visits, state.tags) == (1, ["visited"])
    assert state.execution_meta.status.value == "completed"


class Ordered(AgentState):
    last: str = ""
    items: Annotated[list[str], operator.add] = []


BROKEN = [True]


def _boom(left: Any, right: Any) -> Any:
    """A reducer with a bug, until the test fixes it."""
    if BROKEN[0]:
        raise ValueError("reducer boom")
    return left + right


class Failing(AgentState):
    items: Annotated[list[str], operator.add] = []
    bad: Annotated[list[str], _boom] = []


@pytest.mark.asyncio
async def test_a_reducer_that_raises_leaves_no_other_calls_update_behind(checkpointer: Any,
                                                                        make_thread: Any) -> None:
    """(session 31) The error state of the failed node held the updates merged before the one
    that raised, and the retry (answering those calls from the ledger) applied them again:
    ``items == ["a", "b", "a", "b"]``."""
    runs: list[str] = []

    async def add(x: str) -> ToolResult:
        runs.append(x)
        return ToolResult(message=f"got {x}", state={"items": [x]})

    async def spoil(x: str) -> ToolResult:
        runs.append(x)
        return ToolResult(message="spoiled", state={"bad": [x]})

    turns = [[call("c1", "add", {"x": "a"}), call("c2", "add", {"x": "b"}), call("c3", "spoil", {"x": "c"})], []]
    app = tool_graph(Failing, [add, spoil], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("reducer-raises")}
    with pytest.raises(Exception, match="reducer boom"):
        await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg))
    failed = await checkpointer.aget_state(dict(cfg))
    assert str(failed.execution_meta.status).endswith("error") and failed.items == [] and failed.bad == []
    BROKEN[0] = False  # the reducer is fixed; the turn is retried
    try:
        await app.ainvoke({}, dict(cfg))
    finally:
        BROKEN[0] = True
    done = await checkpointer.aget_state(dict(cfg))
    assert sorted(runs) == ["a", "b", "c"]
    assert done.items == ["a", "b"], done.items


@pytest.mark.asyncio
async def test_updates_merge_in_call_order_whether_run_or_replayed(checkpointer: Any, make_thread: Any) -> None:
    """(session 31) Branches merged first, then replayed calls, then the rest: the same two calls
    left ``last == "second"`` in a straight run and ``"first"`` after a pause and a resume."""
    from tenxgraph.utils.interrupt import interrupt

    async def first(state: Ordered) -> ToolResult:
        return ToolResult(message="first", state={"last": "first", "items": ["first"]})

    async def second(state: Ordered) -> ToolResult:
        if ask:
            interrupt("ok?")
        return ToolResult(message="second", state={"last": "second", "items": ["second"]})

    finals = []
    for ask in (False, True):
        app = tool_graph(Ordered, [first, second], [[call("c1", "first"), call("c2", "second")], []],
                         checkpointer=checkpointer)
        cfg = {"thread_id": make_thread(f"order-{ask}")}
        await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg))
        if ask:
            await app.ainvoke({"resume": "yes"}, dict(cfg))
        state = await checkpointer.aget_state(dict(cfg))
        assert str(state.execution_meta.status).endswith("completed")
        finals.append((state.last, state.items))
    assert finals[0] == finals[1] == ("second", ["first", "second"]), finals
