"""A sync tool cut off by ``node_timeout`` returns later, and its late ledger record fails (the
PostgreSQL connection writing it is terminated: a failover, a restart). The process still holds
the result; a retry in the same process must take it, not fire the tool again (fifth red-team
pass, session 37: a missing row was taken for a deleted thread, and the tool ran twice)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.logs import NOT_RECORDED_EVENT
from tenxgraph.storage.checkpointer import PgCheckpointer

from .pg_sessions import Holder, blocked_by, psql
from .tool_graphs import call, route

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not DSN, reason="needs TENXGRAPH_TEST_PG_DSN (python -m tenxgraph.testing serve ENV)")


def _psql(sql: str) -> str:
    return psql(str(DSN), sql)


class _Seen(logging.Handler):
    def __init__(self, event: str) -> None:
        super().__init__()
        self.event, self.seen = event, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == self.event:
            self.seen.set()


@pytest.mark.asyncio
async def test_a_sync_tool_whose_late_record_failed_is_not_fired_again_by_a_retry() -> None:
    ran: list[int] = []
    release = threading.Event()

    def pay(amount: int) -> str:
        """Pay."""
        ran.append(amount)
        if len(ran) == 1:
            release.wait(60)
        return f"paid {amount}"

    def model(state: AgentState) -> Message:
        if state.context[-1].role == "tool":
            return Message.text_message("done", role="assistant")
        return Message(role="assistant", content=[], tools_calls=[call("c1", "pay", {"amount": 5})])

    schema = f"lrf_{uuid.uuid4().hex[:10]}"
    cp = PgCheckpointer(postgres_dsn=DSN, schema=schema)
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([pay]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=cp)
    cfg = {"thread_id": "t", "node_timeout": 0.5}
    failed = _Seen(NOT_RECORDED_EVENT)
    log = logging.getLogger("tenxgraph")
    log.addHandler(failed)
    locker = Holder(str(DSN))
    try:
        with pytest.raises(BaseException):
            await app.ainvoke({"messages": [Message.text_message("pay 5")]}, dict(cfg))
        # Hold the ledger table, so the late record waits on it; then cut that record's connection.
        holder = int(await locker.ask_async(
            f'BEGIN; LOCK TABLE "{schema}".tool_executions IN ACCESS EXCLUSIVE MODE; SELECT pg_backend_pid();'))
        release.set()
        waiting = await blocked_by(str(DSN), str(holder))
        assert waiting, "the late record never waited on the lock"
        _psql(f"SELECT pg_terminate_backend({waiting})")
        assert await asyncio.to_thread(failed.seen.wait, 60), "the late record did not fail"
    finally:
        locker.close()
        log.removeHandler(failed)
        release.set()
    await asyncio.wait_for(app.ainvoke({}, dict(cfg, node_timeout=60)), 90)
    done = await cp.aget_state(dict(cfg))
    assert ran == [5]
    assert [m.text() for m in done.context if m.role == "tool"] == ["paid 5"]
    await cp.arelease()
