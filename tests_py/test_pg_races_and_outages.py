"""PostgreSQL under races and outages: two processes racing on one thread, a process killed inside
a step's transaction, Redis dying mid-run, Postgres restarting mid-run.

The child processes run tests_py/crash_agents/pg_agent.py. Servers that get stopped or restarted
here are private to this module (start_postgres/start_redis(use_env=False)); the session servers
are never touched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The ledger keys of the two calls (["<assistant message id>", "<call id>"]).
FAST_KEY, SLOW_KEY = (json.dumps(["assistant-calls", c], separators=(",", ":")) for c in ("call_fast", "call_slow"))

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import StorageError, TransientStorageError
from tenxgraph.core.state import ToolResultBlock
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.postgres_server import _as_pg_user, _pg_env
from tenxgraph.testing.services import (
    redis_command,
    PostgresServer,
    find_pg_binary,
    find_redis_server,
    start_postgres,
    start_redis,
)

from tests_py.crash_agents.pg_agent import USER, effects, tool_graph
from tests_py.redteam.waits import await_until as _await_until, wait_until as _wait_until

AGENT = Path(__file__).parent / "crash_agents" / "pg_agent.py"
REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- helpers


def _child_env(effects_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    if effects_path is not None:
        env["TENX_EFFECTS"] = str(effects_path)
    return env


def _dbname(dsn: str) -> str:
    return dsn.rsplit("/", 1)[1].split("?", 1)[0]


def _rows(pg: PostgresServer, sql: str, dbname: str) -> list[list[str]]:
    out = pg.psql(sql, dbname=dbname)
    return [line.split("|") for line in out.splitlines() if line]


def _redis(port: int, *args: str) -> bytes:
    """One RESP command over a raw socket; the raw reply (simple, error, integer or bulk)."""
    return redis_command(port, *args)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- 1. the race


# The two-process round race that lived here (both workers inside one node, one StaleStateError per
# round) cannot happen any more: a thread's lease admits one run at a time. Its successor is
# tests_py/test_leases.py (100 rounds, reject and wait, tools counted outside the processes).


# --------------------------------------------------------------------------- 2. kill inside the transaction


@pytest.mark.parametrize("server", ["checks-dead-clients", "runtime-default"])
def test_process_killed_inside_the_step_transaction(
    tenx_postgres: PostgresServer, pg_dsn: str, tmp_path: Path, server: str
) -> None:
    """The child's step blocks inside tenx_put_step after its state row insert (its message insert
    waits on another session's uncommitted row with the same message_id); SIGKILL it there.

    "checks-dead-clients" (client_connection_check_interval set): the server notices the dead
    client while the statement waits and aborts it: neither the new state nor its messages exist,
    and a resume in a new process runs the node again and completes.
    "runtime-default": no database setting; with PostgreSQL's defaults an orphaned statement
    would go on once the lock is released and commit the step after its process died, so the
    runtime sets client_connection_check_interval on its own connections: the same outcome.
    """
    pg, schema, thread, db = tenx_postgres, "killtx", "t-kill", _dbname(pg_dsn)
    effects_path = tmp_path / "effects.log"
    PgCheckpointer(pg_dsn, schema=schema).setup()  # creates the schema (the constructor does not connect)
    if server == "checks-dead-clients":
        pg.psql(f'ALTER DATABASE "{db}" SET client_connection_check_interval = 100', dbname=db)

    def max_version() -> list[list[str]]:
        return _rows(pg, f"SELECT max(version) FROM {schema}.states WHERE thread_id = '{thread}'", db)

    def thread_messages() -> list[str]:
        return [r[0] for r in _rows(
            pg, f"SELECT message_id FROM {schema}.messages WHERE thread_id = '{thread}' ORDER BY seq", db)]

    blocker = subprocess.Popen(
        [find_pg_binary("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", f"{pg_dsn}?application_name=tenx-blocker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_pg_env(),
    )
    child: subprocess.Popen[str] | None = None
    try:
        assert blocker.stdin is not None
        blocker.stdin.write(
            "BEGIN;\n"
            f"INSERT INTO {schema}.threads (thread_id, user_id) VALUES ('t-blocker', 'someone-else');\n"
            f"INSERT INTO {schema}.messages (message_id, thread_id, role, content) "
            "VALUES ('fixed-id', 't-blocker', 'assistant', 'held');\n"
        )
        blocker.stdin.flush()
        _wait_until("the blocker's open transaction", lambda: _rows(pg, (
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'tenx-blocker' "
            "AND state = 'idle in transaction' AND backend_xid IS NOT NULL"), db))

        child = subprocess.Popen(
            [sys.executable, str(AGENT), "answer-start", pg_dsn, schema, thread],
            env=_child_env(effects_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

        def waiting() -> list[list[str]]:
            assert child is not None
            if child.poll() is not None:
                raise AssertionError(f"child exited early ({child.returncode}): {child.stderr.read() if child.stderr else ''}")
            return _rows(pg, (
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'tenxgraph' AND datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%tenx_put_step%'"), db)

        pid = int(_wait_until("the step to wait inside tenx_put_step", waiting)[0][0])
        assert effects(effects_path) == ["answer"]
        # It waits after its state row insert: it holds the insert lock on the states table.
        held = _rows(pg, (
            f"SELECT count(*) FROM pg_locks WHERE pid = {pid} AND granted AND mode = 'RowExclusiveLock' "
            f"AND relation = '{schema}.states'::regclass"), db)
        assert held == [["1"]], held
        # The input commit is the only committed version so far.
        assert max_version() == [["1"]]

        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert child.returncode == -signal.SIGKILL

        def backend_gone() -> bool:
            return not _rows(pg, f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid}", db)

        # The dead client's backend goes away and takes its transaction with it, before the
        # blocker lets go.
        _wait_until("the orphaned backend to end", backend_gone, timeout=15)
        blocker.stdin.write("ROLLBACK;\n\\q\n")
        blocker.stdin.flush()
        blocker.stdin.close()
        blocker.wait(timeout=10)
        assert blocker.returncode == 0, blocker.stderr.read() if blocker.stderr else ""
        _wait_until("the orphaned backend to end", backend_gone, timeout=15)
    finally:
        for p in (child, blocker):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

    assert max_version() == [["1"]]
    assert _rows(pg, f"SELECT count(*) FROM {schema}.messages WHERE message_id = 'fixed-id'", db) == [["0"]]
    assert thread_messages() == ["user-1"]

    resumed = subprocess.run(
        [sys.executable, str(AGENT), "answer-resume", pg_dsn, schema, thread],
        env=_child_env(effects_path), capture_output=True, text=True, timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    out = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert out == {"status": "completed", "messages": ["user-1", "fixed-id"]}, out
    assert effects(effects_path) == ["answer", "answer"]  # the node in flight ran again, once
    assert _rows(pg, f"SELECT version FROM {schema}.states WHERE thread_id = '{thread}' ORDER BY version", db) == [
        ["1"], ["2"]
    ]
    assert thread_messages() == ["user-1", "fixed-id"]


# --------------------------------------------------------------------------- 3. Redis dies mid-run


class _Gate:
    """asyncio events a node and the test use to take turns."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()


def _redis_graphs(cp: PgCheckpointer, gate: _Gate, hang: _Gate):
    """slow -> after -> END (Redis is stopped while slow runs), and hung -> END (to be stopped)."""

    async def slow(state: AgentState) -> Message:
        gate.entered.set()
        await gate.release.wait()
        await asyncio.sleep(1.0)  # Redis is gone for the rest of this node
        return Message.text_message("slow done", role="assistant")

    async def after(state: AgentState) -> Message:
        return Message.text_message("after done", role="assistant")

    async def hung(state: AgentState) -> Message:
        hang.entered.set()
        await asyncio.sleep(3600)
        return Message.text_message("never", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("slow", slow)
    g.add_node("after", after)
    g.add_edge(START, "slow")
    g.add_edge("slow", "after")
    g.add_edge("after", END)
    h = StateGraph(AgentState)
    h.add_node("hung", hung)
    h.add_edge(START, "hung")
    h.add_edge("hung", END)
    return g.compile(checkpointer=cp), h.compile(checkpointer=cp)


def _start_redis_on(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    workdir.mkdir(exist_ok=True)
    log = open(workdir / "redis.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--daemonize", "no", "--dir", str(workdir), "--logfile", ""],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log.close()
    return proc


@pytest.mark.asyncio
async def test_redis_killed_mid_run(pg_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tenxgraph")
    redis = start_redis(use_env=False)
    port = redis.port
    second: subprocess.Popen[bytes] | None = None
    try:
        cp = PgCheckpointer(pg_dsn, redis_url=redis.url, schema="redis_outage")
        # Redis is in use to begin with: a state cache write lands there, under the store's id.
        probe: dict[str, Any] = {"thread_id": "t-cache", "user_id": USER}
        await cp.aput_state_cache(probe, AgentState())
        found = _redis(port, "KEYS", f"tenxgraph:*:state_cache:t-cache:{USER}")
        assert found.startswith(b"*1\r\n"), found
        state_key = found.split(b"\r\n")[2].decode()
        assert _redis(port, "DEL", state_key) == b":1\r\n"

        gate, hang = _Gate(), _Gate()
        app, hung_app = _redis_graphs(cp, gate, hang)
        cfg = {"thread_id": "t-redis", "user_id": USER}
        run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg), "full"))
        await asyncio.wait_for(gate.entered.wait(), 10)
        await asyncio.to_thread(redis.stop)
        assert not _port_open(port)
        gate.release.set()
        result = await asyncio.wait_for(run, 20)
        assert str(result["state"].execution_meta.status) == "completed"
        assert [m.text() for m in result["messages"]] == ["go", "slow done", "after done"]
        stored = await cp.aget_state(dict(cfg))
        assert stored is not None and [m.text() for m in stored.context] == ["go", "slow done", "after done"]

        # A run does not use Redis (session 32: the generic cache is the table); the state cache
        # does, and says Redis is down.
        await cp.aget_state_cache(dict(cfg))
        warned = [
            r for r in caplog.records
            if r.name.startswith("tenxgraph") and r.levelno >= logging.WARNING and "redis" in r.getMessage().lower()
        ]
        assert warned, [f"{r.name}: {r.getMessage()}" for r in caplog.records]

        # A stop request still ends a hung node while Redis is down.
        hcfg = {"thread_id": "t-hang", "user_id": USER}
        hrun = asyncio.create_task(hung_app.ainvoke({"messages": [Message.text_message("hang")]}, dict(hcfg), "full"))
        await asyncio.wait_for(hang.entered.wait(), 10)
        t0 = time.monotonic()
        assert (await hung_app.astop(dict(hcfg)))["ok"] is True
        hresult = await asyncio.wait_for(hrun, 10)
        took = time.monotonic() - t0
        assert took < 2.0, f"stop took {took:.2f}s without Redis"
        meta = hresult["state"].execution_meta
        assert str(meta.status) == "interrupted_after" and str(meta.stop_current_execution) == "stopped", meta
        assert not _port_open(port)

        # A new Redis on the same port is used again: a state cache write lands in it.
        second = _start_redis_on(port, tmp_path / "redis2")
        _wait_until("the second redis", lambda: _port_open(port) and _redis(port, "PING") == b"+PONG\r\n", 20)
        assert _redis(port, "EXISTS", state_key) == b":0\r\n"
        deadline = time.monotonic() + 15
        while True:
            await cp.aput_state_cache(probe, AgentState())
            if _redis(port, "EXISTS", state_key) == b":1\r\n":
                break
            assert time.monotonic() < deadline, "the checkpointer never went back to the restarted Redis"
            await asyncio.sleep(0.2)
        back = await cp.aget_state_cache(dict(probe))
        assert back is not None
    finally:
        redis.stop()
        if second is not None:
            second.terminate()
            second.wait(timeout=10)


# --------------------------------------------------------------------------- 4. Postgres restarts mid-run


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PostgresServer]:
    server = start_postgres(use_env=False)
    try:
        yield server
    finally:
        server.stop()


def _pg_start(pg: PostgresServer) -> None:
    """pg_ctl start does not reuse the old command line (restart does): same port and socket dir."""
    assert pg.data_dir
    opts = f"-p {pg.port} -k {os.path.join(os.path.dirname(pg.data_dir), 's')} -c listen_addresses=127.0.0.1"
    _pg_ctl(pg, "-o", opts, "start")


def _pg_ctl(pg: PostgresServer, *args: str) -> None:
    assert pg.data_dir and pg.log_path
    cmd = _as_pg_user([find_pg_binary("pg_ctl"), "-D", pg.data_dir, "-l", pg.log_path, "-w", "-t", "60", *args])
    res = subprocess.run(cmd, env=_pg_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, timeout=120)
    assert res.returncode == 0, f"pg_ctl {' '.join(args)} failed: {res.stderr}"


@pytest.mark.asyncio
@pytest.mark.parametrize("outage", ["restart", "down-when-tool-returns"])
async def test_postgres_restarted_mid_run(
    private_pg: PostgresServer, tmp_path: Path, outage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """fast_tool and slow_tool run in parallel; fast_tool's ledger row commits, then Postgres
    restarts (or stops) while slow_tool is in flight. The run completes or fails with a storage
    error; a resume completes; a tool whose ledger row was committed never ran twice."""
    caplog.set_level(logging.WARNING, logger="tenxgraph")
    pg = private_pg
    dbname = f"outage_{outage.replace('-', '_')}"
    dsn = pg.create_database(dbname)
    try:
        effects_path, gate = tmp_path / "effects.log", tmp_path / "gate"
        gate.mkdir()
        cp = PgCheckpointer(dsn, schema="outage", pool_config={"timeout": 3})
        app = tool_graph(cp, effects_path, gate)
        cfg = {"thread_id": "t-outage", "user_id": USER}
        ledger_sql = "SELECT tool_call_id FROM outage.tool_executions WHERE thread_id = 't-outage' AND result->>'__kind__' IS DISTINCT FROM 'started' ORDER BY 1"

        def ledger() -> list[str]:
            return [r[0] for r in _rows(pg, ledger_sql, dbname)]

        run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("do it", message_id="u1")]}, dict(cfg)))
        await _await_until("slow_tool to start", lambda: (gate / "entered").exists() or run.done())
        assert not run.done(), run.exception()
        await _await_until("fast_tool's ledger row", lambda: ledger() == [FAST_KEY])

        if outage == "restart":
            await asyncio.to_thread(_pg_ctl, pg, "-m", "fast", "restart")
            (gate / "release").touch()
        else:
            await asyncio.to_thread(_pg_ctl, pg, "-m", "fast", "stop")
            (gate / "release").touch()
            await _await_until("slow_tool to return", lambda: "done:slow" in effects(effects_path) or run.done())
            await asyncio.wait({run}, timeout=30)
            await asyncio.to_thread(_pg_start, pg)
        first_error: BaseException | None = None
        try:
            await asyncio.wait_for(run, 60)
        except StorageError as e:  # TransientStorageError is a StorageError
            first_error = e
        if outage == "down-when-tool-returns":
            # Postgres was down when the step had to commit: the run cannot have completed.
            assert isinstance(first_error, TransientStorageError), first_error
            assert any("could not be recorded" in r.getMessage() for r in caplog.records), [
                r.getMessage() for r in caplog.records
            ]

        recorded_before_resume = ledger()
        assert FAST_KEY in recorded_before_resume
        resumed = await app.ainvoke({}, dict(cfg), "full")
        assert str(resumed["state"].execution_meta.status) == "completed"

        ran = effects(effects_path)
        for key in recorded_before_resume:
            tool = json.loads(key)[1].rsplit("_", 1)[1]
            assert ran.count(f"done:{tool}") == 1, (key, ran)
        assert ran.count("done:fast") == 1, ran
        # slow_tool: once. A result that could not be recorded (Postgres down as it returned) is
        # kept by the store and replayed by the resume in this process, and recorded then (it ran
        # a second time until session 28; another process would still run it again).
        slow_recorded = SLOW_KEY in recorded_before_resume
        assert ran.count("done:slow") == 1, ran
        if outage == "down-when-tool-returns":
            assert not slow_recorded
        assert ledger() == [FAST_KEY, SLOW_KEY]

        # The model saw exactly one result per call, and finished.
        msgs = await cp.alist_messages(dict(cfg))
        results = [b.call_id for m in msgs if m.role == "tool" for b in m.content if isinstance(b, ToolResultBlock)]
        assert sorted(results) == ["call_fast", "call_slow"], [m.model_dump() for m in msgs]
        assert msgs[-1].text() == "all done"
    finally:
        if not _port_open(pg.port):  # a failure while the server was down: the next test needs it
            _pg_start(pg)
    pg.drop_database(dbname)
