"""Parallel tool branches: each call gets its own copy of the state; changes merge back (§5.4)."""

from __future__ import annotations

import asyncio
import logging
import operator
from typing import Annotated, Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.state.tool_result import ToolResult
from tests_py.tool_graphs import call, tool_graph, tool_texts


class Shop(AgentState):
    tags: Annotated[list[str], operator.add] = []
    owner: str = "nobody"
    note: str = ""
    untouched: int = 7


def user(text: str) -> Message:
    return Message.text_message(text)


async def _run(app: Any, thread: str) -> dict[str, Any]:
    return await app.ainvoke({"messages": [user("go")]}, {"thread_id": thread}, "full")


@pytest.mark.asyncio
async def test_reducer_field_combines_both_branches(checkpointer, make_thread) -> None:
    async def tag_a(state: Shop) -> str:
        state.tags.append("a")
        return "a"

    async def tag_b(state: Shop) -> str:
        await asyncio.sleep(0.01)
        state.tags.append("b")
        return "b"

    app = tool_graph(Shop, [tag_a, tag_b], [[call("c1", "tag_a"), call("c2", "tag_b")]], checkpointer=checkpointer)
    r = await _run(app, make_thread())
    assert sorted(r["state"].tags) == ["a", "b"]
    assert r["state"].untouched == 7


@pytest.mark.asyncio
async def test_branches_do_not_see_each_others_writes(checkpointer, make_thread) -> None:
    seen: dict[str, Any] = {}

    async def first(state: Shop) -> str:
        state.owner = "first"
        await asyncio.sleep(0.05)
        seen["first_sees_note"] = state.note
        return "1"

    async def second(state: Shop) -> str:
        state.note = "from second"
        await asyncio.sleep(0.05)
        seen["second_sees_owner"] = state.owner
        return "2"

    app = tool_graph(Shop, [first, second], [[call("c1", "first"), call("c2", "second")]], checkpointer=checkpointer)
    r = await _run(app, make_thread())
    assert seen == {"first_sees_note": "", "second_sees_owner": "nobody"}
    # Different fields changed by different branches: both survive the merge.
    assert (r["state"].owner, r["state"].note) == ("first", "from second")


@pytest.mark.asyncio
async def test_same_field_without_reducer_last_write_wins_with_a_warning(checkpointer, make_thread, caplog) -> None:
    async def w1(state: Shop) -> str:
        state.owner = "w1"
        return "1"

    async def w2(state: Shop) -> str:
        state.owner = "w2"
        return "2"

    caplog.set_level(logging.WARNING, logger="tenxgraph.tools")
    app = tool_graph(Shop, [w1, w2], [[call("c1", "w1"), call("c2", "w2")]], checkpointer=checkpointer)
    r = await _run(app, make_thread())
    assert r["state"].owner == "w2"  # merged in call order
    assert "no reducer" in caplog.text


@pytest.mark.asyncio
async def test_internal_data_merges_key_by_key(checkpointer, make_thread) -> None:
    async def p(state: Shop) -> str:
        state.execution_meta.internal_data.setdefault("log", []).append("p")
        state.execution_meta.internal_data["p_only"] = 1
        return "p"

    async def q(state: Shop) -> str:
        state.execution_meta.internal_data.setdefault("log", []).append("q")
        state.execution_meta.internal_data["q_only"] = {"x": 1}
        return "q"

    app = tool_graph(Shop, [p, q], [[call("c1", "p"), call("c2", "q")]], checkpointer=checkpointer)
    r = await _run(app, make_thread())
    data = r["state"].execution_meta.internal_data
    assert sorted(data["log"]) == ["p", "q"]
    assert data["p_only"] == 1 and data["q_only"] == {"x": 1}


@pytest.mark.asyncio
async def test_single_call_works_on_the_live_state(checkpointer, make_thread) -> None:
    async def only(state: Shop) -> str:
        state.note = "in place"
        state.tags.append("solo")
        return "done"

    app = tool_graph(Shop, [only], [[call("c1", "only")]], checkpointer=checkpointer)
    r = await _run(app, make_thread())
    assert r["state"].note == "in place" and r["state"].tags == ["solo"]


@pytest.mark.asyncio
async def test_tool_result_state_update_is_applied_and_replayed(checkpointer, make_thread) -> None:
    runs = {"n": 0}

    async def assign(owner: str) -> ToolResult:
        runs["n"] += 1
        return ToolResult(message=f"assigned {owner}", state={"owner": owner, "not_a_field": 1})

    app = tool_graph(Shop, [assign], [[call("c1", "assign", {"owner": "ana"})]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    r = await app.ainvoke({"messages": [user("go")]}, cfg, "full")
    assert r["state"].owner == "ana" and tool_texts(r["messages"]) == {"c1": "assigned ana"}
    # Replay the node from the ledger: the recorded state update is applied again, the tool is not run.
    state = await checkpointer.aget_state(cfg)
    ask = next(m for m in state.context if m.tools_calls)
    state.context = state.context[: state.context.index(ask) + 1]
    state.owner = "reset"
    await checkpointer.aput_state(cfg, state)
    r = await app.ainvoke({"state": {"current_node": "tools"}}, cfg, "full")
    assert runs["n"] == 1
    assert r["state"].owner == "ana"


@pytest.mark.asyncio
async def test_a_failing_branch_does_not_lose_its_siblings(checkpointer, make_thread) -> None:
    async def good(state: Shop) -> str:
        state.tags.append("good")
        return "good"

    async def bad(state: Shop) -> str:
        state.tags.append("bad")
        raise RuntimeError("exploded")

    app = tool_graph(Shop, [good, bad], [[call("c1", "good"), call("c2", "bad")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    r = await app.ainvoke({"messages": [user("go")]}, cfg, "full")
    out = tool_texts(r["messages"])
    assert out["c1"] == "good" and "exploded" in out["c2"]
    assert "good" in r["state"].tags
    state = await checkpointer.aget_state(cfg)
    ask = next(m for m in state.context if m.tools_calls)
    assert await checkpointer.aget_tool_result(cfg, f"{ask.message_id}:c1") is not None
    assert await checkpointer.aget_tool_result(cfg, f"{ask.message_id}:c2") is not None  # errors are recorded
