"""Sync (``def``) tools past their deadline. Python cannot stop a thread: a sync tool cut off by
stop(), node_timeout or tool_timeout runs on. The runtime records its late result in the ledger,
and a resume in the same process waits for the call still running instead of starting it again.

Every tool here blocks on a threading.Event the test sets; nothing waits on a thin sleep."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.exceptions import NodeTimeoutError
from tenxgraph.utils.tool_decorator import tool

from .tool_graphs import call, tool_graph, tool_texts

WAIT = 30.0  # generous: CI is a loaded 2-core machine


class Gate:
    """A sync tool that blocks until released; counts its starts and its finished side effects."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.second_start = threading.Event()
        self.release = threading.Event()
        self.starts = 0
        self.effects = 0
        self._lock = threading.Lock()

    def body(self) -> str:
        with self._lock:
            self.starts += 1
            if self.starts > 1:
                self.second_start.set()
        self.started.set()
        if not self.release.wait(WAIT):
            raise RuntimeError("the test never released the tool")
        with self._lock:
            self.effects += 1
        return "charged"


def idempotent_tool(gate: Gate) -> Any:
    def charge() -> str:
        """Charges the card."""
        return gate.body()

    return charge


def at_most_once_tool(gate: Gate) -> Any:
    @tool(side_effects="at_most_once")
    def charge() -> str:
        """Charges the card."""
        return gate.body()

    return charge


class EventSeen(logging.Handler):
    """Sets an event when a tenxgraph log record with the given ``event`` field is emitted."""

    def __init__(self, event: str) -> None:
        super().__init__(logging.DEBUG)
        self.event = event
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == self.event:
            self.seen.set()


@pytest.fixture
def joined():
    handler = EventSeen("sync_tool_joined")
    logger = logging.getLogger("tenxgraph")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler.seen
    logger.removeHandler(handler)
    logger.setLevel(old_level)


async def first_of(*events: threading.Event, timeout: float = WAIT) -> None:
    """Returns once any of ``events`` is set; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not any(e.is_set() for e in events):
        assert time.monotonic() < deadline, "timed out waiting for the tool or the resume"
        await asyncio.sleep(0.01)


async def ledger_key(checkpointer, cfg: dict[str, Any]) -> str:
    state = await checkpointer.aget_state(dict(cfg))
    ask = next(m for m in state.context if m.tools_calls)
    return f"{ask.message_id}:c1"


async def until_completed(checkpointer, cfg: dict[str, Any], key: str) -> None:
    deadline = time.monotonic() + WAIT
    while await checkpointer.aget_tool_status(dict(cfg), key) != "completed":
        assert time.monotonic() < deadline, "the late result was never recorded"
        await asyncio.sleep(0.02)


def user(text: str) -> Message:
    return Message.text_message(text)


async def stop_mid_tool(app, cfg: dict[str, Any], gate: Gate) -> None:
    """Starts a run, waits until the tool runs, stops the run: it must return while the tool's
    thread is still blocked."""
    run = asyncio.create_task(app.ainvoke({"messages": [user("pay")]}, dict(cfg), "full"))
    await first_of(gate.started)
    assert (await app.astop(dict(cfg)))["running"] is True
    r = await asyncio.wait_for(run, WAIT)
    assert r["state"].execution_meta.interrupt_reason == "stop_requested"
    assert gate.effects == 0, "the run returned while the tool still runs"


@pytest.mark.asyncio
@pytest.mark.parametrize("make_tool", [idempotent_tool, at_most_once_tool], ids=["idempotent", "at-most-once"])
async def test_stop_mid_sync_tool_then_resume_waits_for_the_running_call(checkpointer, make_thread, joined, make_tool) -> None:
    gate = Gate()
    app = tool_graph(AgentState, [make_tool(gate)], [[call("c1", "charge")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("stopsync")}
    try:
        await stop_mid_tool(app, cfg, gate)
        resume = asyncio.create_task(app.ainvoke({}, dict(cfg)))
        await first_of(joined, gate.second_start)
        assert not gate.second_start.is_set(), "the resume started the tool a second time"
        gate.release.set()
        r = await asyncio.wait_for(resume, WAIT)
    finally:
        gate.release.set()
    assert tool_texts(r["messages"]) == {"c1": "charged"}
    assert r["messages"][-1].text() == "done"
    assert (gate.starts, gate.effects) == (1, 1)
    assert await checkpointer.aget_tool_status(dict(cfg), await ledger_key(checkpointer, cfg)) == "completed"


@pytest.mark.asyncio
async def test_node_timeout_cut_then_resume_replays_the_late_result(checkpointer, make_thread) -> None:
    gate = Gate()
    app = tool_graph(AgentState, [idempotent_tool(gate)], [[call("c1", "charge")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("nodetimeout"), "node_timeout": 0.5, "tool_timeout": None}
    try:
        with pytest.raises(NodeTimeoutError) as e:
            await asyncio.wait_for(app.ainvoke({"messages": [user("pay")]}, dict(cfg)), WAIT)
        assert e.value.error_code == "NODE_TIMEOUT_001"
        assert gate.effects == 0
        key = await ledger_key(checkpointer, cfg)
        # A node of idempotent calls writes no intent row (tests_py/test_intent_rows.py): the
        # ledger knows nothing of the call until its late result is recorded.
        assert await checkpointer.aget_tool_status(dict(cfg), key) is None
    finally:
        gate.release.set()
    await until_completed(checkpointer, cfg, key)
    record = await checkpointer.aget_tool_result(dict(cfg), key)
    assert record["value"]["content"][0]["output"] == "charged"
    r = await app.ainvoke({}, {"thread_id": cfg["thread_id"]})
    assert tool_texts(r["messages"]) == {"c1": "charged"}
    assert (gate.starts, gate.effects) == (1, 1), "the resume answered from the ledger"


@pytest.mark.asyncio
async def test_tool_timeout_tells_the_model_the_thread_runs_on_and_records_it(checkpointer, make_thread) -> None:
    gate = Gate()
    app = tool_graph(AgentState, [idempotent_tool(gate)], [[call("c1", "charge")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("tooltimeout"), "tool_timeout": 0.3}
    try:
        r = await asyncio.wait_for(app.ainvoke({"messages": [user("pay")]}, dict(cfg)), WAIT)
    finally:
        gate.release.set()
    text = tool_texts(r["messages"])["c1"]
    assert "NODE_TIMEOUT_002" in text and "cannot be cancelled" in text and "was cancelled" not in text
    await until_completed(checkpointer, cfg, await ledger_key(checkpointer, cfg))
    assert (gate.starts, gate.effects) == (1, 1)


@pytest.mark.asyncio
async def test_resume_waits_for_the_running_call_only_up_to_its_own_tool_timeout(checkpointer, make_thread, joined) -> None:
    gate = Gate()
    app = tool_graph(AgentState, [idempotent_tool(gate)], [[call("c1", "charge")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("jointimeout")}
    try:
        await stop_mid_tool(app, cfg, gate)
        r = await asyncio.wait_for(app.ainvoke({}, dict(cfg, tool_timeout=0.3)), WAIT)
        assert joined.is_set() and not gate.second_start.is_set()
        assert "NODE_TIMEOUT_002" in tool_texts(r["messages"])["c1"]
        assert gate.effects == 0
    finally:
        gate.release.set()
    await until_completed(checkpointer, cfg, await ledger_key(checkpointer, cfg))
    assert (gate.starts, gate.effects) == (1, 1)


def test_sync_invoke_returns_at_its_deadline_while_the_tool_thread_runs_on(tmp_path, make_thread) -> None:
    """`invoke` runs its own event loop; closing that loop must not wait for the tool's thread."""
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    gate = Gate()
    checkpointer = SqliteCheckpointer(tmp_path / "cp.db")
    app = tool_graph(AgentState, [idempotent_tool(gate)], [[call("c1", "charge")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("syncinvoke"), "node_timeout": 0.5, "tool_timeout": None}
    try:
        t0 = time.monotonic()
        with pytest.raises(NodeTimeoutError):
            app.invoke({"messages": [user("pay")]}, dict(cfg))
        elapsed = time.monotonic() - t0
        assert gate.started.is_set() and gate.effects == 0
        assert elapsed < WAIT / 2, f"invoke waited {elapsed:.1f}s for the tool's thread"
    finally:
        gate.release.set()

    async def resume() -> dict[str, Any]:
        await until_completed(checkpointer, cfg, await ledger_key(checkpointer, cfg))
        return await app.ainvoke({}, {"thread_id": cfg["thread_id"]})

    r = asyncio.run(resume())
    assert tool_texts(r["messages"]) == {"c1": "charged"}
    assert (gate.starts, gate.effects) == (1, 1)


@pytest.mark.asyncio
async def test_a_late_result_does_not_bring_back_a_thread_deleted_meanwhile(checkpointer, make_thread) -> None:
    """A sync tool past its tool_timeout finishes after its thread was deleted (aclean_thread). Its
    late result was written unfenced and created the thread again (alist_threads listed it, with
    that ledger row and no state). Now the late write needs its thread: it is refused and logged as
    not recorded, and the thread stays deleted."""
    gate = Gate()
    refused = EventSeen("tool_result_not_recorded")
    logger = logging.getLogger("tenxgraph")
    logger.addHandler(refused)
    try:
        app = tool_graph(AgentState, [idempotent_tool(gate)], [[call("c1", "charge")]], checkpointer=checkpointer)
        cfg = {"thread_id": make_thread("late-after-delete"), "tool_timeout": 0.3}
        try:
            r = await asyncio.wait_for(app.ainvoke({"messages": [user("pay")]}, dict(cfg)), WAIT)
            assert "NODE_TIMEOUT_002" in tool_texts(r["messages"])["c1"]
            await checkpointer.aclean_thread(dict(cfg))
        finally:
            gate.release.set()
        await first_of(refused.seen)
        assert gate.effects == 1
        assert await checkpointer.aget_thread(dict(cfg)) is None
        assert cfg["thread_id"] not in [str(t.thread_id) for t in await checkpointer.alist_threads({})]
        assert await checkpointer.aget_state(dict(cfg)) is None
    finally:
        logger.removeHandler(refused)
