"""The checkpointer's SQLite file opened with Python's ``sqlite3`` (a second SQLite library) in the
same process. Before src/store/sqlite_locks.rs the two copies could not see each other's POSIX
locks and closing the stdlib connection dropped ours: the stdlib copy checkpointed and deleted the
WAL under the runtime, whose next step failed with ``disk I/O error`` (522)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer

TABLES = ("threads", "states", "messages", "tool_executions")


async def answer(state: AgentState, config: dict[str, Any]) -> Message:
    return Message.text_message(f"seen {len(state.context)}", role="assistant")


def build(path: Path) -> tuple[Any, SqliteCheckpointer]:
    g = StateGraph(AgentState())
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    cp = SqliteCheckpointer(path)
    return g.compile(checkpointer=cp), cp


def stdlib_read(path: Path) -> dict[str, int]:
    c = sqlite3.connect(path, timeout=10)
    try:
        return {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        c.close()


def integrity(path: Path) -> str:
    c = sqlite3.connect(path, timeout=10)
    try:
        return c.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        c.close()


@pytest.mark.asyncio
async def test_200_turns_with_stdlib_connections_opened_read_and_closed_between_them(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    app, cp = build(path)
    for turn in range(200):
        out = await app.ainvoke({"messages": [Message.text_message(f"turn {turn}")]}, {"thread_id": "t"})
        assert out["messages"][-1].text() == f"seen {2 * turn + 1}", turn
        counts = stdlib_read(path)
        # The stdlib copy sees every committed step, so it reads the same file, not a stale one.
        assert counts["messages"] == 2 * (turn + 1), (turn, counts)
    state = await cp.aget_state({"thread_id": "t"})
    assert len(state.context) == 400
    await cp.arelease()
    assert integrity(path) == "ok"


@pytest.mark.asyncio
async def test_stdlib_reads_and_writes_the_file_while_the_runtime_uses_it(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    app, cp = build(path)
    await app.ainvoke({"messages": [Message.text_message("first")]}, {"thread_id": "t"})  # tables exist
    c = sqlite3.connect(path, timeout=10)
    c.execute("CREATE TABLE scratch (n INTEGER NOT NULL)")
    c.commit()
    c.close()

    stop = threading.Event()
    inserted: list[int] = []
    errors: list[BaseException] = []

    def admin() -> None:
        # An admin view of the live file: a connection per look, each one reading and writing.
        # Paced like a person or a dashboard: a tight loop of writers starves the runtime's
        # writer in SQLite's busy handler (retries in no order), as any two writers would.
        n = 0
        try:
            while not stop.is_set():
                conn = sqlite3.connect(path, timeout=10)
                try:
                    conn.execute("SELECT count(*) FROM messages").fetchone()
                    conn.execute("INSERT INTO scratch (n) VALUES (?)", (n,))
                    conn.commit()
                    inserted.append(n)
                    n += 1
                finally:
                    conn.close()
                stop.wait(0.01)
        except BaseException as e:  # reported to the test below
            errors.append(e)

    worker = threading.Thread(target=admin, daemon=True)
    worker.start()
    try:
        # At least 100 turns, and on until the admin has written 20 times meanwhile: the overlap
        # is made, not hoped for from timing (on a loaded machine 100 turns overlapped 10 writes).
        turn = 0
        while turn < 100 or (len(inserted) < 20 and not errors):
            turn += 1
            assert turn <= 20_000, f"the admin thread wrote {len(inserted)} times in {turn} turns"
            out = await app.ainvoke({"messages": [Message.text_message(f"turn {turn}")]}, {"thread_id": "t"})
            assert out["messages"][-1].text() == f"seen {2 * turn + 1}", turn
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert not errors, errors
    assert len(inserted) >= 20  # they really overlapped
    state = await cp.aget_state({"thread_id": "t"})
    assert len(state.context) == 2 + 2 * turn
    await cp.arelease()
    c = sqlite3.connect(path, timeout=10)
    assert [r[0] for r in c.execute("SELECT n FROM scratch ORDER BY n")] == inserted
    c.close()
    assert integrity(path) == "ok"


@pytest.mark.asyncio
async def test_stdlib_sees_the_runtime_holding_the_file(tmp_path: Path) -> None:
    """Leaving WAL needs every other connection gone. The runtime's open connections must count,
    so the stdlib copy is refused instead of switching the file's journal mode under them."""
    path = tmp_path / "shared.db"
    app, cp = build(path)
    await app.ainvoke({"messages": [Message.text_message("first")]}, {"thread_id": "t"})
    c = sqlite3.connect(path, timeout=0.2)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            c.execute("PRAGMA journal_mode=DELETE").fetchone()
    finally:
        c.close()
    out = await app.ainvoke({"messages": [Message.text_message("second")]}, {"thread_id": "t"})
    assert out["messages"][-1].text() == "seen 3"
    await cp.arelease()
    assert integrity(path) == "ok"


_WRITER = """
import asyncio, sqlite3, sys, time
from pathlib import Path
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer

async def answer(state, config):
    return Message.text_message(f"seen {len(state.context)}", role="assistant")

path, me, other, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
g = StateGraph(AgentState())
g.add_node("answer", answer)
g.add_edge(START, "answer")
g.add_edge("answer", END)
cp = SqliteCheckpointer(path)
app = g.compile(checkpointer=cp)

async def main():
    await app.ainvoke({"messages": [Message.text_message("open")]}, {"thread_id": me})
    # Both processes have the file open before either starts its turns.
    Path(path + "." + me + ".ready").touch()
    deadline = time.monotonic() + 90
    while not Path(path + "." + other + ".ready").exists():
        assert time.monotonic() < deadline, "the other writer never got ready"
        await asyncio.sleep(0.01)
    for turn in range(1, turns + 1):
        out = await app.ainvoke({"messages": [Message.text_message(f"turn {turn}")]}, {"thread_id": me})
        assert out["messages"][-1].text() == f"seen {2 * turn + 1}", (turn, out["messages"][-1].text())
        c = sqlite3.connect(path, timeout=10)
        c.execute("SELECT count(*) FROM messages WHERE thread_id = ?", (me,)).fetchone()
        c.close()
    state = await cp.aget_state({"thread_id": me})
    print(len(state.context))
    await cp.arelease()

asyncio.run(main())
"""


def test_two_processes_write_the_file_while_each_also_reads_it_with_stdlib(tmp_path: Path) -> None:
    from tenxgraph.testing.crash import child_env

    path = tmp_path / "shared.db"
    turns = 100
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), me, other, str(turns)], env=child_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me, other in (("a", "b"), ("b", "a"))]
    results = [p.communicate(timeout=300) for p in procs]
    failed = [(p.returncode, err[-1500:]) for p, (_, err) in zip(procs, results) if p.returncode != 0]
    assert not failed, failed
    assert [out.strip() for out, _ in results] == [str(2 * (turns + 1))] * 2
    assert integrity(path) == "ok"
    counts = stdlib_read(path)
    assert counts["messages"] == 2 * 2 * (turns + 1), counts


def fds_under(d: Path) -> list[str]:
    out = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink()
        except OSError:
            continue  # the listing's own descriptor, gone already
        if str(target).startswith(str(d)):
            out.append(str(target))
    return out


@pytest.mark.asyncio
async def test_a_stdlib_read_transaction_survives_the_runtime_closing_and_reopening_the_file(tmp_path: Path) -> None:
    """Closing any descriptor drops every POSIX lock the process holds on the file, the stdlib
    copy's included. The runtime closing all its connections (release; a pool's idle timeout) must
    not take the stdlib reader's WAL read mark with it: the reopened runtime would reset the
    -shm and restart the WAL over frames the reader's snapshot still uses."""
    path = tmp_path / "shared.db"
    app, cp = build(path)
    for turn in range(20):
        await app.ainvoke({"messages": [Message.text_message(f"before {turn} " * 50)]}, {"thread_id": "t"})
    held = sqlite3.connect(path, timeout=10, isolation_level=None)
    held.execute("BEGIN")
    assert held.execute("SELECT count(*) FROM threads").fetchone()[0] == 1  # the snapshot starts
    await cp.arelease()  # every connection of the runtime closes
    app, cp = build(path)
    for turn in range(100):
        out = await app.ainvoke({"messages": [Message.text_message(f"after {turn} " * 200)]}, {"thread_id": f"u{turn % 5}"})
        assert out["messages"][-1].text() == f"seen {2 * (turn // 5) + 1}", turn
    # Still the snapshot taken at BEGIN: the 40 messages of thread t, nothing written since.
    assert held.execute("SELECT count(*), count(DISTINCT thread_id) FROM messages").fetchone() == (40, 1)
    held.execute("COMMIT")
    held.execute("CREATE TABLE scratch (n INTEGER NOT NULL)")
    held.execute("INSERT INTO scratch (n) VALUES (7)")
    assert held.execute("SELECT count(*) FROM messages").fetchone()[0] == 240
    held.close()
    state = await cp.aget_state({"thread_id": "u4"})
    assert len(state.context) == 40
    await cp.arelease()
    # Descriptors kept open while the stdlib locks lived are closed by now.
    assert fds_under(tmp_path) == []
    c = sqlite3.connect(path, timeout=10)
    assert c.execute("SELECT n FROM scratch").fetchall() == [(7,)]
    c.close()
    assert integrity(path) == "ok"
