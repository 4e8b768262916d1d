"""A new turn on SQLite while another process is inside a write transaction (frozen there: a
SIGSTOP, a VM pause) for longer than SQLite's busy wait (10 s). The turn's input write takes the
lease in the same transaction; it failed ``STORAGE_TRANSIENT_001`` at the busy wait whatever
``on_busy`` asked for (red-team, session 41). A run told to wait now takes the lease first, which
waits through such locks to its ``busy_timeout``; ``reject`` still answers at the busy wait."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import TransientStorageError
from tenxgraph.storage.checkpointer import SqliteCheckpointer

from tests_py.core_logs import tenxgraph_records
from tests_py.tool_graphs import one_node_graph

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

HOLDER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
c.execute("COMMIT")
"""

FELL_BACK = "taking its lease first"


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with tenxgraph_records(caplog, logging.DEBUG) as records:
        yield records


async def _behind_a_lock(tmp_path: Path, cfg: dict[str, object]) -> tuple[SqliteCheckpointer, Any, subprocess.Popen[str]]:
    """A thread with one turn, then another process inside a write transaction on its file."""
    db = tmp_path / "lock.db"
    cp = SqliteCheckpointer(db)
    app = one_node_graph(cp)
    await app.ainvoke({"messages": [Message.text_message("first")]}, dict(cfg))
    return cp, app, _hold(db)


def _hold(db: Path) -> subprocess.Popen[str]:
    """Another process inside a write transaction on ``db`` until its stdin gets a line."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _release(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    p.wait(timeout=30)


async def test_a_new_turn_told_to_wait_waits_through_another_process_write_lock(
    tmp_path: Path, debug_logs: pytest.LogCaptureFixture
) -> None:
    cfg = {"thread_id": "t-lock", "on_busy": "wait", "busy_timeout": 120}
    _, app, holder = await _behind_a_lock(tmp_path, cfg)
    try:
        run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("second")]}, dict(cfg)))
        # The input write gives up at SQLite's busy wait; the run must then go on waiting for the
        # lease (or end: without the fix, TransientStorageError).
        deadline = time.monotonic() + 120
        while not any(FELL_BACK in r.getMessage() for r in debug_logs.records) and not run.done():
            assert time.monotonic() < deadline, "the run neither fell back to the lease nor ended"
            await asyncio.sleep(0.05)
        if run.done():
            run.result()
            pytest.fail("the run ended while the other process held the database")
    finally:
        _release(holder)
    out = await asyncio.wait_for(run, 120)
    assert [m.text() for m in out["messages"]][-2:] == ["second", "ok"]


async def test_reject_still_answers_at_the_busy_wait(tmp_path: Path) -> None:
    cfg = {"thread_id": "t-lock", "on_busy": "reject"}
    cp, app, holder = await _behind_a_lock(tmp_path, cfg)
    try:
        with pytest.raises(TransientStorageError) as e:
            await app.ainvoke({"messages": [Message.text_message("refused")]}, dict(cfg))
        assert e.value.error_code == "STORAGE_TRANSIENT_001" and "locked" in str(e.value)
    finally:
        _release(holder)
    state = await cp.aget_state({"thread_id": "t-lock"})
    assert [m.text() for m in state.context] == ["first", "ok"]


async def test_a_short_busy_timeout_spent_in_the_input_write_is_not_waited_again(tmp_path: Path) -> None:
    """``busy_timeout=3`` behind a lock held past SQLite's 10 s busy wait: the input write
    already waited past it, so the run answers then, not after a second busy wait in the lease
    take (20 s; red-team, session 41)."""
    cfg = {"thread_id": "t-lock", "on_busy": "wait", "busy_timeout": 3}
    _, app, holder = await _behind_a_lock(tmp_path, cfg)
    try:
        t0 = time.monotonic()
        with pytest.raises(TransientStorageError):
            await app.ainvoke({"messages": [Message.text_message("late")]}, dict(cfg))
        # One busy wait (10 s) and its overhead; two would be 20 s.
        assert time.monotonic() - t0 < 16
    finally:
        _release(holder)
