"""The statement gate (src/store/postgres/gate.rs) under row-lock waits: statements waiting for
locks keep their permits, and a gate lowered to half the pool by earlier slow statements (a
statement slow for its own reasons counts like server queueing) then kept every other thread off
the idle half of the pool: their turns failed with TransientStorageError ("no connection of the
pool became free") after pool_config["timeout"]. Found by a red-team pass in session 21; a
statement now waits at most the gate's patience (50 ms) for a permit. The control runs the same
scenario on a gate at the pool's size. Its own schema: the table lock must not reach other tests."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid

import pytest

from tenxgraph import Message
from tenxgraph.storage.checkpointer import PgCheckpointer

from tests_py.tool_graphs import one_node_graph

try:
    from tenxgraph.testing.postgres_server import find_pg_binary

    PSQL = find_pg_binary("psql")
except Exception:  # noqa: BLE001
    PSQL = shutil.which("psql") or "psql"

POOL = 10


def _psql(dsn: str, sql: str) -> str:
    return subprocess.run([PSQL, dsn, "-Atc", sql], capture_output=True, text=True, timeout=60).stdout.strip()


async def _hold(dsn: str, lock_sql: str, secs: float, ready_sql: str) -> asyncio.subprocess.Process:
    """Another session takes a lock and keeps it `secs` seconds; returns once it holds it."""
    p = await asyncio.create_subprocess_exec(PSQL, dsn, "-c", f"BEGIN; {lock_sql}; SELECT pg_sleep({secs}); COMMIT;",
                                             stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while _psql(dsn, ready_sql) in ("", "0"):
        assert time.monotonic() < deadline, "the other session never took its lock"
        await asyncio.sleep(0.02)
    return p


def _waiting_on_locks(dsn: str, app: str) -> int:
    return int(_psql(dsn, f"SELECT count(*) FROM pg_stat_activity WHERE application_name='{app}' AND wait_event_type='Lock'") or 0)


async def _scenario(dsn: str, lower_first: bool) -> tuple[list[object], int, int]:
    # A schema and an application name of its own: the two tests may run at once (xdist).
    tag = uuid.uuid4().hex[:10]
    schema, app_name = f"gate_locks_{tag}", f"gate_starve_{tag}"
    app_dsn = dsn + ("&" if "?" in dsn else "?") + f"application_name={app_name}"
    cp = PgCheckpointer(app_dsn, schema=schema, enforce_user_isolation=False, pool_config={"max_size": POOL, "timeout": 3, "command_timeout": 20, "lock_timeout": 8})
    await cp.asetup()
    app = one_node_graph(cp)
    hot = [f"hot-{i}" for i in range(POOL // 2)]
    try:
        for t in hot:
            await app.ainvoke({"messages": [Message.text_message(t)]}, {"thread_id": t})
        # A quiet spell first (one caller, quick statements): the gate's latency base.
        for i in range(100):
            await cp.aget_state({"thread_id": hot[i % len(hot)]})
        if lower_first:
            # Earlier episodes of statements that are slow for their own reasons: a dozen reads
            # behind a 0.5 s table lock, a few times (as a migration, a VACUUM FULL or a DDL would).
            # Every window of 32 statements then holds some slow ones: each lowers the limit by one.
            for _ in range(16):
                p = await _hold(dsn, f"LOCK TABLE {schema}.states IN ACCESS EXCLUSIVE MODE", 0.5,
                                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                                f"WHERE c.relname = 'states' AND c.relnamespace = '{schema}'::regnamespace AND l.mode = 'AccessExclusiveLock' AND l.granted")
                await asyncio.gather(*[cp.aget_state({"thread_id": f"reader-{i}"}) for i in range(12)])
                await p.wait()
        # Now another session holds half the pool's worth of thread rows for 10 s; those threads'
        # new turns wait for the row locks at the server (up to the 20 s statement deadline).
        ids = ",".join(f"'{t}'" for t in hot)
        p = await _hold(dsn, f"SELECT 1 FROM {schema}.threads WHERE thread_id IN ({ids}) FOR UPDATE", 10,
                        f"SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%{schema}.threads%FOR UPDATE%pg_sleep%' AND state = 'active' "
                        "AND pid <> pg_backend_pid()")
        hot_turns = [asyncio.create_task(app.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": t}))
                     for t in hot]
        deadline = time.monotonic() + 30
        while _waiting_on_locks(dsn, app_name) < len(hot):
            assert time.monotonic() < deadline, ("the hot turns never reached their row locks", _psql(
                dsn, "SELECT application_name, state, wait_event_type, wait_event, left(query, 60) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"),
                [t.done() and repr(t.exception())[:200] for t in hot_turns])
            await asyncio.sleep(0.05)
        idle = int(_psql(dsn, f"SELECT count(*) FROM pg_stat_activity WHERE application_name='{app_name}' AND state='idle'") or 0)
        blocked = _waiting_on_locks(dsn, app_name)
        # Turns of unrelated, new threads, while half the pool's connections are free.
        others = await asyncio.gather(
            *[asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": f"other-{i}"}), 30)
              for i in range(10)],
            return_exceptions=True,
        )
        await p.wait()
        await asyncio.wait_for(asyncio.gather(*hot_turns, return_exceptions=True), 60)
        return others, blocked, idle
    finally:
        await cp.arelease()


@pytest.mark.asyncio
async def test_control_a_full_gate_lets_unrelated_threads_through(pg_dsn: str) -> None:
    others, blocked, _ = await _scenario(pg_dsn, lower_first=False)
    assert blocked == POOL // 2
    assert all(isinstance(r, dict) for r in others), others


@pytest.mark.asyncio
async def test_unrelated_threads_run_while_half_the_pool_waits_for_row_locks(pg_dsn: str) -> None:
    others, blocked, idle = await _scenario(pg_dsn, lower_first=True)
    assert blocked == POOL // 2
    failed = [r for r in others if not isinstance(r, dict)]
    assert not failed, (
        f"{len(failed)} of {len(others)} turns of unrelated threads failed while {blocked} statements waited for "
        f"row locks and {idle} of the pool's {POOL} connections were idle: {failed[0]!r}"
    )
