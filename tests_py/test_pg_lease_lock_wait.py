"""A run told to wait for a busy thread (`on_busy="wait"` / `"interrupt"`) waits through a lock
on the thread's lease row, to its own `busy_timeout`. Another session holding that row (a worker
frozen inside a step's transaction, an operator's versioned `aput_state` between its lock and
its commit) made the lease take fail at the pool's `lock_timeout` (5 s) with
`TransientStorageError` whatever the caller asked for (red-team, session 41). `on_busy="reject"`
still answers at the lock timeout, typed; so does a wait whose `busy_timeout` ran out."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import TransientStorageError
from tenxgraph.storage.checkpointer import PgCheckpointer

from tests_py.tool_graphs import one_node_graph

try:
    from tenxgraph.testing.postgres_server import find_pg_binary

    PSQL = find_pg_binary("psql")
except Exception:  # noqa: BLE001
    PSQL = shutil.which("psql") or "psql"

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

LOCK_TIMEOUT = 0.3


def _psql(dsn: str, sql: str) -> str:
    return subprocess.run([PSQL, dsn, "-Atc", sql], capture_output=True, text=True, timeout=60).stdout.strip()


async def _lock_lease_row(dsn: str, thread: str, tag: str) -> asyncio.subprocess.Process:
    """Another session holds the thread's lease row (FOR UPDATE) until it is ended; returns once
    it holds it."""
    p = await asyncio.create_subprocess_exec(
        PSQL, dsn + ("&" if "?" in dsn else "?") + f"application_name=locker_{tag}", "-c",
        f"BEGIN; SELECT 1 FROM tenx_leases WHERE thread_id = '{thread}' FOR UPDATE; SELECT pg_sleep(120); COMMIT;",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while _psql(dsn, f"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'locker_{tag}' "
                     "AND query LIKE '%pg_sleep%' AND state = 'active'") in ("", "0"):
        assert time.monotonic() < deadline, "the other session never took its lock"
        await asyncio.sleep(0.02)
    return p


async def _release(dsn: str, locker: asyncio.subprocess.Process, tag: str) -> None:
    """Ends the locking session at the server (a killed psql leaves its backend in pg_sleep,
    holding the lock, until the sleep ends)."""
    _psql(dsn, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'locker_{tag}'")
    locker.kill()
    await locker.wait()


def _lock_waits(dsn: str, app: str) -> set[str]:
    """The start times of the statements of `app` now waiting on a lock (each new attempt of the
    lease take is a new statement)."""
    out = _psql(dsn, f"SELECT query_start FROM pg_stat_activity WHERE application_name = '{app}' "
                     "AND wait_event_type = 'Lock'")
    return {line for line in out.splitlines() if line}


async def _setup(dsn: str) -> tuple[Any, str, str, str]:
    tag = uuid.uuid4().hex[:10]
    app_name = f"lockwait_{tag}"
    cp = PgCheckpointer(dsn + ("&" if "?" in dsn else "?") + f"application_name={app_name}",
                        pool_config={"lock_timeout": LOCK_TIMEOUT})
    # A review gate before the model: the first turn leaves the thread paused, and `{}` resumes
    # it through the lease take alone (a new turn's input takes the lease in its own write, whose
    # lock waits are bounded by the statement deadline instead).
    app = one_node_graph(cp, interrupt_before=["model"])
    thread = f"lockwait:{tag}"
    await app.ainvoke({"messages": [Message.text_message("first")]}, {"thread_id": thread})
    assert _psql(dsn, f"SELECT count(*) FROM tenx_leases WHERE thread_id = '{thread}'") == "1"
    return app, thread, app_name, tag


@pytest.mark.parametrize("on_busy", ["wait", "interrupt"])
async def test_a_waiting_run_waits_through_a_lock_on_the_lease_row(pg_dsn: str, on_busy: str) -> None:
    app, thread, app_name, tag = await _setup(pg_dsn)
    locker = await _lock_lease_row(pg_dsn, thread, tag)
    try:
        run = asyncio.create_task(app.ainvoke({}, {"thread_id": thread, "on_busy": on_busy, "busy_timeout": 60}))
        # The lease take waits on the row, times out at lock_timeout, and must try again: two
        # distinct waiting statements seen (or the run ended, which without the fix it does with
        # TransientStorageError at the first timeout).
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 2 and not run.done():
            assert time.monotonic() < deadline, "the run neither waited again nor ended"
            seen |= _lock_waits(pg_dsn, app_name)
            await asyncio.sleep(0.01)
        if run.done():
            run.result()  # raises what the run raised
            pytest.fail("the run ended while the lease row was still locked")
    finally:
        await _release(pg_dsn, locker, tag)
    out = await asyncio.wait_for(run, 60)
    assert [m.text() for m in out["messages"]][-2:] == ["first", "ok"]


async def test_reject_and_a_spent_busy_timeout_still_answer_typed(pg_dsn: str) -> None:
    app, thread, _, tag = await _setup(pg_dsn)
    locker = await _lock_lease_row(pg_dsn, thread, tag)
    try:
        for cfg in ({"on_busy": "reject"}, {"on_busy": "wait", "busy_timeout": 1.0}):
            t0 = time.monotonic()
            with pytest.raises(TransientStorageError) as e:
                await app.ainvoke({}, {"thread_id": thread, **cfg})
            assert e.value.error_code == "STORAGE_TRANSIENT_001" and "lock_timeout" in str(e.value)
            assert time.monotonic() - t0 < 30
    finally:
        await _release(pg_dsn, locker, tag)
    # Nothing ran for the refused resumes: the thread is still paused before the model.
    assert _psql(pg_dsn, f"SELECT count(*) FROM messages WHERE thread_id = '{thread}'") == "1"
