"""The wake hub (src/py/driver.rs, tenxgraph._bridge): one socket pair per loop thread, watched by
every loop that awaits a native call on that thread. A thread's sockets outlive the thread (the
next thread takes them), so a loop that awaited on an ended thread keeps no stale record of a fd
number that another library's socket could get; no fd leaks per thread; a forked child makes
its own."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph, _core
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

HANG = 30  # seconds: a bound on a hang, never expected to be reached


def tiny_app(checkpointer: Any = None) -> Any:
    async def reply(state: AgentState) -> str:
        return "ok"

    g = StateGraph(AgentState)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=checkpointer or InMemoryCheckpointer())


def sqlite_app(path: Path) -> tuple[Any, Any]:
    """A tiny graph on SQLite: every store call completes on the driver's own threads, so each
    await is woken through the loop thread's hub."""
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    cp: Any = SqliteCheckpointer(path)
    return tiny_app(cp), cp


async def one_run(app: Any, tid: str) -> str:
    out = await app.ainvoke({"messages": [Message.text_message(tid)]}, {"thread_id": tid})
    return out["messages"][-1].text()


def in_thread(fn: Any) -> Any:
    """Runs ``fn`` on a new thread to its end; returns its result or raises its exception."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised below
            box["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the thread did not end"
    exited(t)
    if "error" in box:
        raise box["error"]
    return box["value"]


def exited(t: threading.Thread) -> None:
    """Waits (30 s at most) until ``t``'s OS thread is gone: ``join`` returns when its Python
    part is done, before the thread's Rust TLS destructors (which give its hub back) have run."""
    task = f"/proc/self/task/{t.native_id}"
    for _ in range(30_000):
        if not os.path.exists(task):
            return
        time.sleep(0.001)
    raise AssertionError(f"thread {t.native_id} still exists")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_loop_that_awaited_on_an_ended_thread_does_not_swallow_another_sockets_reader() -> None:
    """A loop awaits on thread A; A ends; the loop runs on thread B, where another library's
    socket is watched with add_reader on the same loop. Before: A's wake socket closed with A, the
    loop still listed its fd number, a socket given that number was "already registered" (asyncio
    swapped the callback, no epoll_ctl) and its reader never ran: a hang."""
    loop = asyncio.new_event_loop()
    app = tiny_app()
    try:
        def on_a() -> tuple[int, int]:
            fd = _core.wake_hub_fileno()
            assert loop.run_until_complete(one_run(app, "hub-a")) == "ok"
            return fd, os.fstat(fd).st_ino

        hub_fd, hub_ino = in_thread(on_a)
        gc.collect()  # drivers of A's run (each holds A's hub) are gone

        def on_b() -> dict[str, Any]:
            # Sockets until one gets A's old fd number, or every new number is past it (it is
            # not free). The lowest free number is always taken, so this ends quickly.
            spare: list[socket.socket] = []
            mine: tuple[socket.socket, socket.socket] | None = None
            try:
                for _ in range(4096):
                    r, w = socket.socketpair()
                    if r.fileno() == hub_fd or w.fileno() == hub_fd:
                        mine = (r, w) if r.fileno() == hub_fd else (w, r)
                        break
                    spare += [r, w]
                    if min(r.fileno(), w.fileno()) > hub_fd:
                        break
                for s in spare:
                    s.close()
                if mine is None:
                    # Not reused: it is still A's hub socket, the same one.
                    assert os.fstat(hub_fd).st_ino == hub_ino
                    mine = socket.socketpair()
                reader, writer = mine
                reused = reader.fileno() == hub_fd

                async def main() -> str:
                    fired = loop.create_future()
                    def on_readable() -> None:
                        if not fired.done():
                            fired.set_result(reader.recv(1))

                    loop.add_reader(reader.fileno(), on_readable)
                    ready = threading.Event()
                    poke = threading.Thread(target=lambda: (ready.wait(HANG), writer.send(b"x")))
                    poke.start()
                    ready.set()
                    try:
                        got = await asyncio.wait_for(fired, HANG)
                    finally:
                        loop.remove_reader(reader.fileno())
                        poke.join(HANG)
                    assert got == b"x"
                    return await one_run(app, "hub-b")  # and a native await still works here

                return {"reused": reused, "run": loop.run_until_complete(main())}
            finally:
                if mine is not None:
                    mine[0].close()
                    mine[1].close()

        seen = in_thread(on_b)
        assert seen["run"] == "ok"
        # After the fix the number is never free, and before it, it was (this test hung there).
        assert seen["reused"] is False
        assert os.fstat(hub_fd).st_ino == hub_ino
    finally:
        loop.close()


def test_threads_one_after_another_leak_no_fds() -> None:
    """Each thread's hub goes to the next thread: ending threads leak no sockets."""
    app = tiny_app()

    def one(i: int) -> tuple[int, str]:
        fd = _core.wake_hub_fileno()
        return fd, asyncio.run(one_run(app, f"leak-{i}"))

    for i in range(3):  # warm: the runtime's own threads and files are open by now
        in_thread(lambda i=i: one(i))
    gc.collect()
    before = open_fds()
    fds = set()
    for i in range(60):
        fd, text = in_thread(lambda i=i: one(100 + i))
        assert text == "ok"
        fds.add(fd)
    gc.collect()
    after = open_fds()
    assert after - before <= 4, (before, after)
    assert len(fds) <= 2, fds  # the same hub, handed on (a second if one was still referenced)


def test_a_loop_on_the_thread_that_took_an_ended_threads_hub_is_woken_and_the_old_loop_lets_go() -> None:
    """Loop L awaited on thread A (it watches A's hub); A ends; thread C takes A's hub and runs
    SQLite-backed runs, whose wakes come from the driver's own threads, while L runs on thread B.
    C's runs all finish; L, woken by C's hub, stops watching it and reads none of C's bytes."""
    from tenxgraph import _bridge

    loop = asyncio.new_event_loop()
    app = tiny_app()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            def on_a() -> int:
                fd = _core.wake_hub_fileno()
                assert loop.run_until_complete(one_run(app, "take-a")) == "ok"
                return fd

            hub_fd = in_thread(on_a)
            c_started = threading.Event()
            c_done = threading.Event()
            c_seen: dict[str, Any] = {}

            def on_c() -> None:
                try:
                    c_seen["fd"] = _core.wake_hub_fileno()
                    c_started.set()
                    sq, cp = sqlite_app(Path(tmp) / "c.db")

                    async def runs() -> list[str]:
                        texts = [await one_run(sq, f"take-c-{i}") for i in range(20)]
                        await cp.arelease()
                        return texts

                    c_seen["texts"] = asyncio.run(runs())
                except BaseException as exc:
                    c_seen["error"] = exc
                finally:
                    c_started.set()
                    c_done.set()

            def on_b() -> bool:
                async def main() -> bool:
                    # L runs here until C is done: C's hub (A's before) turns readable under it.
                    await asyncio.to_thread(c_done.wait, 120)
                    # Once woken by it, L has stopped watching A's old hub (or it never fired).
                    return (os.getpid(), hub_fd) in _bridge._watching.get(loop, set())

                return loop.run_until_complete(main())

            c = threading.Thread(target=on_c)
            c.start()
            assert c_started.wait(HANG)
            still = in_thread(on_b)
            c.join(HANG)
            assert "error" not in c_seen, c_seen.get("error")
            assert c_seen["texts"] == ["ok"] * 20
            # The hub freed last goes first: C took A's. L was woken by C's wakes while it ran on B
            # (a byte per wake from another thread) and let go without taking C's bytes (C's runs
            # all finished).
            assert c_seen["fd"] == hub_fd
            assert still is False
            # And L still works on a thread of its own, woken from SQLite's threads.
            def on_d() -> str:
                sq, cp = sqlite_app(Path(tmp) / "d.db")

                async def go() -> str:
                    text = await one_run(sq, "take-d")
                    await cp.arelease()
                    return text

                return loop.run_until_complete(asyncio.wait_for(go(), HANG))

            assert in_thread(on_d) == "ok"
        finally:
            loop.close()


FORK_SCRIPT = """
import asyncio, os, sys, threading
from tenxgraph import END, START, AgentState, Message, StateGraph, _core
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

async def reply(state):
    await asyncio.sleep(0)
    return "ok"

g = StateGraph(AgentState)
g.add_node("reply", reply)
g.add_edge(START, "reply")
g.add_edge("reply", END)
app = g.compile(checkpointer=InMemoryCheckpointer())

def run(tid):
    try:
        out = asyncio.run(app.ainvoke({"messages": [Message.text_message(tid)]}, {"thread_id": tid}))
    except RuntimeError as exc:  # a child forked after the runtime started (test_fork_after_start.py)
        return "refused" if "fork" in str(exc) else repr(exc)
    return out["messages"][-1].text()

def in_thread(fn):
    box = {}
    t = threading.Thread(target=lambda: box.update(v=fn()))
    t.start(); t.join(60)
    while os.path.exists(f"/proc/self/task/{t.native_id}"):  # its TLS destructors done
        pass
    return box.get("v")

def hub():
    return os.fstat(_core.wake_hub_fileno()).st_ino  # the socket itself, not its fd number

parent_hubs = {hub()}
assert run("parent-main") == "ok"
# An ended thread: its hub waits in the free list for the next thread of this process.
parent_hubs.add(in_thread(lambda: (hub(), run("parent-thread"))[0]))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        here = hub()
        a = run("child-main")
        there = in_thread(hub)
        b = in_thread(lambda: run("child-thread"))
        msg = f"{a} {b} {here in parent_hubs} {there in parent_hubs}"
    except BaseException as exc:
        msg = repr(exc)
    os.write(w, msg.encode())
    os._exit(0)
os.close(w)
child = b""
while chunk := os.read(r, 1024):
    child += chunk
os.waitpid(pid, 0)
print(child.decode(), flush=True)
# The parent's hubs still work, its ended thread's one included.
print(run("parent-after"), in_thread(lambda: run("parent-after-thread")), flush=True)
"""


def test_a_forked_child_makes_its_own_hubs_and_the_parent_keeps_its_own(tmp_path: Path) -> None:
    script = tmp_path / "fork_hub.py"
    script.write_text(textwrap.dedent(FORK_SCRIPT))
    proc = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", str(script)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert proc.returncode == 0, proc.stderr
    # The child's hubs are its own; its runs are refused at once (the runtime's threads stayed in
    # the parent), and the parent goes on.
    assert proc.stdout.splitlines() == ["refused refused False False", "ok ok"], proc.stdout + proc.stderr


FORK_WHILE_THREADS_END = """
import os, select, signal, sys, threading
from tenxgraph import _core

hung = 0
for i in range(int(sys.argv[1])):
    t = threading.Thread(target=_core.wake_hub_fileno)  # takes a hub; gives it back as it ends
    t.start()
    t.join()  # returns before the thread's TLS destructors run: the fork may land in them
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _core.wake_hub_fileno()  # the forking thread's: a new hub
        t = threading.Thread(target=_core.wake_hub_fileno)  # a new thread's, from the free list
        t.start()
        t.join()
        os.write(w, b"x")
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 10)
    if not ready:
        hung += 1
        os.kill(pid, signal.SIGKILL)
    os.close(r)
    os.waitpid(pid, 0)
print(hung, flush=True)
"""


def test_a_child_forked_as_threads_end_does_not_hang_taking_a_hub(tmp_path: Path) -> None:
    """A thread ending at the fork may hold the free list's lock (giving its hub back): the child
    must not wait for it (it never would be released). The child uses a list of its own."""
    script = tmp_path / "fork_while_threads_end.py"
    script.write_text(textwrap.dedent(FORK_WHILE_THREADS_END))
    proc = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", str(script), "300"],
                          capture_output=True, text=True, timeout=110)
    assert (proc.returncode, proc.stdout.strip()) == (0, "0"), proc.stdout + proc.stderr
