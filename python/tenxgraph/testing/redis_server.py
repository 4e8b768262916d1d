"""A throwaway Redis server: ``redis-server`` as a subprocess on a free port of 127.0.0.1,
apt-installed when missing and we are root (see tenxgraph.testing.services)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse

from tenxgraph.testing._apt import apt_install
from tenxgraph.testing._server import (
    REDIS_URL_ENV,
    _STARTUP_ATTEMPTS,
    _Server,
    _Watchdog,
    _free_port,
    _is_root,
    _rmtree,
    _short_tmp_base,
    _tail,
)

def _which_redis_server() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    for c in ("/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None



def find_redis_server(*, install: bool = True) -> str:
    """Path of ``redis-server``; installs it with apt-get when missing and we are root."""
    found = _which_redis_server()
    if found:
        return found
    if install and _is_root() and shutil.which("apt-get"):
        apt_install("redis-server", _which_redis_server)
        found = _which_redis_server()
        if found:
            return found
        raise RuntimeError("apt-get installed redis-server, but no redis-server binary was found afterwards")
    raise RuntimeError(
        "redis-server not found. Install it (`sudo apt-get install -y redis-server`, "
        "`brew install redis`, ...) or set "
        f"{REDIS_URL_ENV}=redis://host:port/0 to use an existing server."
    )


def _redis_call(port: int, payload: bytes, timeout: float = 1.0) -> bytes:
    """Send raw RESP, return the raw reply (enough for simple and bulk-string replies)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        buf = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if b"\r\n" not in buf:
                continue
            head, _, rest = buf.partition(b"\r\n")
            if head[:1] != b"$":
                return buf
            n = int(head[1:])
            if n < 0 or len(rest) >= n + 2:
                return buf
        return buf


def redis_command(port: int, *args: str, timeout: float = 5.0) -> bytes:
    """One Redis command over a raw socket (no client library needed); the raw RESP reply."""
    payload = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        payload.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return _redis_call(port, b"".join(payload), timeout=timeout)


def _redis_pid(port: int) -> int | None:
    reply = _redis_call(port, b"INFO server\r\n")
    m = re.search(rb"process_id:(\d+)", reply)
    return int(m.group(1)) if m else None


class RedisServer(_Server):
    """A running Redis server (ours, or an external one from ``TENXGRAPH_TEST_REDIS_URL``).

    Attributes: ``url`` (``redis://127.0.0.1:PORT/0``), ``host``, ``port``, ``external``,
    ``pid`` and ``log_path`` (``None`` when external).
    """

    def __init__(
        self,
        url: str,
        *,
        external: bool,
        proc: subprocess.Popen[bytes] | None = None,
        root_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.url = url
        self.external = external
        parts = urllib.parse.urlsplit(url)
        self.host: str = parts.hostname or "127.0.0.1"
        self.port: int = parts.port or 6379
        self._proc = proc
        self._root_dir = root_dir
        self.pid: int | None = proc.pid if proc else None
        self.log_path: str | None = os.path.join(root_dir, "redis.log") if root_dir else None

    def __repr__(self) -> str:
        state = "external" if self.external else ("stopped" if self._stopped else "running")
        return f"<RedisServer {self.url} {state}>"

    def __enter__(self) -> RedisServer:
        return self

    def _shutdown(self) -> None:
        try:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        finally:
            _rmtree(self._root_dir)


def start_redis(*, use_env: bool = True) -> RedisServer:
    """Start a throwaway Redis server (no persistence) on a free 127.0.0.1 port.

    With ``use_env`` and ``TENXGRAPH_TEST_REDIS_URL`` set, start nothing and return a handle
    on that server instead.
    """
    if use_env and os.environ.get(REDIS_URL_ENV):
        return RedisServer(os.environ[REDIS_URL_ENV], external=True)

    binary = find_redis_server()
    root_dir = tempfile.mkdtemp(prefix="tenx-redis-", dir=_short_tmp_base())
    log_path = os.path.join(root_dir, "redis.log")
    errors: list[str] = []
    server: RedisServer | None = None
    try:
        for _attempt in range(_STARTUP_ATTEMPTS):
            port = _free_port()
            cmd = [
                binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--dir", root_dir, "--logfile", "",
            ]  # fmt: skip
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_path)  # each attempt gets its own log
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=root_dir, start_new_session=True,  # Ctrl-C goes to pytest, not to redis
                )  # fmt: skip
            server = RedisServer(f"redis://127.0.0.1:{port}/0", external=False, proc=proc, root_dir=root_dir)
            server._register()
            server._watchdog = _Watchdog({"pid": proc.pid, "marker": "redis-server", "rmtree": [root_dir]})
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    # Check the answer comes from *our* process (free-port races).
                    if _redis_call(port, b"PING\r\n").startswith(b"+PONG") and _redis_pid(port) == proc.pid:
                        return server
                except (OSError, ValueError):
                    pass
                time.sleep(0.02)
            exited = proc.poll() is not None
            log_tail = _tail(log_path)
            server._root_dir = None  # keep the directory for the next attempt
            server.stop()
            server = None
            errors.append(
                f"redis-server on port {port} "
                + (f"exited with code {proc.returncode}" if exited else "did not answer PING within 20s")
                + f" ({shlex.join(cmd)}):\n{log_tail}"
            )
            if not (exited and "already in use" in log_tail):
                break  # not a port race: do not retry
        raise RuntimeError("could not start redis-server:\n" + "\n---\n".join(errors))
    except BaseException:
        if server is not None:
            server.stop()
        _rmtree(root_dir)
        raise

