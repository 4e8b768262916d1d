"""Closing a graph (``aclose()``) or releasing its checkpointer (``arelease()``) while a run is in
flight, as a server's shutdown does (helper red-team, session 32): the store closed under the
run, the ledger write of a tool that returned a moment later was refused (``STORAGE_001``), and
the thread's next run fired the tool again (10 of 10 on SQLite and PostgreSQL).

Now ``aclose()`` lets runs in flight end first (up to a third of ``shutdown_timeout``), then
cancels the rest and lets them unwind; ``arelease()`` cancels them at once and waits for them,
and for sync calls still in their threads, to record what they returned.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
BACKENDS = ["sqlite", "postgres"]


def _store(backend: str, where: Path, schema: str) -> Any:
    if backend == "postgres":
        if not DSN:
            pytest.skip("needs TENXGRAPH_TEST_PG_DSN")
        return PgCheckpointer(DSN, schema=schema)
    return SqliteCheckpointer(str(where / "agent.db"))


def _app(checkpointer: Any, tool: Callable[..., Any]) -> Any:
    def model(state: AgentState) -> Message:
        if state.context[-1].role == "tool":
            return Message.text_message("done", role="assistant")
        call = {"id": "c1", "type": "function", "function": {"name": "pay", "arguments": json.dumps({"amount": 5})}}
        return Message(role="assistant", content=[], tools_calls=[call])

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([tool]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END)
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def _pay_tools(fired: list[str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    async def pay(amount: int, idempotency_key: str) -> str:
        """Pay."""
        fired.append(idempotency_key)
        return "paid"

    def pay_sync(amount: int, idempotency_key: str) -> str:
        """Pay."""
        fired.append(idempotency_key)
        return "paid"

    pay_sync.__name__ = "pay"
    return pay, pay_sync


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.asyncio
async def test_aclose_lets_a_run_in_flight_finish_and_record_its_tool(tmp_path: Path, backend: str) -> None:
    schema = f"close_{uuid.uuid4().hex[:8]}"
    entered, gate = asyncio.Event(), asyncio.Event()
    fired: list[str] = []

    async def pay(amount: int, idempotency_key: str) -> str:
        """Pay."""
        entered.set()
        await gate.wait()
        fired.append(idempotency_key)
        return "paid"

    app = _app(_store(backend, tmp_path, schema), pay)
    cfg = {"thread_id": "t-close", "user_id": "u"}
    turn = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("pay")]}, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 60)
    closing = asyncio.create_task(app.aclose())
    await _until(lambda: app._closed, "aclose began")  # it refuses new runs from here on
    gate.set()  # the tool returns while the graph is closing
    out = await asyncio.wait_for(turn, 60)
    assert out["messages"][-1].text() == "done"
    assert (await asyncio.wait_for(closing, 60))["status"] == "closed"

    store = _store(backend, tmp_path, schema)
    fresh = _app(store, _pay_tools(fired)[0])
    state = await store.aget_state(dict(cfg))
    assert str(state.execution_meta.status) == "completed" and len(fired) == 1, fired
    await fresh.aclose()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.asyncio
async def test_arelease_cancels_a_run_in_flight_and_keeps_what_its_sync_tool_returned(
        tmp_path: Path, backend: str) -> None:
    schema = f"release_{uuid.uuid4().hex[:8]}"
    started, let_go = threading.Event(), threading.Event()
    fired: list[str] = []

    def pay(amount: int, idempotency_key: str) -> str:
        """Pay."""
        started.set()
        let_go.wait(60)
        fired.append(idempotency_key)
        return "paid"

    cp = _store(backend, tmp_path, schema)
    app = _app(cp, pay)
    cfg = {"thread_id": "t-release", "user_id": "u"}
    turn = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("pay")]}, dict(cfg)))
    assert await asyncio.to_thread(started.wait, 60)
    releasing = asyncio.create_task(cp.arelease())
    await _until(lambda: turn.cancelling() > 0 or turn.done(), "arelease cancelled the run")
    let_go.set()  # the tool returns while its run unwinds
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn, 60)
    await asyncio.wait_for(releasing, 60)

    # A new process's view: the call is on record, so finishing the turn does not pay again.
    fresh = _app(_store(backend, tmp_path, schema), _pay_tools(fired)[1])
    out = await asyncio.wait_for(fresh.ainvoke({}, dict(cfg, on_busy="wait", busy_timeout=30)), 60)
    assert out["messages"][-1].text() == "done"
    assert len(fired) == 1, fired
    await fresh.aclose()
