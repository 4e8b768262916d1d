"""Round trips between PgCheckpointer and the server, counted on the wire.

A TCP proxy between the store and PostgreSQL reads the frontend protocol and counts, per
connection, the `Sync` messages that end a statement and the bare ones: a `Sync` with nothing
before it since the last one is a ping (sqlx's pool sent one when it handed a connection out and
another when it took it back: two extra round trips per statement). The store keeps connections
that just finished a statement aside and reuses them without a ping (src/store/postgres/conns.rs);
these tests pin that, and the cases where a ping is still owed: a connection the server ended,
and one whose statement was cancelled mid-flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import subprocess
import threading
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph, metrics
from tenxgraph.core.exceptions import SchemaVersionError, TransientStorageError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.logs import reset_level_cache
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.postgres_server import PostgresServer, _pg_env, find_pg_binary

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


class WireCounter:
    """A proxy on 127.0.0.1 in a thread of its own; counts frontend messages by type."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.lock = threading.Lock()
        self.syncs = 0
        self.bare_syncs = 0
        self.executes = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.tasks: set[asyncio.Task[None]] = set()
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(30), "the proxy did not start"

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"syncs": self.syncs, "bare_syncs": self.bare_syncs, "executes": self.executes}

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.stopping = asyncio.Event()
            server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            await self.stopping.wait()
            server.close()
            for t in list(self.tasks):
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await server.wait_closed()

        self.loop.run_until_complete(main())
        self.loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(30)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        back = asyncio.ensure_future(self._pipe(up_reader, writer))
        try:
            await self._frontend(reader, up_writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            up_writer.close()
            back.cancel()
            await asyncio.gather(back, return_exceptions=True)
            writer.close()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        except ConnectionError:
            pass
        finally:
            dst.close()

    async def _frontend(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        # Untyped messages first: an SSL or GSS request (the DSN says sslmode=disable, so none
        # is expected), then the startup message.
        while True:
            head = await src.readexactly(8)
            length, code = struct.unpack("!ii", head)
            body = await src.readexactly(length - 8)
            dst.write(head + body)
            await dst.drain()
            if code not in (SSL_REQUEST, GSSENC_REQUEST):
                break
        since_sync = 0
        while True:
            kind = await src.readexactly(1)
            raw_len = await src.readexactly(4)
            (length,) = struct.unpack("!i", raw_len)
            body = await src.readexactly(length - 4)
            dst.write(kind + raw_len + body)
            await dst.drain()
            with self.lock:
                if kind == b"S":
                    self.syncs += 1
                    self.bare_syncs += since_sync == 0
                    since_sync = 0
                else:
                    since_sync += 1
                    self.executes += kind == b"E"


def proxied(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    netloc_new = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
    query = "&".join(q for q in [parts.query, "sslmode=disable"] if q)
    return urlunsplit((parts.scheme, netloc_new, parts.path, query, parts.fragment))


def upstream_of(dsn: str) -> tuple[str, int]:
    parts = urlsplit(dsn)
    return parts.hostname or "127.0.0.1", parts.port or 5432


def support_graph(cp: Any) -> Any:
    """model -> tools (two calls) -> model -> END: the benchmark's turn, smaller."""

    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return f"order {order_id}: open"

    async def notify(order_id: str) -> str:
        """Tell the customer."""
        return f"customer of {order_id} told"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("looking", role="assistant")
            msg.tools_calls = [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"order_id": "7"})}},
                {"id": "c2", "type": "function", "function": {"name": "notify", "arguments": json.dumps({"order_id": "7"})}},
            ]
            return msg
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([lookup, notify]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


async def turn(app: Any, thread_id: str) -> list[str]:
    out = await app.ainvoke({"messages": [Message.text_message("where is order 7?")]}, {"thread_id": thread_id})
    return [m.text() for m in out["messages"]]


EXPECTED = ["where is order 7?", "looking", "order 7: open", "customer of 7 told", "done"]


@pytest.fixture
def wire(pg_dsn: str) -> Any:
    counter = WireCounter(*upstream_of(pg_dsn))
    try:
        yield counter, proxied(pg_dsn, counter.port)
    finally:
        counter.stop()


@pytest.mark.asyncio
async def test_statements_reuse_connections_without_a_ping(wire: Any) -> None:
    counter, dsn = wire
    cp = PgCheckpointer(dsn, schema="rt", enforce_user_isolation=False)
    await cp.asetup()
    app = support_graph(cp)
    for i in range(3):  # connections opened, statements prepared
        assert await turn(app, f"warm-{i}") == EXPECTED
    before = counter.counts()
    turns = 8
    for i in range(turns):
        assert await turn(app, f"t-{i}") == EXPECTED
    after = counter.counts()
    bare = after["bare_syncs"] - before["bare_syncs"]
    statements = after["executes"] - before["executes"]
    # sqlx's pool alone: two pings per statement (~14 a turn). A spare connection is pinged only
    # after 50 ms unused, which the statements of a turn of instant nodes reach only when the
    # process is descheduled between them: the bound leaves room for that on a loaded machine,
    # and is a quarter of the pool's count.
    assert statements >= 5 * turns, after
    assert bare <= statements // 2, (bare, statements, after)
    await cp.arelease()


def _terminate_backends(pg: PostgresServer, dbname: str) -> int:
    out = pg.psql(
        f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{dbname}' AND pid <> pg_backend_pid()",
        dbname=dbname,
    )
    return int(out.strip().splitlines()[-1])


@pytest.mark.asyncio
async def test_sessions_the_server_ended_are_replaced(pg_dsn: str, tenx_postgres: PostgresServer) -> None:
    """A spare connection is trusted for 50 ms; one the server ended before that is found out by
    the pool's ping, and the run goes on a new connection."""
    dbname = pg_dsn.rsplit("/", 1)[1].split("?", 1)[0]
    cp = PgCheckpointer(pg_dsn, schema="ended", enforce_user_isolation=False)
    await cp.asetup()
    app = support_graph(cp)
    assert await turn(app, "before") == EXPECTED
    assert await asyncio.to_thread(_terminate_backends, tenx_postgres, dbname) >= 1
    await asyncio.sleep(0.5)  # ten times the trust window: every spare is stale now
    assert await turn(app, "after") == EXPECTED
    assert [m.text() for m in await cp.alist_messages({"thread_id": "after"})] == EXPECTED
    await cp.arelease()


@pytest.mark.asyncio
async def test_sessions_the_server_ended_close_without_a_warning_per_connection(
    pg_dsn: str, tenx_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection whose session the server ended fails the ping it gets when it goes back to
    the pool, and is closed. Until session 23 each such close logged sqlx's WARNING "error from
    `after_release`" (~200 in a red-team run that terminated backends under load), next to the
    failed statement's own error: noise an operator could not act on. Now it is closed quietly;
    the runs after it go on new connections."""
    dbname = pg_dsn.rsplit("/", 1)[1].split("?", 1)[0]
    cp = PgCheckpointer(pg_dsn, schema="ended_quiet", enforce_user_isolation=False)
    await cp.asetup()
    app = support_graph(cp)
    # Several connections in the pool: concurrent turns.
    assert await asyncio.gather(*(turn(app, f"before-{i}") for i in range(4))) == [EXPECTED] * 4
    caplog.set_level(logging.DEBUG)
    reset_level_cache()  # the Rust side looks a logger's level up once
    assert await asyncio.to_thread(_terminate_backends, tenx_postgres, dbname) >= 1
    await asyncio.sleep(0.5)  # every spare connection is stale: each goes back to the pool, pinged
    for i in range(3):
        assert await turn(app, f"after-{i}") == EXPECTED
    await cp.arelease()
    closed = [r for r in caplog.records if "failed its ping" in r.getMessage()]
    warned = [r for r in caplog.records if "after_release" in r.getMessage()]
    reset_level_cache()  # later tests look the restored levels up again
    assert warned == [], [r.getMessage() for r in warned]
    assert closed, "no connection was closed after a failed ping: the case was not reached"


@pytest.mark.asyncio
async def test_a_statement_cancelled_mid_flight_leaves_its_connection_behind(
    pg_dsn: str, tenx_postgres: PostgresServer
) -> None:
    """A run cancelled while its statement waits on a row lock: that connection still has a reply
    coming, and a statement sent on it would wait behind it. The runs on other threads must go on
    while the lock is still held, and get right answers."""
    dbname = pg_dsn.rsplit("/", 1)[1].split("?", 1)[0]
    cp = PgCheckpointer(pg_dsn, schema="cancelled", enforce_user_isolation=False)
    await cp.asetup()
    app = support_graph(cp)
    assert await turn(app, "blocked") == EXPECTED  # the thread's row exists from here on

    locker = await asyncio.to_thread(_Locker.thread_row, tenx_postgres, dbname, "cancelled", "blocked")
    try:
        blocked = asyncio.create_task(turn(app, "blocked"))
        deadline = time.monotonic() + 60
        waiting_sql = (
            f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{dbname}' AND wait_event_type = 'Lock'"
        )
        while int(tenx_postgres.psql(waiting_sql, dbname=dbname).strip() or 0) < 1:
            assert not blocked.done(), blocked
            assert time.monotonic() < deadline, "the run's statement never waited on the lock"
            await asyncio.sleep(0.05)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked

        # The lock is still held: a run that reused the cancelled statement's connection would
        # wait for it (a minute is far beyond a turn's time even on a loaded machine).
        for i in range(3):
            assert await asyncio.wait_for(turn(app, f"other-{i}"), 60) == EXPECTED
    finally:
        await asyncio.to_thread(locker.close)

    assert [m.text() for m in await cp.alist_messages({"thread_id": "other-2"})] == EXPECTED
    await cp.arelease()


@pytest.mark.asyncio
async def test_more_runs_than_connections_all_finish(pg_dsn: str) -> None:
    """Twelve runs at once on two connections: a statement that waits for the pool must get the
    next connection that finishes, not wait while the others take turns on the kept ones (the
    first version of the kept connections starved it until the pool's timeout)."""
    cp = PgCheckpointer(pg_dsn, schema="crowd", enforce_user_isolation=False, pool_config={"max_size": 2, "timeout": 5})
    await cp.asetup()
    app = support_graph(cp)

    async def three_turns(n: int) -> list[list[str]]:
        return [await turn(app, f"crowd-{n}") for _ in range(3)]

    waits = metrics.snapshot()["tenxgraph.storage.gate_waits"]
    results = await asyncio.gather(*(three_turns(n) for n in range(12)))
    assert results == [[EXPECTED] * 3] * 12
    # Twelve runs' statements on two permits: the statement gate counts those that waited.
    assert metrics.snapshot()["tenxgraph.storage.gate_waits"] > waits
    stored = [m.text() for m in await cp.alist_messages({"thread_id": "crowd-11"})]
    assert stored == EXPECTED * 3
    await cp.arelease()


@pytest.mark.asyncio
async def test_release_while_runs_finish_statements_returns(pg_dsn: str) -> None:
    """`arelease()` closes the pool, which waits for every connection: one kept aside by a
    statement that finished while it closed would make it wait for ever. Runs released from
    their tools at the moment the store closes end (done, cancelled by the release, which since
    session 32 cancels runs in flight and lets them unwind before it closes the pool, or a
    storage error), and so does `arelease()`."""
    from tenxgraph.core.exceptions import StorageError

    cp = PgCheckpointer(pg_dsn, schema="closing", enforce_user_isolation=False, pool_config={"max_size": 3})
    await cp.asetup()
    gate = asyncio.Event()
    entered: list[str] = []

    async def wait_here(order_id: str) -> str:
        """Wait for the gate."""
        entered.append(order_id)
        await gate.wait()
        return f"order {order_id}: open"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("looking", role="assistant")
            msg.tools_calls = [{"id": "c1", "type": "function", "function": {"name": "wait_here", "arguments": json.dumps({"order_id": "7"})}}]
            return msg
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([wait_here]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=cp)

    runs = [asyncio.create_task(app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": f"closing-{n}"})) for n in range(6)]
    deadline = time.monotonic() + 60
    while len(entered) < 6:
        assert time.monotonic() < deadline, f"only {len(entered)} runs reached their tool"
        await asyncio.sleep(0.01)
    gate.set()
    await asyncio.wait_for(cp.arelease(), 60)  # a hang bound: it returns at once when right
    done, pending = await asyncio.wait(runs, timeout=60)
    assert not pending, "runs still waiting after the store closed"
    for r in done:
        assert r.cancelled() or r.exception() is None or isinstance(r.exception(), StorageError), r.exception()


class _Locker:
    """A psql session that runs ``BEGIN; <lock>`` and holds what it locked until closed."""

    def __init__(self, pg: PostgresServer, dbname: str, lock: str) -> None:
        self.proc = subprocess.Popen(
            [find_pg_binary("psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", pg.dsn_for(dbname)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ) if pg.external else _pg_env(),
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"BEGIN; {lock}; SELECT 'locked';\n")
        self.proc.stdin.flush()
        while (line := self.proc.stdout.readline().strip()) != "locked":
            assert line, "the locking session ended"

    @classmethod
    def thread_row(cls, pg: PostgresServer, dbname: str, schema: str, thread_id: str) -> _Locker:
        return cls(pg, dbname, f"SELECT 1 FROM {schema}.threads WHERE thread_id = '{thread_id}' FOR UPDATE")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("ROLLBACK;\n")
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.mark.asyncio
async def test_a_statement_the_server_cancels_says_so(pg_dsn: str, tenx_postgres: PostgresServer) -> None:
    """A statement cancelled by the server's ``statement_timeout`` (here: set in the DSN, below
    the store's lock_timeout, while another session holds the thread's row) is a
    TransientStorageError that names the timeout. Until session 23 it read "the database is
    unreachable", which sends an operator to the network."""
    dbname = pg_dsn.rsplit("/", 1)[1].split("?", 1)[0]
    sep = "&" if "?" in pg_dsn else "?"
    cp = PgCheckpointer(pg_dsn + f"{sep}options=-c%20statement_timeout%3D500", schema="srv_cancel",
                        enforce_user_isolation=False)
    await cp.asetup()
    app = support_graph(cp)
    assert await turn(app, "locked") == EXPECTED
    locker = await asyncio.to_thread(_Locker.thread_row, tenx_postgres, dbname, "srv_cancel", "locked")
    try:
        with pytest.raises(TransientStorageError) as raised:
            await asyncio.wait_for(turn(app, "locked"), 60)
    finally:
        await asyncio.to_thread(locker.close)
    assert "the server cancelled the statement (statement_timeout" in str(raised.value)
    assert "unreachable" not in str(raised.value)
    assert await turn(app, "locked") == EXPECTED  # the lock gone, the thread takes the turn
    await cp.arelease()


@pytest.mark.asyncio
async def test_a_statement_whose_session_the_server_ends_says_so(pg_dsn: str, tenx_postgres: PostgresServer) -> None:
    """A statement whose backend is terminated (``pg_terminate_backend``) while it waits on a row
    lock: TransientStorageError naming the ended session, not "the database is unreachable"."""
    dbname = pg_dsn.rsplit("/", 1)[1].split("?", 1)[0]
    cp = PgCheckpointer(pg_dsn, schema="srv_ended", enforce_user_isolation=False)
    await cp.asetup()
    app = support_graph(cp)
    assert await turn(app, "locked") == EXPECTED
    locker = await asyncio.to_thread(_Locker.thread_row, tenx_postgres, dbname, "srv_ended", "locked")
    try:
        blocked = asyncio.create_task(turn(app, "locked"))
        waiting = (f"SELECT pid FROM pg_stat_activity WHERE datname = '{dbname}' AND wait_event_type = 'Lock' "
                   "AND query LIKE '%tenx_%'")
        deadline = time.monotonic() + 60
        while not (pids := (await asyncio.to_thread(tenx_postgres.psql, waiting, dbname=dbname)).split()):
            assert not blocked.done(), blocked
            assert time.monotonic() < deadline, "the turn's statement never waited on the lock"
            await asyncio.sleep(0.05)
        await asyncio.to_thread(tenx_postgres.psql, f"SELECT pg_terminate_backend({pids[0]})", dbname=dbname)
        with pytest.raises(TransientStorageError) as raised:
            await asyncio.wait_for(blocked, 60)
    finally:
        await asyncio.to_thread(locker.close)
    assert "the server ended the session" in str(raised.value), str(raised.value)
    assert await turn(app, "locked") == EXPECTED
    await cp.arelease()


@pytest.mark.asyncio
async def test_setup_beside_a_lock_on_the_schema_version_table_is_transient(
    pg_dsn: str, tenx_postgres: PostgresServer
) -> None:
    """A new worker's ``asetup()`` on a migrated schema while another session holds
    ``schema_version`` (a migrator of another version, a DBA's ``LOCK TABLE``): past lock_timeout
    it is TransientStorageError, a retry passes once the lock is gone. Until session 23 it was
    SchemaVersionError STORAGE_SCHEMA_001, "migration failed", which says the schema is broken."""
    dbname = pg_dsn.rsplit("/", 1)[1].split("?", 1)[0]
    first = PgCheckpointer(pg_dsn, schema="srv_setup", enforce_user_isolation=False)
    await first.asetup()
    await first.arelease()
    locker = await asyncio.to_thread(_Locker, tenx_postgres, dbname,
                                     "LOCK TABLE srv_setup.schema_version IN ACCESS EXCLUSIVE MODE")
    cp = PgCheckpointer(pg_dsn, schema="srv_setup", enforce_user_isolation=False, pool_config={"lock_timeout": 1})
    try:
        with pytest.raises(TransientStorageError) as raised:
            await asyncio.wait_for(cp.asetup(), 60)
        assert not isinstance(raised.value, SchemaVersionError)
        assert "lock_timeout" in str(raised.value)
    finally:
        await asyncio.to_thread(locker.close)
    assert await asyncio.wait_for(cp.asetup(), 60) is True
    assert await turn(support_graph(cp), "after-setup") == EXPECTED
    await cp.arelease()
