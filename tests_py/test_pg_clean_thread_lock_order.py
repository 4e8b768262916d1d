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


async def _prune_beside_an_open_input_commit(pg_dsn: str, prefix: str, lease_sql: str,
                                            drop_lease_row: bool) -> None:
    """A finished thread; a second session (the "run") does what an input commit does, in one
    open transaction: ``lease_sql`` on the thread's lease row, then the thread row. A prune of
    finished threads runs meanwhile, then the "run" commits. The prune must neither deadlock nor
    wait for the run, nor delete the thread: it was finished in the prune's snapshot, and the run
    made it live again."""
    psql = find_pg_binary("psql")
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    cp = PgCheckpointer(pg_dsn, schema=schema, enforce_user_isolation=False)
    await cp.asetup()
    try:
        tid = "finished:old"
        await one_node_graph(cp).ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid})
        if drop_lease_row:  # as every thread 10xGraph 0.10 wrote has none
            await _psql_scalar(psql, pg_dsn, f"DELETE FROM {schema}.tenx_leases WHERE thread_id = '{tid}'")
        other = await asyncio.create_subprocess_exec(
            psql, pg_dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert other.stdin is not None and other.stdout is not None
        other.stdin.write((f"BEGIN;\n{lease_sql.format(schema=schema, tid=tid)};\n"
                           f"UPDATE {schema}.threads SET updated_at = NOW() WHERE thread_id = '{tid}';\n"
                           "SELECT 'held';\n").encode())
        await other.stdin.drain()
        assert (await asyncio.wait_for(other.stdout.readline(), 30)).strip() == b"held"
        prune = asyncio.create_task(cp.aprune(finished_older_than=0))
        done, _ = await asyncio.wait({prune}, timeout=10)
        finished_while_held = bool(done)
        other.stdin.write(b"COMMIT;\n")
        other.stdin.close()
        out, err = await asyncio.wait_for(other.communicate(), 30)
        assert other.returncode == 0 and b"deadlock" not in err, (out, err)
        report = await asyncio.wait_for(prune, 30)
        assert await cp.aget_thread({"thread_id": tid}) is not None, ("a thread a run took up was pruned", report)
        assert report["threads"] == 0, report
        assert finished_while_held, "the prune waited for the run's open transaction"
        lease = await cp.aget_lease({"thread_id": tid})
        assert lease is not None and not lease["released"], lease
    finally:
        await cp.arelease()


_TAKE_LEASE = ("UPDATE {schema}.tenx_leases SET released = FALSE, token = token + 1, "
               "expires_at = clock_timestamp() + interval '5 minutes' WHERE thread_id = '{tid}'")
_NEW_LEASE = ("INSERT INTO {schema}.tenx_leases (thread_id, token, holder, host, pid, pid_start, expires_at, released) "
              "VALUES ('{tid}', 999999, 'run', 'host', 1, 1, clock_timestamp() + interval '5 minutes', FALSE)")


@pytest.mark.asyncio
async def test_a_prune_beside_a_run_taking_the_lease_keeps_the_thread_without_deadlock(pg_dsn: str) -> None:
    """``aprune``'s thread rule, the race of the delete above: its batch locked a finished
    thread's row (and its rows by cascade) before the lease row, a run's input commit the lease row
    first: "deadlock detected", one side aborted (a user's turn, or the prune). Now the batch
    locks lease rows first and skips rows another session holds."""
    await _prune_beside_an_open_input_commit(pg_dsn, "prune_order", _TAKE_LEASE, drop_lease_row=False)


@pytest.mark.asyncio
async def test_a_prune_beside_the_first_run_of_a_thread_without_a_lease_row_keeps_it(pg_dsn: str) -> None:
    """A thread without a lease row (10xGraph wrote it, or it was cleaned and re-put): the run's
    input commit inserts the row, which no snapshot of the prune saw. The batch waited for the
    thread row, re-checked only its age, and deleted the thread under the run: its tool's result
    was then refused as fenced and the turn failed (red-team, session 22: 3 of 200 turns on such
    threads under a looping prune). Now a thread row another session holds is skipped, and the
    locked ones are judged again on a fresh snapshot before they go."""
    await _prune_beside_an_open_input_commit(pg_dsn, "prune_new_lease", _NEW_LEASE, drop_lease_row=True)
