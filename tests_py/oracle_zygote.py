"""A fork server for 10xGraph 0.10 runs, started by ``oracle_spawn.py`` under the oracle venv's
Python: ``python oracle_zygote.py SOCKET``.

A 10xGraph process spends about 3-4 s importing its third-party dependencies (fastmcp, openai,
google-genai, docket, ...) before it runs a line, and the differential and crash tests start one
such process hundreds of times. This server imports those dependencies once, then forks a child
per request, which runs the requested script as ``python script args...`` would.

10xGraph's own modules (``tenxgraph.*``) are not imported here: which third-party modules to
preload is found by a throwaway child that imports 10xGraph and reports them, so every run
imports 10xGraph itself afresh, in its child, with the run's environment and working directory.

Protocol, one connection per run: the client sends one JSON line ``{"argv", "env", "cwd",
"stdout", "stderr"}`` (argv[0] the script; stdout/stderr file paths, the same path for both to
merge them); the server answers ``{"pid": N}``, then ``{"returncode": rc}`` when the child has
exited (negative: killed by that signal, as ``subprocess``). A connection closed before the child
ended gets the child killed. The server exits when its stdin closes (its client process ended).
Single-threaded on purpose: a fork from a process with other threads can copy a held lock.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys

# The entry points a test script uses; their import tells the probe which modules to preload.
ENTRY_MODULES = ["tenxgraph", "tenxgraph.core.graph", "tenxgraph.storage.checkpointer", "tenxgraph.utils",
                 "tenxgraph.prebuilt"]


def _own(name: str) -> bool:
    return name == "tenxgraph" or name.startswith("tenxgraph.") or name in ("__main__", "__mp_main__")


def preload() -> None:
    """Imports every module 10xGraph's entry points import, except 10xGraph's own."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            for name in ENTRY_MODULES:
                importlib.import_module(name)
            # In the order they were first imported (sys.modules keeps it): in another order a
            # module can be imported in the middle of its own package's import, e.g. `_asyncio`
            # before `asyncio`, which left asyncio.tasks with the Python current_task and no
            # current task inside any task.
            names = [m for m in sys.modules if not _own(m)]
            os.write(w, "\n".join(names).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    for name in b"".join(chunks).decode().split():
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a module that needs its parent's context: the child imports it
                pass


def _become(request: dict) -> None:
    """In the forked child: the process ``python argv...`` would be, up to running the script."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    err = out if request["stderr"] == request["stdout"] else os.open(
        request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(err, 2)
    for fd in {null, out, err}:
        os.close(fd)
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def serve(path: str) -> dict | None:
    """Serves until stdin closes (returns None) or, in a forked child, returns its request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # SIGCHLD wakes the selector through this pipe; waitpid then finds which child ended.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    pending: dict[socket.socket, bytes] = {}
    running: dict[int, socket.socket] = {}
    by_conn: dict[socket.socket, int] = {}
    print("ready", flush=True)
    while True:
        for key, _ in sel.select(timeout=1.0):
            what = key.data
            if what == "stdin":
                if not sys.stdin.readline():
                    for pid in running:
                        _kill(pid)
                    return None
            elif what == "accept":
                conn, _ = listener.accept()
                pending[conn] = b""
                sel.register(conn, selectors.EVENT_READ, "conn")
            elif what == "wake":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            else:
                conn = key.fileobj
                try:
                    data = conn.recv(1 << 20)
                except OSError:  # reset by a client that went away: as a close
                    data = b""
                if conn in pending:
                    if not data:
                        sel.unregister(conn)
                        conn.close()
                        del pending[conn]
                        continue
                    pending[conn] += data
                    if b"\n" not in pending[conn]:
                        continue
                    request = json.loads(pending.pop(conn).split(b"\n", 1)[0])
                    pid = os.fork()
                    if pid == 0:
                        sel.close()
                        listener.close()
                        for c in [*pending, *by_conn, conn]:
                            c.close()
                        os.close(wake_r)
                        os.close(wake_w)
                        signal.set_wakeup_fd(-1)
                        _die_with_the_server()
                        _become(request)
                        return request
                    running[pid] = conn
                    by_conn[conn] = pid
                    try:
                        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                    except OSError:  # the client went away before it had the pid
                        sel.unregister(conn)
                        _kill(by_conn.pop(conn))
                        conn.close()
                elif not data:  # the client went away before its child ended
                    sel.unregister(conn)
                    _kill(by_conn.pop(conn))
                    conn.close()
        for pid in list(running):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours to reap (cannot happen): never report success
                done, status = pid, 255 << 8
            if done:
                conn = running.pop(pid)
                if by_conn.pop(conn, None) is not None:
                    try:
                        conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                    except OSError:
                        pass
                    sel.unregister(conn)
                    conn.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with_the_server() -> None:
    """In the child: SIGKILL when the server dies (Linux PR_SET_PDEATHSIG), so no 10xGraph run
    outlives the test worker that asked for it, however the server ends."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    preload()
    job = serve(sys.argv[1])
    if job is None:
        sys.exit(0)
    # The forked child: run the script as `python script` would (its exceptions, SystemExit and
    # interpreter exit included).
    del job
    runpy.run_path(sys.argv[0], run_name="__main__")
