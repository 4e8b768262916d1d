"""Red-team pass: frozen and half-dead dependencies ("nothing hangs").

Earlier passes cut Postgres connections, restarted Postgres, killed Redis and filled the disk. Here a
dependency stays connected and stops answering: a TCP proxy that keeps every connection open but
stops forwarding (a network blackhole), SIGSTOP of the Postgres backend serving a call, a session
frozen while it holds a lock the runtime needs (a frozen peer or migrator), SIGSTOP of
redis-server, another process holding SQLite's write lock, and tools that never return or ignore
their cancellation. Each test says what the runtime must do within a bound (every timeout the
test configures is <= 2 s; BOUND leaves a wide margin for a loaded 2-core CI box), and what must
hold after the dependency comes back (the thread resumable, each finished tool once, every state
version once).

The servers are private to this module (start_postgres / start_redis with use_env=False): they
get frozen. The runs under attack are child processes (frozen_child.py, next to this file), so a
run that hangs is observed by this process and then SIGKILLed (a crash next to a pause) instead
of hanging the test.

Found in session 17 (docs/reliability.md, "Red-team pass (session 17)"): before its fixes, 6 of
these failed (a statement in flight on a frozen server or network waited for ever on every entry
point; a frozen session's row locks held `tenxgraph recover` for ever; a stuck lease renewal held
node_timeout and stop(); setup() queued behind a frozen migrator; an async tool that ignored its
cancellation ran again on resume). The last test was a known limit (strict xfail) until session 18.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tenxgraph.core.exceptions import NodeTimeoutError, StorageError
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
from tenxgraph.testing.services import PostgresServer, RedisServer, find_pg_binary, start_postgres, start_redis

HERE = Path(__file__).resolve().parent
CHILD = HERE / "frozen_child.py"
sys.path.insert(0, str(HERE))
import frozen_child  # noqa: E402
from tests_py.redteam.waits import wait_until as _wait_until  # noqa: E402  (the graphs the children run, for reference runs in this process)

# Seconds a call may take after a fault before it counts as hung. Every timeout the tests set is
# at most 2 s (pool acquire 2 s, node_timeout 2 s, tool_timeout <= 2 s, lease_ttl <= 2 s, the
# children's pool_config "statement_timeout" 2 s and "lock_timeout" 1 s); a run that meets a
# frozen COMMIT fails its step (4 s) and then its error write, with retries: ~10 s seen.
BOUND = 30.0
USER = "u"


# --------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    server = start_postgres(use_env=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = start_redis(use_env=False)
    try:
        yield server
    finally:
        os.kill(server.pid, signal.SIGCONT) if server.pid else None
        server.stop()


@pytest.fixture
def db(pg: PostgresServer) -> Iterator[tuple[str, str]]:
    """(database name, DSN) of a fresh database: advisory locks and frozen sessions stay in it."""
    name = f"rt_{uuid.uuid4().hex[:12]}"
    dsn = pg.create_database(name)
    try:
        yield name, dsn
    finally:
        try:
            pg.drop_database(name)
        except RuntimeError:
            pass


def with_app_name(dsn: str, name: str) -> str:
    return dsn + ("&" if "?" in dsn else "?") + f"application_name={name}"


def psql_cmd() -> list[str]:
    return [find_pg_binary("psql"), "-X", "-Atq", "-v", "ON_ERROR_STOP=1"]


def rows(pg: PostgresServer, sql: str, dbname: str) -> list[list[str]]:
    return [line.split("|") for line in pg.psql(sql, dbname=dbname, timeout=20).splitlines() if line]


def backend_pids(pg: PostgresServer, dbname: str, app_name: str, state: str | None = None) -> list[int]:
    cond = f" AND state = '{state}'" if state else ""
    return [int(r[0]) for r in rows(pg, f"SELECT pid FROM pg_stat_activity WHERE application_name = '{app_name}'"
                                        f" AND backend_type = 'client backend'{cond}", "postgres")]


def lock_waiters(pg: PostgresServer) -> list[list[str]]:
    """Sessions waiting for a lock right now: (application_name, wait event, query)."""
    return rows(pg, "SELECT application_name, wait_event_type || ':' || wait_event, left(regexp_replace(query, '\\s+', ' ', 'g'), 70) "
                    "FROM pg_stat_activity WHERE wait_event_type = 'Lock'", "postgres")


def versions(pg: PostgresServer, dbname: str, schema: str, thread: str) -> list[int]:
    return [int(r[0]) for r in rows(pg, f"SELECT version FROM {schema}.states WHERE thread_id = '{thread}' ORDER BY version", dbname)]


def ledger_calls(pg: PostgresServer, dbname: str, schema: str, thread: str) -> list[str]:
    out = rows(pg, f"SELECT tool_call_id FROM {schema}.tool_executions WHERE thread_id = '{thread}' "
                   "AND result->>'__kind__' IS DISTINCT FROM 'started' ORDER BY 1", dbname)
    return sorted(str(json.loads(r[0])[1]) for r in out)


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    return _wait_until(what, check, timeout)


def counts(path: Path) -> Counter[str]:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def sigcont_and_kill(pid: int) -> None:
    for sig in (signal.SIGKILL, signal.SIGCONT):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def check_versions(vs: list[int], label: str, failures: list[str]) -> None:
    if len(set(vs)) != len(vs) or vs != list(range(vs[0], vs[0] + len(vs))):
        failures.append(f"{label}: state versions not each once and gap-free: {vs}")


# --------------------------------------------------------------------------- child processes


class Child:
    """``frozen_child.py SPEC`` in its own process; the result file it writes is its answer."""

    def __init__(self, tmp: Path, name: str, spec: dict[str, Any]) -> None:
        self.dir = tmp / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.result_path = self.dir / "result.json"
        spec = {**spec, "result": str(self.result_path)}
        (self.dir / "spec.json").write_text(json.dumps(spec))
        self.log = open(self.dir / "log.txt", "wb")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, str(CHILD), str(self.dir / "spec.json")], cwd=HERE, env=env,
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

    def result(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.result_path.exists():
                return json.loads(self.result_path.read_text())
            if self.proc.poll() is not None and not self.result_path.exists():
                time.sleep(0.1)
                if not self.result_path.exists():
                    raise AssertionError(f"child exited {self.proc.returncode} without a result: {self.output()}")
            time.sleep(0.02)
        return None

    def output(self) -> str:
        self.log.flush()
        return (self.dir / "log.txt").read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            sigcont_and_kill(self.proc.pid)
        self.proc.wait(10)


def cli(tmp: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    out = open(tmp / f"{name}.out", "wb")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "tenxgraph", *args], cwd=HERE, env=env, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=subprocess.STDOUT)


def finished_within(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def reference_roles(tmp: Path) -> list[str]:
    """The roles of an uninterrupted run's messages (same graph, SQLite)."""
    cp = SqliteCheckpointer(tmp / "reference.db")
    cfg = {"thread_id": "ref", "user_id": USER}

    async def go() -> list[str]:
        from tenxgraph import Message
        await frozen_child.build(cp).ainvoke({"messages": [Message.text_message("do it", message_id="u1")]}, dict(cfg))
        return [str(m.role) for m in await cp.alist_messages(dict(cfg))]

    return asyncio.run(go())


def pg_roles(dsn: str, schema: str, thread: str) -> tuple[str | None, list[str]]:
    cp = PgCheckpointer(dsn, schema=schema, enforce_user_isolation=False)
    cfg = {"thread_id": thread, "user_id": USER}

    async def go() -> tuple[str | None, list[str]]:
        state = await cp.aget_state(dict(cfg))
        msgs = await cp.alist_messages(dict(cfg))
        await cp.arelease()
        return (str(state.execution_meta.status) if state else None), [str(m.role) for m in msgs]

    return asyncio.run(go())


def run_env(tmp: Path, name: str, slow: float = 0.2) -> tuple[dict[str, str], Path, Path]:
    effects, marks = tmp / f"{name}_effects.txt", tmp / f"{name}_marks"
    marks.mkdir(exist_ok=True)
    return {"RT_EFFECTS": str(effects), "RT_MARKS": str(marks), "RT_SLOW": str(slow)}, effects, marks


# --------------------------------------------------------------------------- the blackhole proxy


class FreezingProxy:
    """TCP proxy 127.0.0.1:port -> target on its own thread. ``freeze()`` keeps every connection
    open, new ones included, and forwards nothing either way (the bytes are held, and the sockets
    stop being read, so TCP back-pressure builds as behind a stalled network path); ``thaw()``
    delivers what was held and forwards again. A side that closes while frozen is closed on the
    other side only after the thaw: a frozen network tells nobody."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.flowing: asyncio.Event = self._call(self._make_event())
        self.writers: set[asyncio.StreamWriter] = set()
        self.server = self._call(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]

    async def _make_event(self) -> asyncio.Event:
        e = asyncio.Event()
        e.set()
        return e

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def dsn_for(self, dsn: str) -> str:
        parts = urlsplit(dsn)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{self.port}"))

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self.writers |= {cw, sw}
        await asyncio.gather(self._pump(cr, sw), self._pump(sr, cw))
        self.writers -= {cw, sw}

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                await self.flowing.wait()
                w.write(data)
                await w.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            try:
                await self.flowing.wait()
            finally:
                w.close()

    def freeze(self) -> None:
        self.loop.call_soon_threadsafe(self.flowing.clear)

    def thaw(self) -> None:
        self.loop.call_soon_threadsafe(self.flowing.set)

    def stop(self) -> None:
        self.thaw()

        async def close() -> None:
            for w in list(self.writers):
                w.close()
            self.server.close()

        try:
            self._call(close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


# --------------------------------------------------------------------------- 1. blackhole at the step COMMIT, crash, recover


@pytest.mark.timeout(150)
def test_step_commit_sent_into_a_network_blackhole_then_crash_and_recover(pg: PostgresServer, db: tuple[str, str],
                                                                          tmp_path: Path) -> None:
    """The network to Postgres blackholes right when the tools step's COMMIT is sent (the
    ``in_step_tx`` failpoint's delay is the window; the COMMIT leaves after it). Promises:
    1. the run ends with a typed error within BOUND (node_timeout=2, tool_timeout=2, pool timeout
       2 s are all that is configured);
    2. SIGKILL it there; `tenxgraph recover` from a fresh process (direct connection, recovery's
       on_busy="reject": "it never waits") answers within BOUND while the network is still frozen;
    3. after the network comes back: the thread completes, each tool ran once, every state
       version once, the messages of an uninterrupted run."""
    dbname, dsn = db
    schema, thread, app = "rt_bh", "t-bh", "rt_bh"
    env, effects, _marks = run_env(tmp_path, "bh")
    failures: list[str] = []
    proxy = FreezingProxy(pg.host, pg.port)
    child = recover = None
    try:
        child = Child(tmp_path, "run", {
            "mode": "run", "dsn": with_app_name(proxy.dsn_for(dsn), app), "schema": schema, "thread": thread,
            "pool_max": 2, "pool_timeout": 2.0, "env": env,
            "config": {"node_timeout": 2, "tool_timeout": 2, "lease_ttl": 2, "failpoints": "in_step_tx:tools=delay(2000)"},
        })
        # The tools step's statements have run and its transaction waits for COMMIT.
        wait_until("the tools step's transaction, open before COMMIT",
                   lambda: child.proc.poll() is not None
                   or (counts(effects)["slow"] == 1 and backend_pids(pg, dbname, app, "idle in transaction")))
        assert child.proc.poll() is None, child.output()
        proxy.freeze()
        res = child.result(BOUND)
        if res is None:
            failures.append(f"BROKEN (nothing hangs): ainvoke still blocked {BOUND:g}s after the network froze under its step "
                            "COMMIT, with node_timeout=2, tool_timeout=2, pool timeout=2: no error, no return")
        elif res.get("outcome") != "error" or not res.get("error_code"):
            failures.append(f"the run under a frozen COMMIT ended without a typed error: {res}")
        child.kill()  # a crash next to the pause; the server still holds the open transaction

        recover = cli(tmp_path, "recover", "recover", "--dsn", dsn, "--schema", schema, "--graph", "frozen_child:build",
                      "--json")
        recover_env_note = ""
        if not finished_within(recover, BOUND):
            failures.append(f"BROKEN (nothing hangs): `tenxgraph recover` (on_busy='reject', documented: 'it never "
                            f"waits') still blocked after {BOUND:g}s: the frozen connection's transaction holds the "
                            "thread's tenx_leases row FOR SHARE and its threads row FOR UPDATE, and the lease take "
                            f"waits for them without lock_timeout (lock waiters now: {lock_waiters(pg)})")
        proxy.thaw()  # the network comes back: the held COMMIT reaches the server
        if not finished_within(recover, 40):
            recover.kill()
            failures.append("`tenxgraph recover` did not finish 40 s after the network came back")
        recover_out = (tmp_path / "recover.out").read_text(errors="replace")
        status, roles = pg_roles(dsn, schema, thread)
        if status != "completed":  # recover skipped or failed it: one more resume, as an operator would
            resume = Child(tmp_path, "resume", {"mode": "run", "resume": True, "dsn": dsn, "schema": schema, "thread": thread,
                                                "env": env, "config": {"node_timeout": 5, "tool_timeout": 5}})
            r = resume.result(40)
            resume.kill()
            status, roles = pg_roles(dsn, schema, thread)
            recover_env_note = f" (recover: {recover_out[-400:]!r}; resume: {r})"
        if status != "completed":
            failures.append(f"after the network came back the thread did not complete: {status}{recover_env_note}")
        c = counts(effects)
        if c["fast"] != 1 or c["slow"] != 1:
            failures.append(f"a finished tool ran again: {dict(c)} (ledger {ledger_calls(pg, dbname, schema, thread)})")
        check_versions(versions(pg, dbname, schema, thread), "blackhole", failures)
        if roles != reference_roles(tmp_path):
            failures.append(f"messages differ from an uninterrupted run: {roles}")
    finally:
        for p in (child, recover):
            if isinstance(p, Child):
                p.kill()
            elif p is not None and p.poll() is None:
                p.kill()
        proxy.stop()
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- 2. SIGSTOP of the backend at a COMMIT, every run entry point


@pytest.mark.timeout(150)
def test_backend_sigstop_at_commit_on_each_run_entry_point(pg: PostgresServer, db: tuple[str, str], tmp_path: Path) -> None:
    """The Postgres backend serving the run (pool of one connection, found by its
    application_name) is SIGSTOPped while the run's transaction waits for its COMMIT: the tools
    step for ``ainvoke`` and ``astream``, the input commit for ``invoke``. Each must end with a
    typed error within BOUND. Then each client is SIGKILLed while its backend is still stopped,
    the backends get SIGCONT, and each thread is resumed from a fresh process: it completes, a
    tool whose ledger row committed ran once, every state version once."""
    dbname, dsn = db
    cases = {
        "ainvoke": "in_step_tx:tools=delay(2000)",
        "astream": "in_step_tx:tools=delay(2000)",
        "invoke": "in_step_tx:__input__=delay(2000)",
    }
    failures: list[str] = []
    children: dict[str, Child] = {}
    stopped: dict[str, int] = {}
    envs: dict[str, tuple[dict[str, str], Path]] = {}
    try:
        for entry in cases:  # a schema per thread: the graph's message ids are fixed
            PgCheckpointer(dsn, schema=f"rt_stop_{entry}", enforce_user_isolation=False).setup()
        for entry, fp in cases.items():
            env, effects, _ = run_env(tmp_path, entry)
            envs[entry] = (env, effects)
            children[entry] = Child(tmp_path, f"run_{entry}", {
                "mode": "run", "entry": entry, "dsn": with_app_name(dsn, f"rt_stop_{entry}"), "schema": f"rt_stop_{entry}",
                "thread": f"t-{entry}", "pool_max": 1, "pool_timeout": 2.0, "env": env,
                "config": {"node_timeout": 2, "tool_timeout": 2, "lease_ttl": 2, "failpoints": fp},
            })
        for entry, child in children.items():
            effects = envs[entry][1]
            ready = (lambda e=effects: counts(e)["slow"] == 1) if "tools" in cases[entry] else (lambda: True)
            pids = wait_until(f"{entry}: its transaction open before COMMIT",
                              lambda c=child, r=ready, n=f"rt_stop_{entry}": c.proc.poll() is not None
                              or (r() and backend_pids(pg, dbname, n, "idle in transaction")))
            assert child.proc.poll() is None, child.output()
            os.kill(pids[0], signal.SIGSTOP)
            stopped[entry] = pids[0]
        t0 = time.monotonic()
        for entry, child in children.items():
            res = child.result(max(0.1, BOUND - (time.monotonic() - t0)))
            what = "input commit" if "__input__" in cases[entry] else "tools step commit"
            if res is None:
                failures.append(f"BROKEN (nothing hangs): {entry} still blocked {BOUND:g}s after the backend serving it "
                                f"froze at its {what} (node_timeout=2, tool_timeout=2, pool timeout=2)")
            elif res.get("outcome") != "error" or not res.get("error_code"):
                failures.append(f"{entry}: no typed error after its backend froze: {res}")
        for child in children.values():
            child.kill()  # SIGKILL the client while the server process is stopped
        for pid in stopped.values():
            os.kill(pid, signal.SIGCONT)
        for entry in cases:  # the frozen sessions see their dead clients and end
            wait_until(f"{entry}: the old session to end", lambda n=f"rt_stop_{entry}": not backend_pids(pg, dbname, n), 30)
        landed = {e: "call_slow" in ledger_calls(pg, dbname, f"rt_stop_{e}", f"t-{e}") for e in cases}
        has_input = {e: bool(versions(pg, dbname, f"rt_stop_{e}", f"t-{e}")) for e in cases}
        resumes = {}
        for entry in cases:
            env, _effects = envs[entry]
            # The thread continues from what the server kept; an input commit that never landed
            # is sent again (same message id), as a client that saw no answer would.
            resumes[entry] = Child(tmp_path, f"resume_{entry}", {
                "mode": "run", "resume": has_input[entry], "dsn": dsn,
                "schema": f"rt_stop_{entry}", "thread": f"t-{entry}", "env": env, "config": {"node_timeout": 10, "tool_timeout": 10}})
        ref = reference_roles(tmp_path)
        for entry, child in resumes.items():
            res = child.result(40)
            child.kill()
            status, roles = pg_roles(dsn, f"rt_stop_{entry}", f"t-{entry}")
            if status != "completed":
                failures.append(f"{entry}: the resume after SIGCONT did not complete: {status} {res}")
            c = counts(envs[entry][1])
            slow_ok = c["slow"] == 1 or (c["slow"] == 2 and not landed[entry])  # a row lost with its step: the window
            if c["fast"] != 1 or not slow_ok:
                failures.append(f"{entry}: a finished tool ran again: {dict(c)} (slow's row committed before the "
                                f"resume: {landed[entry]})")
            check_versions(versions(pg, dbname, f"rt_stop_{entry}", f"t-{entry}"), entry, failures)
            if roles != ref:
                failures.append(f"{entry}: messages differ from an uninterrupted run: {roles}")
    finally:
        for pid in stopped.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for child in children.values():
            child.kill()
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- 3. lease renewal stuck behind a frozen session; stop()


@pytest.mark.timeout(120)
def test_lease_renewal_stuck_behind_a_frozen_session_blocks_node_timeout_and_stop(
        pg: PostgresServer, db: tuple[str, str], tmp_path: Path) -> None:
    """While a tool runs, another session (an admin's psql, a frozen peer) holds the thread's
    lease row locked and is frozen (SIGSTOP). The run's lease renewal waits for the row with no
    lock_timeout or deadline, inside the loop that also watches node_timeout and stop: the run
    must still end within BOUND (node_timeout=2), and ``stop()`` (called in the run's own process,
    which signals the run at once) must still end it."""
    dbname, dsn = db
    schema, thread = "rt_renew", "t-renew"
    env, effects, marks = run_env(tmp_path, "renew", slow=20)
    PgCheckpointer(dsn, schema=schema, enforce_user_isolation=False).setup()
    failures: list[str] = []
    holder = child = None
    try:
        child = Child(tmp_path, "run", {
            "mode": "run", "dsn": with_app_name(dsn, "rt_renew"), "schema": schema, "thread": thread, "pool_max": 2,
            "pool_timeout": 2.0, "env": env, "stop_file": str(marks / "stop_now"),
            "config": {"node_timeout": 2, "tool_timeout": None, "lease_ttl": 0.9},
        })
        wait_until("slow_tool to start", lambda: (marks / "slow_started").exists() or child.proc.poll() is not None)
        assert child.proc.poll() is None, child.output()
        # A session that locks the row and then waits for its client (idle in transaction), whose
        # client then freezes: killed later, its server session ends and the lock goes with it.
        holder = frozen_child.lock_holder(psql_cmd(), dsn, "rt_holder",
                                          f"SELECT 1 FROM {schema}.tenx_leases WHERE thread_id = '{thread}' FOR UPDATE")
        os.kill(holder.pid, signal.SIGSTOP)  # the session holding the row freezes
        time.sleep(0.6)  # a renewal (every 0.3 s) is now waiting for the row
        (marks / "stop_now").touch()  # and the user calls stop()
        res = child.result(BOUND)
        astop_path = child.result_path.with_name("result.json.astop")
        astop = json.loads(astop_path.read_text()) if astop_path.exists() else None
        if res is None:
            failures.append(f"BROKEN (nothing hangs): the run neither timed out (node_timeout=2) nor stopped "
                            f"(stop() answered {astop}) within {BOUND:g}s while its lease renewal waited for a row "
                            f"lock held by a frozen session (lock waiters: {lock_waiters(pg)})")
        elif res.get("outcome") == "error" and res.get("error_code") not in ("NODE_TIMEOUT_001",):
            failures.append(f"unexpected error: {res}")
        sigcont_and_kill(holder.pid)  # the frozen session dies: its lock goes
        holder.wait(10)
        res = res or child.result(30)
        if res is None:
            failures.append("the run did not end even after the lock holder died")
        child.kill()
        resume = Child(tmp_path, "resume", {"mode": "run", "resume": True, "dsn": dsn, "schema": schema, "thread": thread,
                                            "env": {**env, "RT_SLOW": "0.2"}, "config": {"node_timeout": 10, "tool_timeout": 10}})
        r = resume.result(40)
        resume.kill()
        status, _roles = pg_roles(dsn, schema, thread)
        if status != "completed":
            failures.append(f"the resume after the lock was released did not complete: {status} {r}")
        c = counts(effects)
        if c["fast"] != 1 or c["slow"] != 1:
            failures.append(f"tool counts after the resume: {dict(c)} (fast had finished before the freeze)")
        check_versions(versions(pg, dbname, schema, thread), "renew", failures)
    finally:
        if holder is not None:
            sigcont_and_kill(holder.pid)
        if child is not None:
            child.kill()
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- 4. checkpointer calls on a frozen backend; setup behind a frozen migrator


@pytest.mark.timeout(120)
def test_checkpointer_calls_on_a_frozen_backend_and_setup_behind_a_frozen_migrator(
        pg: PostgresServer, db: tuple[str, str], tmp_path: Path) -> None:
    """Each call on its own checkpointer (pool of one connection) whose backend freezes (SIGSTOP)
    just after its previous statement: ``aget_state``, ``alist_messages``, ``aput_state``, the
    graph's ``astop``, ``arelease`` while a read is stuck; and ``setup()`` / a new worker's first
    call while a process that was migrating is frozen holding the migration advisory lock. Each
    must answer (a typed error) within BOUND (pool timeout 2 s); after the thaw, reads work."""
    dbname, dsn = db
    child = Child(tmp_path, "reads", {"mode": "reads", "dsn": dsn, "schema": "rt_reads", "thread": "t-reads",
                                      "psql": psql_cmd(), "guard": BOUND})
    try:
        res = child.result(BOUND + 60)
        assert res is not None, f"the reads child itself hung (its own guards failed): {child.output()}"
    finally:
        child.kill()
    failures = []
    for name, out in res["during"].items():
        if out["outcome"] == "caller_timeout":
            failures.append(f"BROKEN (nothing hangs): {name} never answered ({BOUND:g}s, the caller's own wait_for ended it)")
        elif out["outcome"] == "error" and not out.get("error_code"):
            failures.append(f"{name}: error without an error code: {out}")
    for name, out in res["after"].items():
        if out["outcome"] != "ok":
            failures.append(f"after the thaw, {name} failed: {out}")
    assert not failures, "\n".join(failures) + "\n" + json.dumps(res, indent=1)


# --------------------------------------------------------------------------- 5. an async tool that ignores its cancellation


@pytest.mark.timeout(60)
def test_async_tool_ignoring_cancellation_is_not_fired_again_by_the_resume(tmp_path: Path) -> None:
    """An async tool catches CancelledError and keeps going (a broad ``except BaseException``, a
    retry loop, a library doing the same), then finishes its side effect and returns. node_timeout
    must end the run within BOUND with NODE_TIMEOUT_001; and once the tool has finished, the
    documented resume (``ainvoke({}, config)``) must not fire it again: a sync tool's late result
    is recorded in the ledger for exactly this reason (docs/production.md)."""
    from tenxgraph import END, START, AgentState, Message, StateGraph
    from tenxgraph.core.graph.tool_node import ToolNode

    effects: list[str] = []
    cancels: list[int] = []

    async def stubborn_charge(amount: int) -> str:
        """Charge the card (ignores cancellation)."""
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                cancels.append(1)
        effects.append("charged")
        return f"charged {amount}"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("charging", role="assistant", message_id="assistant-charge")
            msg.tools_calls = [frozen_child.tool_call("call_charge", "stubborn_charge", amount=5)]
            return msg
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([stubborn_charge]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=SqliteCheckpointer(tmp_path / "cp.db"))
    cfg = {"thread_id": "t-stubborn", "user_id": USER}

    async def scenario() -> tuple[BaseException | None, float, list[str], Any]:
        t0 = time.monotonic()
        err: BaseException | None = None
        try:
            await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("pay", message_id="u1")]},
                                               dict(cfg, node_timeout=1, tool_timeout=None)), BOUND + 20)
        except (NodeTimeoutError, asyncio.TimeoutError) as e:
            err = e
        elapsed = time.monotonic() - t0
        deadline = time.monotonic() + 10
        while not effects and time.monotonic() < deadline:  # the cut-off call finishes on its own
            await asyncio.sleep(0.05)
        before = list(effects)
        resumed = await asyncio.wait_for(app.ainvoke({}, dict(cfg, node_timeout=10, tool_timeout=10), "full"), BOUND + 20)
        return err, elapsed, before, resumed

    err, elapsed, before, resumed = asyncio.run(scenario())
    failures = []
    if not isinstance(err, NodeTimeoutError) or err.error_code != "NODE_TIMEOUT_001" or elapsed > BOUND:
        failures.append(f"node_timeout=1 did not end the run with NODE_TIMEOUT_001 within {BOUND:g}s: {err!r} after {elapsed:.1f}s")
    assert before == ["charged"], f"the cut-off call never finished its side effect: {before} (cancels seen {len(cancels)})"
    if effects != ["charged"]:
        failures.append(f"BROKEN (a finished tool is never fired again): the tool finished (its effect happened and it "
                        f"returned) after node_timeout cut the run off; its result was not recorded, and the resume "
                        f"fired it again: effects {effects}")
    if str(resumed["state"].execution_meta.status) != "completed":
        failures.append(f"the resume did not complete: {resumed['state'].execution_meta}")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- 6. a sync tool blocked in a C call


@pytest.mark.timeout(60)
def test_sync_tool_blocked_forever_run_ends_and_process_exits(tmp_path: Path) -> None:
    """A sync tool blocks in ``time.sleep(3600)`` (a C call no deadline can interrupt). Sync
    ``invoke`` with tool_timeout=1 must return within BOUND (the model is told the tool timed
    out). Then the program's main function returns: the process must exit within BOUND.
    Before session 18 the process waited for such threads at exit for ever; now for
    TENXGRAPH_SYNC_TOOL_EXIT_GRACE (10 s by default), then it exits."""
    env, effects, marks = run_env(tmp_path, "sync")
    child = Child(tmp_path, "sync", {"mode": "run", "graph": "blocked_sync", "entry": "invoke",
                                     "sqlite": str(tmp_path / "cp.db"), "thread": "t-sync", "env": env,
                                     "config": {"node_timeout": 30, "tool_timeout": 1}})
    try:
        res = child.result(BOUND + 5)
        assert res is not None, f"sync invoke did not return within {BOUND + 5:g}s with tool_timeout=1: {child.output()}"
        assert res.get("outcome") == "ok" and res.get("status") == "completed", res
        returned = time.monotonic()
        exited = finished_within(child.proc, BOUND)
        assert exited, (f"the process did not exit {BOUND:g}s after its main function returned: it waits for the "
                        "sync tool's thread (documented in docs/production.md, but a hang: a worker that cannot "
                        f"exit until the tool returns; waited {time.monotonic() - returned:.1f}s)")
    finally:
        child.kill()


# --------------------------------------------------------------------------- 7. SQLite: another process holds the write lock


@pytest.mark.timeout(90)
def test_sqlite_write_lock_held_by_another_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process (plain sqlite3) holds BEGIN EXCLUSIVE on the checkpointer's file. A run
    must fail within BOUND + SQLite's 10 s busy timeout with a typed error, writing nothing; reads
    go on (WAL); once the lock is gone the same input runs to completion, each tool once."""
    from tenxgraph import Message

    effects = tmp_path / "effects.txt"
    monkeypatch.setenv("RT_EFFECTS", str(effects))
    monkeypatch.setenv("RT_SLOW", "0.2")
    db = tmp_path / "cp.db"
    cp = SqliteCheckpointer(db)
    app = frozen_child.build(cp)
    cfg = {"thread_id": "t-sqlite", "user_id": USER}
    asyncio.run(app.ainvoke({"messages": [Message.text_message("first", message_id="u0")]}, dict(cfg)))  # a thread to read
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys\n"
        f"con = sqlite3.connect({str(db)!r}, timeout=30, isolation_level=None)\n"
        "con.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    failures = []
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        before = counts(effects)

        async def during() -> tuple[Any, float, float]:
            t0 = time.monotonic()
            state = await asyncio.wait_for(cp.aget_state(dict(cfg)), BOUND)
            assert state is not None, "the thread's first turn is not readable while another process writes"
            read = time.monotonic() - t0
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("second", message_id="u1")]},
                                                   dict(cfg, node_timeout=2, tool_timeout=2)), BOUND + 30)
                return None, read, time.monotonic() - t0
            except (StorageError, asyncio.TimeoutError) as e:
                return e, read, time.monotonic() - t0

        err, read, elapsed = asyncio.run(during())
        if read > 2:
            failures.append(f"aget_state under a held write lock took {read:.1f}s")
        if not isinstance(err, StorageError) or not err.error_code:
            failures.append(f"no typed error from a run on a locked SQLite file: {err!r} after {elapsed:.1f}s")
        elif err.error_code != "STORAGE_TRANSIENT_001":
            # Another writer holding the file is worth a retry, as an unreachable server is: the
            # caller must be able to tell that from a refused write (it was STORAGE_001).
            failures.append(f"a locked SQLite file is {err.error_code}, not STORAGE_TRANSIENT_001: {err}")
        elif elapsed > BOUND + 10:
            failures.append(f"{err.error_code} only after {elapsed:.1f}s (bound: busy timeout 10 s + {BOUND:g}s)")
        if counts(effects) != before:
            failures.append(f"tools ran although the input could not be committed: {counts(effects) - before}")
    finally:
        holder.kill()
        holder.wait(10)
    out = asyncio.run(app.ainvoke({"messages": [Message.text_message("second", message_id="u1")]}, dict(cfg), "full"))
    if str(out["state"].execution_meta.status) != "completed":
        failures.append(f"after the lock was released the turn did not complete: {out['state'].execution_meta}")
    c = counts(effects)
    if c["fast"] != 2 or c["slow"] != 2:  # once per turn
        failures.append(f"tool counts over two turns: {dict(c)}")
    print(f"SQLite locked by another process: {err!r} after {elapsed:.1f}s; aget_state meanwhile {read:.2f}s")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- 8. redis-server frozen (Postgres + Redis)


@pytest.mark.timeout(90)
def test_redis_frozen_runs_go_on_and_stop_from_another_process_works(
        pg: PostgresServer, db: tuple[str, str], redis: RedisServer, tmp_path: Path) -> None:
    """redis-server is SIGSTOPped (connections stay open, nothing answers). With the
    Postgres+Redis backend: `tenxgraph stop` from another process ends a hung node of a run in a
    third process within BOUND; a full tool turn in this process completes within BOUND; after
    SIGCONT a new turn on the stopped thread runs to completion (no stale stop request)."""
    from tenxgraph import Message

    dbname, dsn = db
    schema = "rt_redis"
    PgCheckpointer(dsn, redis_url=redis.url, schema=schema, enforce_user_isolation=False).setup()
    env, effects, marks = run_env(tmp_path, "redis")
    failures: list[str] = []
    assert redis.pid
    child = Child(tmp_path, "hang", {"mode": "run", "graph": "hang", "dsn": dsn, "redis": redis.url, "schema": schema,
                                     "thread": "t-hang", "env": {**env, "RT_HANG": "1"}, "config": {"node_timeout": None}})
    frozen = False
    try:
        wait_until("the hung node to start", lambda: (marks / "hang_started").exists() or child.proc.poll() is not None)
        assert child.proc.poll() is None, child.output()
        time.sleep(0.3)  # the run has polled Redis for stop requests at least once
        os.kill(redis.pid, signal.SIGSTOP)
        frozen = True
        t0 = time.monotonic()
        stop = cli(tmp_path, "stop", "stop", "t-hang", "--user", USER, "--dsn", dsn, "--schema", schema,
                   "--redis-url", redis.url)
        if not finished_within(stop, BOUND):
            stop.kill()
            failures.append(f"BROKEN: `tenxgraph stop` blocked {BOUND:g}s on a frozen Redis")
        elif stop.returncode != 0:
            failures.append(f"`tenxgraph stop` exit {stop.returncode}: {(tmp_path / 'stop.out').read_text()[-500:]}")
        res = child.result(max(0.1, BOUND - (time.monotonic() - t0)) + 2)
        if res is None:
            failures.append(f"BROKEN: a hung node was not stopped within {BOUND:g}s while Redis was frozen")
        elif res.get("outcome") != "ok" or res.get("stop") != "stopped":
            failures.append(f"the stopped run: {res}")

        cp = PgCheckpointer(dsn, redis_url=redis.url, schema=schema, enforce_user_isolation=False)
        t0 = time.monotonic()

        async def turn(thread: str, msg_id: str, graph: Callable[[Any], Any] = frozen_child.build) -> str:
            r = await asyncio.wait_for(graph(cp).ainvoke(
                {"messages": [Message.text_message("do it", message_id=msg_id)]},
                {"thread_id": thread, "user_id": USER, "node_timeout": 5, "tool_timeout": 5}, "full"), BOUND + 20)
            return str(r["state"].execution_meta.status)

        monkey_env = {k: os.environ.get(k) for k in ("RT_EFFECTS", "RT_SLOW")}
        os.environ["RT_EFFECTS"], os.environ["RT_SLOW"] = str(effects), "0.2"
        try:
            status = asyncio.run(turn("t-during", "u-during"))
            took = time.monotonic() - t0
            if status != "completed" or took > BOUND:
                failures.append(f"a tool turn with Redis frozen: {status} after {took:.1f}s")
            os.kill(redis.pid, signal.SIGCONT)
            frozen = False
            time.sleep(2.5)  # past the runtime's Redis retry delay (2 s)
            t0 = time.monotonic()
            status = asyncio.run(turn("t-hang", "u-after", frozen_child.hang_graph))
            took = time.monotonic() - t0
            if status != "completed" or took > BOUND:
                failures.append(f"a new turn on the stopped thread after SIGCONT: {status} after {took:.1f}s")
        finally:
            for k, v in monkey_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        c = counts(effects)
        if c["fast"] != 1 or c["slow"] != 1:
            failures.append(f"tool counts: {dict(c)}")
    finally:
        if frozen:
            os.kill(redis.pid, signal.SIGCONT)
        child.kill()
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("key", ["command_timeout", "statement_timeout", "lock_timeout"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), True, "30", {}, [1]])
def test_a_bad_deadline_is_refused_before_anything_connects(key: str, value: Any) -> None:
    """The deadlines are positive numbers of seconds: anything else is InvalidConfigError
    STORAGE_CONFIG_002 at construction (no "no deadline": a statement the server never answers
    would hang its run for ever). The DSN points nowhere: nothing was tried."""
    from tenxgraph.core.exceptions import InvalidConfigError

    with pytest.raises(InvalidConfigError) as err:
        PgCheckpointer("postgresql://nobody@127.0.0.1:1/none", pool_config={key: value})
    assert err.value.error_code == "STORAGE_CONFIG_002"
    assert err.value.context["field"] == key


@pytest.mark.parametrize("value", [1, 2.5, 10**400, float("inf")])
def test_a_good_deadline_is_taken(value: Any) -> None:
    """Ints, floats, and values past a float's range (cut to 1e9 s) are taken."""
    cp = PgCheckpointer("postgresql://nobody@127.0.0.1:1/none", pool_config={"command_timeout": value, "lock_timeout": value})
    assert cp is not None
