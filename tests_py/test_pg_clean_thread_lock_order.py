"""``aclean_thread`` on Postgres takes the thread's lease row before the thread row, the order a
run's input and step commits lock them in. Its one statement locked the thread row (and, by
cascade, its rows) first and the lease row last, so it could deadlock with a run taking the
thread's lease: a red-team pass (session 21) saw 2 ``STORAGE_001`` "deadlock detected" errors in
8,260 deletes beside running turns. Here the run's side is played by a second session that locks
the lease row, waits until the delete is blocked, then writes the thread row, as
``tenx_put_input`` does. Before the change that second write deadlocked (one of the two aborted);
now the delete waits for the lease and goes on once the other transaction commits."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.postgres_server import find_pg_binary
from tests_py.tool_graphs import one_node_graph


async def _psql_scalar(psql: str, dsn: str, sql: str) -> str:
    p = await asyncio.create_subprocess_exec(psql, dsn, "-Atc", sql, stdout=asyncio.subprocess.PIPE)
    out, _ = await p.communicate()
    return out.decode().strip()


async def _beside_a_lease_take(pg_dsn: str, prefix: str, take_lease: str, lease_mode: str,
                               operation: Callable[[PgCheckpointer], Awaitable[Any]]) -> tuple[PgCheckpointer, str, Any]:
    """The race, played deterministically: a finished thread; a second session (the "run") takes
    its lease row with ``take_lease`` (``{schema}`` and ``{tid}`` filled in), as an input commit
    does before it writes the thread; ``operation`` starts and must block on a lock; then the
    "run" writes the thread row and commits. Returns the open checkpointer (the caller releases
    it), the thread id and what ``operation`` returned. Fails on a deadlock on either side."""
    psql = find_pg_binary("psql")
    tag = uuid.uuid4().hex[:10]
    schema, app_name = f"{prefix}_{tag}", f"{prefix}_{tag}"
    cp = PgCheckpointer(pg_dsn + ("&" if "?" in pg_dsn else "?") + f"application_name={app_name}", schema=schema,
                        enforce_user_isolation=False)
    await cp.asetup()
    tid = "finished:old"
    await one_node_graph(cp).ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid})
    other = await asyncio.create_subprocess_exec(
        psql, pg_dsn, "-v", "ON_ERROR_STOP=1", "-At", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert other.stdin is not None
    other.stdin.write(f"BEGIN;\n{take_lease.format(schema=schema, tid=tid)};\n".encode())
    await other.stdin.drain()
    deadline = time.monotonic() + 30
    while await _psql_scalar(psql, pg_dsn, (
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            f"WHERE c.relname = 'tenx_leases' AND c.relnamespace = '{schema}'::regnamespace "
            f"AND l.mode = '{lease_mode}' AND l.granted")) in ("", "0"):
        assert time.monotonic() < deadline, "the other session never took the lease row"
        await asyncio.sleep(0.02)
    task = asyncio.create_task(operation(cp))
    while await _psql_scalar(psql, pg_dsn, (
            f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app_name}' "
            "AND wait_event_type = 'Lock'")) in ("", "0"):
        assert time.monotonic() < deadline and not task.done(), (
            "the operation never waited for a lock", task.done() and task.exception())
        await asyncio.sleep(0.02)
    # The "run" now writes the thread row, and commits.
    other.stdin.write(f"UPDATE {schema}.threads SET updated_at = NOW() WHERE thread_id = '{tid}';\nCOMMIT;\n"
                      .encode())
    other.stdin.close()
    out, err = await asyncio.wait_for(other.communicate(), 30)
    assert other.returncode == 0 and b"deadlock" not in err, (out, err)
    return cp, tid, await asyncio.wait_for(task, 30)


@pytest.mark.asyncio
async def test_a_delete_beside_a_lease_take_waits_instead_of_deadlocking(pg_dsn: str) -> None:
    cp, tid, _ = await _beside_a_lease_take(
        pg_dsn, "lock_order", "SELECT 'locked' FROM {schema}.tenx_leases WHERE thread_id = '{tid}' FOR UPDATE",
        "RowShareLock", lambda cp: cp.aclean_thread({"thread_id": "finished:old"}))
    try:
        assert await cp.aget_thread({"thread_id": tid}) is None
        assert await cp.aget_lease({"thread_id": tid}) is None
    finally:
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_prune_beside_a_run_taking_the_lease_waits_and_keeps_the_thread(pg_dsn: str) -> None:
    """``aprune``'s thread rule, the same race: its batch locked a finished thread's row (and its
    rows by cascade) before the thread's lease row, a run's input commit the lease row first. The
    "run" here takes the lease as a new turn does (held, unexpired). Before: "deadlock detected",
    one side aborted (a user's turn, or the prune). Now the prune waits for the lease row, sees it
    held by the run that committed meanwhile, and leaves that thread alone."""
    cp, tid, report = await _beside_a_lease_take(
        pg_dsn, "prune_order",
        "UPDATE {schema}.tenx_leases SET released = FALSE, token = token + 1, "
        "expires_at = clock_timestamp() + interval '5 minutes' WHERE thread_id = '{tid}'",
        "RowExclusiveLock", lambda cp: cp.aprune(finished_older_than=0))
    try:
        assert report["threads"] == 0, report
        assert await cp.aget_thread({"thread_id": tid}) is not None, "a thread whose lease a run took was pruned"
        lease = await cp.aget_lease({"thread_id": tid})
        assert lease is not None and not lease["released"], lease
    finally:
        await cp.arelease()
