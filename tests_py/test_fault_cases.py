"""Fault cases: Postgres connections cut (or refused) by a TCP proxy the test runs, and SQLite on a
full filesystem.

Each test runs model -> tools (fast_tool and slow_tool in parallel) -> model -> END. fast_tool
returns at once (its ledger row commits); slow_tool sleeps ~1 s, and the fault is injected while it
sleeps. Then: the run completes or fails with a clear StorageError (bounded: no hang); a resume
(``ainvoke({}, cfg)``) completes; a tool whose ledger row was committed ran exactly once; the final
messages equal those of an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.exceptions import StorageError, TransientStorageError
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
from tenxgraph.testing import EffectCounter

from tests_py.tool_graphs import call, tool_graph

CALLS = [[call("call_fast", "fast_tool", {"x": 2}), call("call_slow", "slow_tool", {"x": 3})]]


# --------------------------------------------------------------------------- the graph


def make_app(checkpointer: Any, effects: EffectCounter, started: threading.Event, release: threading.Event | None = None):
    async def fast_tool(x: int) -> str:
        """Return x doubled."""
        effects.record("fast")
        return f"fast {2 * x}"

    async def slow_tool(x: int) -> str:
        """Return x tripled, after ~1 s (or after ``release``)."""
        started.set()
        if release is None:
            await asyncio.sleep(1.0)
        else:
            deadline = time.monotonic() + 20
            while not release.is_set():
                assert time.monotonic() < deadline, "slow_tool never released"
                await asyncio.sleep(0.01)
        effects.record("slow")
        return f"slow {3 * x}"

    return tool_graph(AgentState, [fast_tool, slow_tool], CALLS, checkpointer=checkpointer)


def summary(messages: list[Message]) -> list[tuple[str, str, Any]]:
    """(role, text, tool results by call id) per message: what an uninterrupted run must equal."""
    out = []
    for m in messages:
        results = sorted((b.call_id, str(b.output)) for b in m.content if getattr(b, "type", None) == "tool_result")
        calls = sorted(c["id"] for c in (m.tools_calls or []))
        out.append((m.role, m.text(), results, calls))
    return out


async def wait_for(what: str, check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


# --------------------------------------------------------------------------- 1. TCP proxy in front of Postgres


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CuttingProxy:
    """TCP proxy 127.0.0.1:port -> target, on its own thread and event loop.

    ``cut()`` closes both sides of every proxied connection (the listener stays up);
    ``refuse(seconds)`` also closes the listener, so connects are refused (RST), and reopens it
    on the same port after ``seconds``.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.base_events.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.accepted = 0
        self.cuts = 0
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._call(self._listen())

    def _call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self.writers |= {cw, sw}

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                w.close()

        await asyncio.gather(pump(cr, sw), pump(sr, cw))
        self.writers -= {cw, sw}

    async def _cut(self) -> int:
        n = len(self.writers)
        for w in list(self.writers):
            sock = w.get_extra_info("socket")
            try:  # RST-free hard close of both directions
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            w.close()
        self.writers.clear()
        self.cuts += 1
        return n

    def cut(self) -> int:
        return self._call(self._cut())

    async def _close_listener(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    def refuse(self) -> None:
        self._call(self._close_listener())

    def accept_again(self) -> None:
        self._call(self._listen())

    def stop(self) -> None:
        try:
            self._call(self._cut())
            self._call(self._close_listener())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except ConnectionRefusedError:
        return True


@pytest.fixture
def proxy(pg_dsn: str) -> Iterator[tuple[CuttingProxy, str]]:
    parts = urlsplit(pg_dsn)
    p = CuttingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    proxied = urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{p.port}"))
    try:
        yield p, proxied
    finally:
        p.stop()


def calls_of(keys: list[str]) -> list[str]:
    """Ledger keys are "<assistant message id>:<call id>"."""
    return sorted(str(json.loads(k)[1]) for k in keys)  # keys are ["<message id>", "<call id>"]


def pg_ledger(tenx_postgres, pg_dsn: str, schema: str, thread: str) -> list[str]:
    dbname = urlsplit(pg_dsn).path.lstrip("/")
    out = tenx_postgres.psql(
        f"SELECT tool_call_id FROM {schema}.tool_executions WHERE thread_id = '{thread}' AND result->>'__kind__' IS DISTINCT FROM 'started' ORDER BY 1", dbname=dbname
    )
    return [line.strip() for line in out.splitlines() if line.strip()]


async def reference_messages(checkpointer: Any, tmp_path: Path) -> list:
    """The messages of an uninterrupted run of the same graph."""
    app = make_app(checkpointer, EffectCounter(tmp_path / "ref_effects.jsonl"), threading.Event())
    cfg = {"thread_id": f"ref-{uuid.uuid4().hex[:8]}", "user_id": "u"}
    await app.ainvoke({"messages": [Message.text_message("do it", message_id="u1")]}, dict(cfg))
    return summary(await checkpointer.alist_messages(cfg))


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["cut", "cut-and-refuse-2s"])
async def test_pg_connections_cut_by_proxy_mid_run(
    proxy: tuple[CuttingProxy, str], pg_dsn: str, tenx_postgres, tmp_path: Path, fault: str
) -> None:
    p, proxied_dsn = proxy
    schema = "fault_" + fault.replace("-", "_")
    cp = PgCheckpointer(proxied_dsn, schema=schema, pool_config={"timeout": 5}, enforce_user_isolation=False)
    await cp.asetup()  # connects (the constructor does not)
    assert p.accepted >= 1, "the checkpointer did not connect through the proxy"
    effects = EffectCounter(tmp_path / "effects.jsonl")
    started = threading.Event()
    app = make_app(cp, effects, started)
    thread = "t-cut"
    cfg = {"thread_id": thread, "user_id": "u"}

    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("do it", message_id="u1")]}, dict(cfg)))
    await wait_for("slow_tool to start", lambda: started.is_set() or run.done())
    assert not run.done(), run.exception()
    await asyncio.sleep(0.3)  # fast_tool's ledger row has (normally) committed by now
    cut = p.cut()
    assert cut >= 1, "no proxied connection was open to cut"
    if fault == "cut-and-refuse-2s":
        p.refuse()
        assert refused(p.port)
        await asyncio.sleep(2.0)
        p.accept_again()

    first_error: BaseException | None = None
    try:
        await asyncio.wait_for(run, 30)
    except asyncio.TimeoutError:
        pytest.fail("BUG: the run hung for 30 s after its connections were cut")
    except StorageError as e:  # TransientStorageError is a StorageError
        first_error = e
    if first_error is not None:
        assert str(first_error), "storage error without a message"

    ledger_before = pg_ledger(tenx_postgres, pg_dsn, schema, thread)
    if first_error is not None:  # (a resume of a completed thread would run the graph again)
        resumed = await asyncio.wait_for(app.ainvoke({}, dict(cfg), "full"), 30)
        assert str(resumed["state"].execution_meta.status) == "completed", (first_error, resumed)
    assert p.accepted > 1, "the runtime never reconnected through the proxy"

    counts = effects.counts()
    for key in ledger_before:
        tool = json.loads(key)[1].rsplit("_", 1)[1]
        assert counts.get(tool) == 1, (key, counts, first_error)
    assert 1 <= counts.get("fast", 0) <= 2 and 1 <= counts.get("slow", 0) <= 2, counts
    assert calls_of(pg_ledger(tenx_postgres, pg_dsn, schema, thread)) == ["call_fast", "call_slow"]

    msgs = summary(await cp.alist_messages(cfg))
    assert msgs == await reference_messages(SqliteCheckpointer(tmp_path / "ref.db"), tmp_path), (first_error, msgs)


# --------------------------------------------------------------------------- 2. SQLite on a full disk


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A ~1 MB filesystem mounted at tmp_path/small (tmpfs, else an ext2 loop file)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    failures = []
    res = _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt))
    if res.returncode != 0:
        failures.append(f"mount -t tmpfs: {res.stderr.strip() or res.returncode}")
        img = tmp_path / "small.img"
        with open(img, "wb") as f:
            f.truncate(2 * 1024 * 1024)
        mk = _run("mkfs.ext2", "-q", "-F", str(img)) if shutil.which("mkfs.ext2") else None
        if mk is None or mk.returncode != 0:
            failures.append(f"mkfs.ext2: {'not installed' if mk is None else mk.stderr.strip()}")
            pytest.skip("no small filesystem: " + "; ".join(failures))
        res = _run("mount", "-o", "loop", str(img), str(mnt))
        if res.returncode != 0:
            failures.append(f"mount -o loop: {res.stderr.strip() or res.returncode}")
            pytest.skip("no small filesystem: " + "; ".join(failures))
    try:
        yield mnt
    finally:
        r = _run("umount", str(mnt))
        if r.returncode != 0:
            _run("umount", "-l", str(mnt))


def fill(directory: Path) -> Path:
    """Writes directory/filler until ENOSPC; returns its path."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
        for size in (512, 64, 1):  # fill the last partial block too
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


def sqlite_ledger(db: Path, thread: str) -> list[str]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return [r[0] for r in con.execute(
            "SELECT tool_call_id FROM tool_executions WHERE thread_id = ? AND json_extract(result, '$.__kind__') IS NOT 'started' ORDER BY 1", (thread,))]
    finally:
        con.close()


@pytest.mark.asyncio
async def test_sqlite_disk_full_mid_run(small_fs: Path, tmp_path: Path) -> None:
    db = small_fs / "cp.db"
    cp = SqliteCheckpointer(db)
    effects = EffectCounter(tmp_path / "effects.jsonl")  # not on the small filesystem
    thread = "t-full"
    cfg = {"thread_id": thread, "user_id": "u"}

    started, release = threading.Event(), threading.Event()
    app = make_app(cp, effects, started, release)
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("do it", message_id="u1")]}, dict(cfg)))
    await wait_for("slow_tool to start", lambda: started.is_set() or run.done())
    assert not run.done(), run.exception()
    await wait_for("fast_tool's ledger row", lambda: calls_of(sqlite_ledger(db, thread)) == ["call_fast"]
                   or run.done())
    before_state = await cp.aget_state(cfg)
    before_msgs = summary(await cp.alist_messages(cfg))
    assert before_state is not None and before_msgs, "nothing committed before the disk filled"

    filler = fill(small_fs)
    release.set()
    with pytest.raises(StorageError) as ei:
        await asyncio.wait_for(run, 30)
    err = ei.value
    text = str(err).lower()
    assert getattr(err, "error_code", None) == "STORAGE_001", (type(err), getattr(err, "error_code", None), str(err))
    assert "full" in text or "disk" in text or "space" in text, str(err)

    # Nothing half-written: the thread reads back exactly as before the failed commit.
    after_msgs = summary(await cp.alist_messages(cfg))
    assert after_msgs == before_msgs
    after_state = await cp.aget_state(cfg)
    assert after_state is not None
    assert summary(after_state.context) == summary(before_state.context)
    assert calls_of(sqlite_ledger(db, thread)) == ["call_fast"]

    filler.unlink()
    resumed = await asyncio.wait_for(app.ainvoke({}, dict(cfg), "full"), 30)
    assert str(resumed["state"].execution_meta.status) == "completed"
    counts = effects.counts()
    assert counts.get("fast") == 1, counts  # its ledger row committed before the disk filled
    assert counts.get("slow") in (1, 2), counts  # its result was never recorded: at-least-once
    assert calls_of(sqlite_ledger(db, thread)) == ["call_fast", "call_slow"]
    ref = await reference_messages(SqliteCheckpointer(tmp_path / "ref.db"), tmp_path)
    assert summary(await cp.alist_messages(cfg)) == ref
