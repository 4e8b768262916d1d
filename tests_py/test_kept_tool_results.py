"""Tool results that could not be recorded, kept by the store for the thread's next attempt in
the process (src/store/unrecorded.rs), and the ledger reads next to a refused write. Found by a
red-team of session 28's first version of the feature (each test failed on it)."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import TransientStorageError
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils import tool

from tests_py.one_tool_graph import tool_calls_graph


def _tool_texts(messages) -> list[str]:
    return [b.output for m in messages if m.role == "tool" for b in m.content if hasattr(b, "output")]


@pytest.mark.asyncio
@pytest.mark.parametrize("side_effects", ["idempotent", "at_most_once"])
async def test_a_thread_deleted_while_its_tool_runs_is_not_answered_with_that_result_when_made_again(
    checkpointer, make_thread, side_effects: str
) -> None:
    runs: list[int] = []
    entered, release = asyncio.Event(), asyncio.Event()

    @tool(side_effects=side_effects)
    async def pay(amount: int) -> str:
        """Pay an amount."""
        runs.append(amount)
        if len(runs) == 1:
            entered.set()
            await release.wait()
        return f"paid, run {len(runs)}"

    app = tool_calls_graph(checkpointer, [pay], [("pay", {"amount": 5})])
    config = {"thread_id": make_thread("deleted")}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config))
    await asyncio.wait_for(entered.wait(), 30)
    await checkpointer.aclean_thread(config)
    release.set()
    with pytest.raises(Exception):  # the run lost its thread (LeaseLostError, or a conflict)
        await asyncio.wait_for(first, 30)

    # The same id, the same user message: the same ledger keys, a new thread.
    result = await asyncio.wait_for(
        app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config), 30)
    assert runs == [5, 5], "the new thread's call runs"
    assert _tool_texts(result["messages"]) == ["paid, run 2"]


@pytest.fixture
def refusing_database(tenx_postgres):
    """A database whose ledger, state and message writes are refused with SQLSTATE 25006 (what a
    read-only server answers) while ``rt_flag.v`` says so: 'all', or 'ledger' (ledger writes only).
    The lease table is never refused."""
    name = f"tenx_kept_{uuid.uuid4().hex[:12]}"
    dsn = tenx_postgres.create_database(name)
    yield name, dsn
    tenx_postgres.drop_database(name)


_REFUSING = """
CREATE TABLE rt_flag (v text); INSERT INTO rt_flag VALUES ('off');
CREATE FUNCTION rt_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  IF (SELECT v FROM rt_flag) = 'all' OR ((SELECT v FROM rt_flag) = 'ledger' AND TG_TABLE_NAME = 'tool_executions') THEN
    RAISE EXCEPTION 'cannot execute % in a read-only transaction', TG_OP USING ERRCODE = '25006';
  END IF;
  RETURN NEW; END $$;
CREATE TRIGGER rt_refuse_ledger BEFORE INSERT OR UPDATE ON tool_executions FOR EACH ROW EXECUTE FUNCTION rt_refuse();
CREATE TRIGGER rt_refuse_states BEFORE INSERT OR UPDATE ON states FOR EACH ROW EXECUTE FUNCTION rt_refuse();
CREATE TRIGGER rt_refuse_messages BEFORE INSERT OR UPDATE ON messages FOR EACH ROW EXECUTE FUNCTION rt_refuse();
"""


@pytest.mark.asyncio
async def test_a_refused_intent_write_still_replays_what_the_ledger_holds(tenx_postgres, refusing_database) -> None:
    """PostgreSQL writes a node's intents and reads its ledger in one statement: a refused write
    lost the read, so a recorded at-most-once call was answered "not run" and a recorded
    idempotent one ran again."""
    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    runs: collections.Counter[str] = collections.Counter()
    both_recorded = asyncio.Event()

    @tool(side_effects="at_most_once")
    async def charge(x: int) -> str:
        """Charge once."""
        runs["charge"] += 1
        return "charged"

    @tool
    async def notify(x: int) -> str:
        """Notify (idempotent)."""
        runs["notify"] += 1
        return "notified"

    @tool
    async def slow(x: int) -> str:
        """Returns last, once the server refuses everything."""
        runs["slow"] += 1
        await asyncio.wait_for(both_recorded.wait(), 30)
        await asyncio.to_thread(tenx_postgres.psql, "UPDATE rt_flag SET v = 'all'", dbname=name)
        return "slow done"

    app = tool_calls_graph(cp, [charge, notify, slow], [("charge", {"x": 1}), ("notify", {"x": 2}), ("slow", {"x": 3})])
    config = {"thread_id": "t-intents"}

    async def watch_ledger() -> None:  # charge and notify recorded before slow returns
        while True:
            rows = await asyncio.to_thread(
                tenx_postgres.psql,
                "SELECT count(*) FROM tool_executions WHERE result->>'__kind__' IS DISTINCT FROM 'started'",
                dbname=name)
            if int(rows.strip()) >= 2:
                both_recorded.set()
                return
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_ledger())
    try:
        with pytest.raises(TransientStorageError):
            await asyncio.wait_for(
                app.ainvoke({"messages": [Message.text_message("go", message_id="u-1")]}, config), 60)
        await watcher
        # Only the ledger refuses now: the resume's intent write fails, its read must not.
        tenx_postgres.psql("UPDATE rt_flag SET v = 'ledger'", dbname=name)
        result = await asyncio.wait_for(app.ainvoke({}, config), 60)
        texts = _tool_texts(result["messages"])
        assert texts == ["charged", "notified", "slow done"], texts
        assert runs == {"charge": 1, "notify": 1, "slow": 1}, runs
    finally:
        watcher.cancel()
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_result_kept_by_a_turn_that_then_completed_is_not_replayed_into_a_thread_made_again(
    tenx_postgres, refusing_database
) -> None:
    """Only the ledger refuses: the tools' rows are kept, the step is written without them and the
    turn completes. The thread is pruned and made again with the same ids: its calls run (a kept
    result outlived its turn and answered the new thread's call, the helper's 4 of 4)."""
    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING + "UPDATE rt_flag SET v = 'ledger';", dbname=name)
    runs: list[int] = []

    @tool
    async def pay(amount: int) -> str:
        """Pay an amount."""
        runs.append(amount)
        return f"paid, run {len(runs)}"

    # One asking message id for every turn: the new thread's call has the old one's ledger key.
    app = tool_calls_graph(cp, [pay], [("pay", {"amount": 5})], asking_id="a-fixed")
    config = {"thread_id": "t-pruned"}
    try:
        result = await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config)
        assert _tool_texts(result["messages"]) == ["paid, run 1"]
        tenx_postgres.psql("UPDATE rt_flag SET v = 'off'", dbname=name)
        pruned = await cp.aprune(finished_older_than=0)
        assert pruned["threads"] == 1, pruned
        assert await cp.aget_state(config) is None

        result = await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-2")]}, config)
        assert _tool_texts(result["messages"]) == ["paid, run 2"]
        assert runs == [5, 5]
    finally:
        await cp.arelease()


async def _keep_a_result(tenx_postgres, name: str, cp: PgCheckpointer, side_effects: str, runs: list[int],
                         thread_id: str) -> Any:
    """A turn whose tool returns once the server refuses every write: its result is kept in this
    process's memory only, and the turn fails. The server is writable again afterwards."""

    @tool(side_effects=side_effects)
    async def pay(amount: int) -> str:
        """Pay an amount."""
        runs.append(amount)
        await asyncio.to_thread(tenx_postgres.psql, "UPDATE rt_flag SET v = 'all'", dbname=name)
        return f"paid, run {len(runs)}"

    app = tool_calls_graph(cp, [pay], [("pay", {"amount": 5})])
    with pytest.raises(TransientStorageError):
        await asyncio.wait_for(
            app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, {"thread_id": thread_id}), 60)
    tenx_postgres.psql("UPDATE rt_flag SET v = 'off'", dbname=name)
    return pay


@pytest.mark.asyncio
@pytest.mark.parametrize("side_effects", ["idempotent", "at_most_once"])
async def test_results_kept_in_memory_are_recorded_when_the_graph_closes(
    tenx_postgres, refusing_database, side_effects: str
) -> None:
    """Kept results lived only until the process ended: a resume in another process ran the
    idempotent call again, and answered the at-most-once one "outcome unknown", although the
    server was writable again when the process closed its graph."""
    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    runs: list[int] = []
    pay = await _keep_a_result(tenx_postgres, name, cp, side_effects, runs, "t-close")
    stats = await tool_calls_graph(cp, [pay], [("pay", {"amount": 5})]).aclose()
    assert stats["checkpointer"]["status"] == "completed", stats

    # Another process's view: a checkpointer with nothing kept.
    other = PgCheckpointer(dsn, pool_config={"max_size": 4})
    try:
        result = await asyncio.wait_for(
            tool_calls_graph(other, [pay], [("pay", {"amount": 5})]).ainvoke({}, {"thread_id": "t-close"}), 60)
        assert runs == [5], "the call ran again"
        assert _tool_texts(result["messages"]) == ["paid, run 1"]
    finally:
        await other.arelease()


@pytest.mark.asyncio
async def test_a_kept_result_of_a_thread_deleted_by_another_process_is_not_recorded_at_close(
    tenx_postgres, refusing_database
) -> None:
    """The last write needs its thread: a thread deleted meanwhile (by another process, which
    cannot drop this one's memory) stays deleted."""
    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    await _keep_a_result(tenx_postgres, name, cp, "idempotent", [], "t-gone")
    tenx_postgres.psql("DELETE FROM tool_executions; DELETE FROM messages; DELETE FROM states; "
                       "DELETE FROM tenx_leases; DELETE FROM threads", dbname=name)
    await cp.arelease()
    left = tenx_postgres.psql("SELECT (SELECT count(*) FROM threads) || ',' || (SELECT count(*) FROM tool_executions)",
                              dbname=name)
    assert left.strip() == "0,0"


class _PsqlByDsn:
    """``psql`` on a DSN, as ``tenx_postgres.psql`` runs it (for a worker process without the fixture)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def psql(self, sql: str, dbname: str) -> None:
        import subprocess

        from tenxgraph.testing.postgres_server import find_pg_binary

        subprocess.run([find_pg_binary("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.dsn, "-c", sql],
                       check=True, capture_output=True, timeout=60)


async def _keep_a_result_and_leave(dsn: str, name: str) -> None:
    """The worker of the test below: keeps a result, and returns without closing anything."""
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    await _keep_a_result(_PsqlByDsn(dsn), name, cp, "idempotent", [], "t-exit")


_WORKER = """
import asyncio, sys
from tests_py.test_kept_tool_results import _keep_a_result_and_leave
asyncio.run(_keep_a_result_and_leave(sys.argv[1], sys.argv[2]))
print("leaving without closing", flush=True)
"""


def test_results_kept_in_memory_are_recorded_when_the_interpreter_exits(tenx_postgres, refusing_database) -> None:
    """A worker that ends without closing its checkpointer (a normal exit, a SIGTERM handled by
    sys.exit) records what it kept as the interpreter exits."""
    import subprocess
    import sys
    from pathlib import Path

    name, dsn = refusing_database
    PgCheckpointer(dsn).setup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", _WORKER, dsn, name], cwd=repo, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "leaving without closing" in done.stdout, done.stdout + done.stderr
    rows = tenx_postgres.psql("SELECT result->>'__kind__' IS DISTINCT FROM 'started' FROM tool_executions",
                              dbname=name)
    assert rows.split() == ["t"], rows


@pytest.mark.asyncio
async def test_results_kept_in_memory_are_recorded_while_the_process_lives(tenx_postgres, refusing_database) -> None:
    """Another worker resumes the thread (its recovery pass, a client's retry sent there) while
    this process, which holds the result, goes on serving: it found no result and answered the
    at-most-once call "outcome unknown" (an idempotent one ran again)."""
    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    runs: list[int] = []
    other = PgCheckpointer(dsn, pool_config={"max_size": 4})
    try:
        pay = await _keep_a_result(tenx_postgres, name, cp, "at_most_once", runs, "t-live")
        recorded = "0"
        for _ in range(600):  # the recorder's first try comes a second after the run ends
            recorded = await asyncio.to_thread(
                tenx_postgres.psql,
                "SELECT count(*) FROM tool_executions WHERE result->>'__kind__' IS DISTINCT FROM 'started'",
                dbname=name)
            if recorded.strip() == "1":
                break
            await asyncio.sleep(0.1)
        assert recorded.strip() == "1", "the kept result was not recorded within 60 s"
        result = await asyncio.wait_for(
            tool_calls_graph(other, [pay], [("pay", {"amount": 5})]).ainvoke({}, {"thread_id": "t-live"}), 60)
        assert runs == [5]
        assert _tool_texts(result["messages"]) == ["paid, run 1"]
    finally:
        await other.arelease()
        await cp.arelease()


async def _until_recorded(tenx_postgres, name: str, count: int) -> None:
    """Waits (at most 60 s) for ``count`` results in the ledger: the recorder's tries come 1, 2,
    4 ... s after the run ends."""
    found = ""
    for _ in range(600):
        found = (await asyncio.to_thread(
            tenx_postgres.psql,
            "SELECT count(*) FROM tool_executions WHERE result->>'__kind__' IS DISTINCT FROM 'started'",
            dbname=name)).strip()
        if found == str(count):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} recorded results expected within 60 s, found {found}")


@pytest.mark.asyncio
@pytest.mark.parametrize("second_user", ["bob", None])
async def test_without_user_isolation_a_result_kept_for_another_user_is_recorded_not_dropped(
    tenx_postgres, refusing_database, second_user: str | None
) -> None:
    """Users not isolated: alice's thread, a turn run as bob (or as nobody). The recorder wrote the
    kept result owner-scoped, was refused as "another user's thread", and dropped it: the next
    attempt in this very process ran the idempotent call again (helper red-team of the recorder)."""
    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4}, enforce_user_isolation=False)
    await cp.asetup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    runs: list[int] = []

    @tool
    async def pay(amount: int) -> str:
        """Pay an amount."""
        runs.append(amount)
        if len(runs) == 2:  # the second turn's call: the server refuses writes as it returns
            await asyncio.to_thread(tenx_postgres.psql, "UPDATE rt_flag SET v = 'all'", dbname=name)
        return f"paid, run {len(runs)}"

    app = tool_calls_graph(cp, [pay], [("pay", {"amount": 5})])
    alice = {"thread_id": "t-shared", "user_id": "alice"}
    other = {"thread_id": "t-shared"} | ({"user_id": second_user} if second_user else {})
    try:
        await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, alice)
        with pytest.raises(TransientStorageError):
            await asyncio.wait_for(
                app.ainvoke({"messages": [Message.text_message("again", message_id="u-2")]}, other), 60)
        tenx_postgres.psql("UPDATE rt_flag SET v = 'off'", dbname=name)
        await _until_recorded(tenx_postgres, name, 2)
        result = await asyncio.wait_for(app.ainvoke({}, other), 60)
        assert len(runs) == 2, "the call ran again"
        assert _tool_texts(result["messages"])[-1] == "paid, run 2"
    finally:
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_result_kept_by_a_cancelled_run_is_recorded_while_the_process_lives(
    tenx_postgres, refusing_database, caplog
) -> None:
    """The recorder started only when a run returned: a run its caller cancelled (a timeout, a
    client gone) left its kept result unwritten, and a resume elsewhere ran the call again."""
    import logging

    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    other = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    runs = collections.Counter[str]()
    never = asyncio.Event()
    caplog.set_level(logging.ERROR, logger="tenxgraph")

    @tool
    async def fast(x: int) -> str:
        """Returns while its sibling runs, as the server starts refusing writes."""
        runs["fast"] += 1
        if runs["fast"] == 1:
            await asyncio.to_thread(tenx_postgres.psql, "UPDATE rt_flag SET v = 'all'", dbname=name)
        return "fast done"

    @tool
    async def slow(x: int) -> str:
        """Never returns in the first run."""
        runs["slow"] += 1
        if runs["slow"] == 1:
            await never.wait()
        return "slow done"

    calls = [("fast", {"x": 1}), ("slow", {"x": 2})]
    config = {"thread_id": "t-cancel"}
    try:
        task = asyncio.create_task(tool_calls_graph(cp, [fast, slow], calls).ainvoke(
            {"messages": [Message.text_message("go", message_id="u-1")]}, config))
        for _ in range(600):  # fast's result could not be recorded: it is kept
            if any("could not be recorded" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("fast's result was never refused")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        tenx_postgres.psql("UPDATE rt_flag SET v = 'off'", dbname=name)
        await _until_recorded(tenx_postgres, name, 1)
        await asyncio.wait_for(tool_calls_graph(other, [fast, slow], calls).ainvoke({}, config), 60)
        assert runs == {"fast": 1, "slow": 2}
    finally:
        await other.arelease()
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_kept_result_lost_at_close_is_logged_and_the_close_is_bounded(
    tenx_postgres, refusing_database, caplog
) -> None:
    """Closing while the server still refuses writes lost the kept result without a word; and a
    close whose kept result's thread row was locked by another session took ~10-23 s (the
    abandoned write's connection held the pool's close until the server's statement_timeout)."""
    import logging
    import subprocess
    import time

    from tenxgraph.testing.postgres_server import find_pg_binary

    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    await _keep_a_result(tenx_postgres, name, cp, "idempotent", [], "t-lost")
    caplog.set_level(logging.ERROR, logger="tenxgraph")
    caplog.clear()
    # The thread row locked by another session for longer than any bound here.
    locker = subprocess.Popen([find_pg_binary("psql"), "-X", "-Atq", "-d", dsn, "-c",
                               "BEGIN; SELECT 1 FROM threads WHERE thread_id = 't-lost' FOR UPDATE; "
                               "SELECT pg_sleep(120); COMMIT;"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            held = tenx_postgres.psql("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND "
                                      "query LIKE '%pg_sleep(120)%' AND pid <> pg_backend_pid()", dbname=name)
            if held.strip() == "1":
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # the recorder's first try now waits for the lock
        started = time.monotonic()
        await asyncio.wait_for(cp.arelease(), 60)
        took = time.monotonic() - started
        assert took < 10, f"arelease took {took:.1f} s"
        lost = [r for r in caplog.records if "could not be recorded" in r.getMessage()]
        assert lost, "the lost result was not logged"
    finally:
        locker.kill()
        locker.wait()
