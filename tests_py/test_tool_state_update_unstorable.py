"""A tool's state update the state cannot store does not wedge the thread (helper red-team, session 30).

A tool returned ``ToolResult(state={"score": None})`` (or NaN, which the ledger's JSON dump made
``null``) for a field typed ``float``: the turn failed, which is right, but the update was
recorded with the call, so every retry and every new turn (whose close of the failed tool node
replays the call) applied it again and failed the same way: the thread never took another turn.
Now the result is recorded without the update; the failed turn names it, with an error code.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.state.tool_result import ToolResult

from .tool_graphs import call, tool_graph


class Scored(AgentState):
    score: float = 0.0


BAD = {"none": None, "nan": math.nan, "inf": math.inf, "int_past_64_bits": 2**70, "text": "high"}


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", list(BAD), ids=list(BAD))
async def test_the_call_is_recorded_without_the_update_and_the_thread_goes_on(
        checkpointer: Any, make_thread: Any, bad: str) -> None:
    runs: list[int] = []

    async def measure(tool_call_id: str) -> ToolResult:
        runs.append(1)
        return ToolResult(message="measured", state={"score": BAD[bad]})

    app = tool_graph(Scored, [measure], [[call("c1", "measure", {})], []], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("score")}
    with pytest.raises(ValueError) as e:
        await app.ainvoke({"messages": [Message.text_message("measure")]}, dict(cfg))
    assert getattr(e.value, "error_code", None) == "STORAGE_SERIALIZATION_001", repr(e.value)
    assert "score" in str(e.value)
    state = await checkpointer.aget_state(dict(cfg))
    row = await checkpointer.aget_tool_result(dict(cfg), f"{state.context[1].message_id}:c1")
    assert row is not None and "state" not in row, row

    out = await app.ainvoke({}, dict(cfg))  # the retry: the result is replayed, without the update
    assert out["messages"][-1].text() == "done"
    assert runs == [1]
    state = await checkpointer.aget_state(dict(cfg))
    assert state.score == 0.0
    assert [m.role for m in state.context] == ["user", "assistant", "tool", "assistant"]
    await app.ainvoke({"messages": [Message.text_message("again")]}, dict(cfg))
    assert (await checkpointer.aget_state(dict(cfg))).execution_meta.status.value == "completed"


@pytest.mark.asyncio
async def test_a_new_turn_closes_the_failed_node_without_the_update(checkpointer: Any, make_thread: Any) -> None:
    runs: list[int] = []

    async def measure(tool_call_id: str) -> ToolResult:
        runs.append(1)
        return ToolResult(message="measured", state={"score": None})

    app = tool_graph(Scored, [measure], [[call("c1", "measure", {})], []], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("close")}
    with pytest.raises(ValueError):
        await app.ainvoke({"messages": [Message.text_message("measure")]}, dict(cfg))
    await app.ainvoke({"messages": [Message.text_message("never mind")]}, dict(cfg))
    state = await checkpointer.aget_state(dict(cfg))
    assert state.execution_meta.status.value == "completed"
    assert runs == [1]


@pytest.mark.asyncio
async def test_a_storable_update_is_still_recorded_and_replayed(checkpointer: Any, make_thread: Any) -> None:
    async def measure(tool_call_id: str) -> ToolResult:
        return ToolResult(message="measured", state={"score": 2.5})

    app = tool_graph(Scored, [measure], [[call("c1", "measure", {})], []], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("good")}
    with pytest.raises(Exception):
        await app.ainvoke({"messages": [Message.text_message("m")]}, dict(cfg, failpoints="after_record:measure=raise"))
    state = await checkpointer.aget_state(dict(cfg))
    row = await checkpointer.aget_tool_result(dict(cfg), f"{state.context[1].message_id}:c1")
    assert row is not None and row.get("state") == {"score": 2.5}, row
    await app.ainvoke({}, dict(cfg))
    assert (await checkpointer.aget_state(dict(cfg))).score == 2.5
