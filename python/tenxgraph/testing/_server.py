"""What the throwaway servers share: free ports, short temp dirs, the watchdog process that
stops a server when its owner dies, and the lifecycle base class (see tenxgraph.testing.services)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from types import TracebackType
from typing import Any

PG_DSN_ENV = "TENXGRAPH_TEST_PG_DSN"
REDIS_URL_ENV = "TENXGRAPH_TEST_REDIS_URL"

_LOG_TAIL_LINES = 40
_STARTUP_ATTEMPTS = 4  # free-port races: retry on another port


# --------------------------------------------------------------------------- helpers


def _free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (the caller retries on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: str | None, lines: int = _LOG_TAIL_LINES) -> str:
    if not path:
        return "(no log)"
    try:
        with open(path, errors="replace") as f:
            content = f.read().splitlines()
    except OSError as e:
        return f"(could not read log {path}: {e})"
    return "\n".join(content[-lines:]) or "(log is empty)"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _short_tmp_base() -> str:
    """A temp base dir every user can traverse, short enough for a unix-socket path."""
    base = tempfile.gettempdir()
    if _is_root() or len(base) > 60:
        # A root-owned TMPDIR may be closed to the postgres user; unix-socket paths are
        # limited to ~107 bytes.  /tmp is world-traversable and short.
        path = os.path.realpath(base)
        while True:
            try:
                if not os.stat(path).st_mode & 0o001:
                    return "/tmp"
            except OSError:
                return "/tmp"
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        if len(base) > 60:
            return "/tmp"
    return base


def _rmtree(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def _find_or_install(package: str, binary: str) -> str:
    """``binary``; apt-installs ``package`` first when it is missing and we are root."""
    from tenxgraph.testing._apt import apt_install

    def installed() -> bool:
        return os.access(binary, os.X_OK)

    if not installed() and _is_root() and shutil.which("apt-get"):
        apt_install(package, installed)
    if not installed():
        raise RuntimeError(f"{binary} not found: `sudo apt-get install -y {package}`")
    return binary


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; waits for the process either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# --------------------------------------------------------------------------- watchdog

# Runs in a separate interpreter (``python -I -S``): waits for EOF on stdin, i.e. for the
# owning process to exit or to disarm it; when not disarmed, kills/cleans the server.
_WATCHDOG_CODE = r"""
import json, os, shutil, signal, subprocess, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
spec = json.loads(sys.argv[1])
data = b""
while True:
    chunk = os.read(0, 4096)
    if not chunk:
        break
    data += chunk
if b"disarm" in data:
    sys.exit(0)
for cmd in spec.get("cmds", []):
    try:
        subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60, cwd="/")
    except Exception:
        pass
pid, marker = spec.get("pid"), spec.get("marker", "")
if pid:
    def alive():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                return marker.encode() in f.read()
        except OSError:
            return False
    if alive():
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        for _ in range(50):
            if not alive():
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
for path in spec.get("rmtree", []):
    shutil.rmtree(path, ignore_errors=True)
"""


class _Watchdog:
    def __init__(self, spec: dict[str, Any]) -> None:
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable or shutil.which("python3") or "python3", "-I", "-S", "-c", _WATCHDOG_CODE, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # terminal/process-group signals must not reach it
            cwd="/",
        )

    def disarm(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"disarm\n")
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- registry

_live_lock = threading.Lock()
_live: dict[int, _Server] = {}


def _stop_all_at_exit() -> None:
    with _live_lock:
        servers = list(_live.values())
    for server in servers:
        if server._owner_pid == os.getpid():
            with contextlib.suppress(Exception):
                server.stop()


atexit.register(_stop_all_at_exit)


class _Server:
    """Common lifecycle: registry for atexit, idempotent stop, context manager."""

    external: bool

    def __init__(self) -> None:
        self._owner_pid = os.getpid()
        self._stopped = False
        self._watchdog: _Watchdog | None = None

    def _register(self) -> None:
        with _live_lock:
            _live[id(self)] = self

    def _unregister(self) -> None:
        with _live_lock:
            _live.pop(id(self), None)

    def _shutdown(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return not self._stopped

    def stop(self) -> None:
        """Stop the server and delete its files.  Idempotent; a no-op for external servers."""
        if self._stopped:
            return
        self._stopped = True
        if self._owner_pid != os.getpid():
            return  # a forked copy of the handle: the server belongs to the parent process
        try:
            if not self.external:
                self._shutdown()
        finally:
            if self._watchdog is not None:
                self._watchdog.disarm()
                self._watchdog = None
            self._unregister()

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------- PostgreSQL




class _ChildServer(_Server):
    """A server this process started as a child (``proc``) listening on ``port``, with its files
    under ``root``: stopped with SIGTERM (SIGKILL after 30 s), its files deleted."""

    external = False

    def __init__(self, proc: subprocess.Popen[bytes], port: int, root: str) -> None:
        super().__init__()
        self._proc, self.port, self._root = proc, port, root
        self.pid = proc.pid

    def _shutdown(self) -> None:
        try:
            _terminate(self._proc)
        finally:
            self._after_stop()
            _rmtree(self._root)

    def _after_stop(self) -> None:
        """What else its stop must clean up (before its files go)."""
