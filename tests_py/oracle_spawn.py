"""Starting 10xGraph 0.10 processes for the tests: through a fork server (``oracle_zygote.py``)
that has 10xGraph's third-party dependencies imported already, so a run starts in a fraction of
a second instead of 3-4 s; ``subprocess`` for any other interpreter, or with
``TENXGRAPH_ORACLE_FORKSERVER=0``, or where the server does not start.

``spawn`` returns an object with the part of ``subprocess.Popen``'s interface the tests use
(``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``); ``run`` is
``subprocess.run(capture_output=True, text=True)``. The child is the server's, not this
process's: signals go to its pid, and its exit status comes back from the server.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ZYGOTE = Path(__file__).with_name("oracle_zygote.py")
_servers: dict[str, _Server | None] = {}
_lock = threading.Lock()


class _Server:
    def __init__(self, python: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="tenx-zygote-")
        self.path = os.path.join(self.dir, "s")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.proc = subprocess.Popen([python, str(ZYGOTE), self.path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=self.dir)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 180)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.close()
            raise RuntimeError("the 10xGraph fork server did not start")
        atexit.register(self.close)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # the server's signal to end (and kill what it runs)
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class ZygoteChild:
    """A 10xGraph process forked by the server, with ``Popen``'s methods the tests use."""

    def __init__(self, server: _Server, argv: Sequence[str], env: Mapping[str, str], cwd: str,
                 stdout: str, stderr: str) -> None:
        self.args = list(argv)
        self.returncode: int | None = None
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(server.path)
        request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd), "stdout": stdout, "stderr": stderr}
        self._sock.sendall(json.dumps(request).encode() + b"\n")
        self._buf = b""
        answer = self._message(None)
        if "pid" not in answer:
            self._sock.close()
            raise ConnectionError("the 10xGraph fork server went away")
        self.pid = int(answer["pid"])

    def _message(self, timeout: float | None) -> dict[str, Any]:
        while b"\n" not in self._buf:
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            try:
                data = self._sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                # The server kills its children on the way out, and they die with it: a
                # server that went away took this one with it.
                return {"returncode": -signal.SIGKILL}
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._message(timeout)["returncode"])
            self._sock.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _server(python: str, oracle_python: str | None) -> _Server | None:
    if os.environ.get("TENXGRAPH_ORACLE_FORKSERVER", "1") == "0" or python != oracle_python:
        return None
    with _lock:
        if python not in _servers:
            try:
                _servers[python] = _Server(python)
            except (OSError, RuntimeError):
                _servers[python] = None  # this process uses subprocess from now on
        return _servers[python]


def oracle_python() -> str | None:
    """The oracle venv's interpreter, when it is built (None otherwise)."""
    import sys

    scripts = str(Path(__file__).resolve().parent.parent / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from oracle_venv import build_oracle_venv

    python, _ = build_oracle_venv()
    return python


def spawn(python: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | os.PathLike[str],
          stdout: str | os.PathLike[str], stderr: str | os.PathLike[str] | None = None) -> Any:
    """``python argv...`` with stdout (and stderr: the same file when None) written to files."""
    out = str(stdout)
    err = out if stderr is None else str(stderr)
    server = _server(python, oracle_python())
    if server is not None:
        try:
            return ZygoteChild(server, argv, env, str(cwd), out, err)
        except OSError:  # the server is gone: this process uses subprocess from now on
            with _lock:
                _servers[python] = None
    out_f = open(out, "a")
    err_f = out_f if err == out else open(err, "a")
    try:
        return subprocess.Popen([python, *argv], env=dict(env), cwd=cwd, stdout=out_f, stderr=err_f,
                                stdin=subprocess.DEVNULL)
    finally:
        out_f.close()
        if err_f is not out_f:
            err_f.close()


def run(python: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | os.PathLike[str],
        timeout: float) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, *argv], capture_output=True, text=True, timeout=...)``."""
    with tempfile.TemporaryDirectory(prefix="tenx-run-") as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        proc = spawn(python, argv, env=env, cwd=cwd, stdout=out, stderr=err)
        try:
            rc = proc.wait(timeout)
        except BaseException:  # a timeout, and pytest-timeout's or Ctrl-C's exception too
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess([python, *argv], rc, Path(out).read_text(errors="replace"),
                                           Path(err).read_text(errors="replace"))
