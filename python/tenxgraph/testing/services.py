"""Throwaway PostgreSQL and Redis servers for tests (stdlib only).

``start_postgres()`` runs ``initdb`` into a fresh temporary directory and starts a
server with ``pg_ctl`` on a free port of 127.0.0.1; ``start_redis()`` starts
``redis-server`` as a subprocess on a free port of 127.0.0.1.  Both return objects
with ``stop()`` and context-manager support.

Set ``TENXGRAPH_TEST_PG_DSN`` / ``TENXGRAPH_TEST_REDIS_URL`` to use an existing server instead:
nothing is started and ``stop()`` does nothing.

Servers are stopped when the interpreter exits (``atexit``) if the caller forgot.  Each
server also gets a tiny watchdog process that holds a pipe to this process: if this
process dies without cleaning up (SIGKILL, ``os._exit``, pytest-timeout's thread
method, a CI runner killing the process group), the watchdog sees EOF and stops the
server and removes its files.

PostgreSQL refuses to run as root: when running as root, ``initdb``/``pg_ctl`` run as
the ``postgres`` OS user (``runuser -u postgres``) on a directory it owns.  When
``redis-server`` is missing and we are root with ``apt-get``, it is installed
(``apt-get install redis-server``) without letting the package start its system
service.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from types import TracebackType
from typing import Any, Callable

__all__ = [
    "PG_DSN_ENV",
    "apt_install",
    "REDIS_URL_ENV",
    "PostgresServer",
    "RedisServer",
    "find_pg_binary",
    "find_redis_server",
    "start_postgres",
    "start_redis",
]

PG_DSN_ENV = "TENXGRAPH_TEST_PG_DSN"
REDIS_URL_ENV = "TENXGRAPH_TEST_REDIS_URL"

_PG_OS_USER = "postgres"
_PG_SUPERUSER = "postgres"
_PG_DEFAULT_DB = "tenx"
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


def find_pg_binary(name: str) -> str:
    """Path of a PostgreSQL binary: next to ``initdb`` on PATH, else the newest
    ``/usr/lib/postgresql/*/bin``, else PATH (``/usr/bin/psql`` is Debian's wrapper)."""
    candidates: list[str] = []
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(initdb)), name))

    def version_key(d: str) -> tuple[int, ...]:
        m = re.search(r"/postgresql/([0-9.]+)/", d)
        return tuple(int(x) for x in m.group(1).split(".") if x) if m else (0,)

    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version_key, reverse=True):
        candidates.append(os.path.join(d, name))
    for d in ("/usr/local/pgsql/bin", "/opt/homebrew/bin", "/usr/local/bin"):
        candidates.append(os.path.join(d, name))
    on_path = shutil.which(name)
    if on_path:
        candidates.append(on_path)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise RuntimeError(
        f"PostgreSQL binary {name!r} not found (looked next to initdb on PATH and in "
        "/usr/lib/postgresql/*/bin). Install the PostgreSQL server, e.g. "
        "`apt-get install -y postgresql`, or set "
        f"{PG_DSN_ENV}=postgresql://user@host:port/db to use an existing server."
    )


def _pg_env() -> dict[str, str]:
    """Environment for our own server's tools: no PG* overrides, C locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    env["LANG"] = "C"
    return env


def _as_pg_user(cmd: list[str]) -> list[str]:
    """Prefix ``cmd`` so it runs as the postgres OS user when we are root."""
    if not _is_root():
        return cmd
    runuser = shutil.which("runuser") or ("/usr/sbin/runuser" if os.path.exists("/usr/sbin/runuser") else None)
    if runuser:
        return [runuser, "-u", _PG_OS_USER, "--", *cmd]
    su = shutil.which("su") or "/bin/su"
    return [su, "-s", "/bin/sh", _PG_OS_USER, "-c", shlex.join(cmd)]


def _pg_os_user_ids() -> tuple[int, int] | None:
    if not _is_root():
        return None
    try:
        pw = pwd.getpwnam(_PG_OS_USER)
    except KeyError:
        raise RuntimeError(
            "running as root, and PostgreSQL refuses to run as root, but there is no "
            f"{_PG_OS_USER!r} OS user to run it as (the postgresql packages create it; "
            f"or `useradd --system {_PG_OS_USER}`)."
        ) from None
    return pw.pw_uid, pw.pw_gid


def _with_dbname(dsn: str, dbname: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(dbname)))


_DBNAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class PostgresServer(_Server):
    """A running PostgreSQL server (ours, or an external one from ``TENXGRAPH_TEST_PG_DSN``).

    Attributes: ``dsn`` (``postgresql://postgres@127.0.0.1:PORT/tenx``), ``host``,
    ``port``, ``user``, ``dbname``, ``external``, ``data_dir`` and ``log_path``
    (``None`` when external).
    """

    def __init__(
        self,
        dsn: str,
        *,
        external: bool,
        root_dir: str | None = None,
        pg_ctl: str | None = None,
    ) -> None:
        super().__init__()
        self.dsn = dsn
        self.external = external
        parts = urllib.parse.urlsplit(dsn)
        self.host: str = parts.hostname or "127.0.0.1"
        self.port: int = parts.port or 5432
        self.user: str = urllib.parse.unquote(parts.username or _PG_SUPERUSER)
        self.dbname: str = urllib.parse.unquote(parts.path.lstrip("/")) or self.user
        self._root_dir = root_dir
        self._pg_ctl = pg_ctl
        self.data_dir: str | None = os.path.join(root_dir, "data") if root_dir else None
        self.log_path: str | None = os.path.join(root_dir, "postgres.log") if root_dir else None

    def __repr__(self) -> str:
        state = "external" if self.external else ("stopped" if self._stopped else "running")
        return f"<PostgresServer {self.dsn} {state}>"

    def __enter__(self) -> PostgresServer:
        return self

    # -- SQL helpers (via the psql binary; no Python driver needed) -------------------

    def dsn_for(self, dbname: str) -> str:
        """The DSN of another database on this server."""
        return _with_dbname(self.dsn, dbname)

    def psql(self, sql: str, *, dbname: str | None = None, timeout: float = 60) -> str:
        """Run ``sql`` with ``psql -X -Atq -v ON_ERROR_STOP=1``; return its stdout."""
        dsn = self.dsn_for(dbname) if dbname else self.dsn
        env = dict(os.environ) if self.external else _pg_env()
        env.setdefault("PGCONNECT_TIMEOUT", "10")
        cmd = [find_pg_binary("psql"), "-X", "-Atq", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql]
        try:
            res = subprocess.run(
                cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"psql timed out after {timeout}s running {sql!r} on {dsn}") from None
        if res.returncode != 0:
            raise RuntimeError(
                f"psql failed (exit {res.returncode}) running {sql!r} on {dsn}:\n{res.stderr.strip()}"
            )
        return res.stdout

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh database (default name ``tenx_<uuid>``); return its DSN."""
        name = name or f"tenx_{uuid.uuid4().hex}"
        if not _DBNAME_RE.match(name):
            raise ValueError(f"invalid database name {name!r}")
        self.psql(f'CREATE DATABASE "{name}"', dbname="postgres")
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting any remaining sessions."""
        if not _DBNAME_RE.match(name):
            raise ValueError(f"invalid database name {name!r}")
        try:
            self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', dbname="postgres")
        except RuntimeError as e:
            if "syntax error" not in str(e):  # servers older than 13 lack WITH (FORCE)
                raise
            self.psql(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
                dbname="postgres",
            )
            self.psql(f'DROP DATABASE IF EXISTS "{name}"', dbname="postgres")

    # -- lifecycle ----------------------------------------------------------------------

    def _shutdown(self) -> None:
        try:
            if self._pg_ctl and self.data_dir and os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
                with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                    subprocess.run(
                        _as_pg_user([self._pg_ctl, "-D", self.data_dir, "-m", "immediate", "-w", "-t", "30", "stop"]),
                        env=_pg_env(),
                        cwd=self._root_dir,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        timeout=60,
                    )
                _kill_postmaster_if_alive(self.data_dir)
        finally:
            _rmtree(self._root_dir)


def _kill_postmaster_if_alive(data_dir: str) -> None:
    """Fallback when ``pg_ctl stop`` did not work: SIGKILL the postmaster from its pid file."""
    try:
        with open(os.path.join(data_dir, "postmaster.pid")) as f:
            pid = int(f.readline().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"postgres" not in f.read():
                return
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def start_postgres(*, use_env: bool = True) -> PostgresServer:
    """Start a throwaway PostgreSQL server with a database ``tenx``.

    With ``use_env`` and ``TENXGRAPH_TEST_PG_DSN`` set, start nothing and return a handle on
    that server instead.
    """
    if use_env and os.environ.get(PG_DSN_ENV):
        server = PostgresServer(os.environ[PG_DSN_ENV], external=True)
        return server

    initdb = find_pg_binary("initdb")
    pg_ctl = find_pg_binary("pg_ctl")
    ids = _pg_os_user_ids()
    env = _pg_env()

    root_dir = tempfile.mkdtemp(prefix="tenx-pg-", dir=_short_tmp_base())
    watchdog: _Watchdog | None = None
    ok = False
    try:
        os.chmod(root_dir, 0o755)
        sock_dir = os.path.join(root_dir, "s")
        os.mkdir(sock_dir, 0o755)
        if ids is not None:
            for p in (root_dir, sock_dir):
                os.chown(p, *ids)
        data_dir = os.path.join(root_dir, "data")
        log_path = os.path.join(root_dir, "postgres.log")

        # Armed before the server exists, so a crash mid-startup is cleaned up too.
        watchdog = _Watchdog(
            {
                "cmds": [_as_pg_user([pg_ctl, "-D", data_dir, "-m", "immediate", "-w", "-t", "30", "stop"])],
                "rmtree": [root_dir],
            }
        )

        res = subprocess.run(
            _as_pg_user(
                [
                    initdb, "-D", data_dir, "--auth=trust", "-U", _PG_SUPERUSER,
                    "--no-sync", "--no-instructions", "-E", "UTF8", "--locale=C",
                ]
            ),
            env=env, cwd=root_dir, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(
                f"initdb failed (exit {res.returncode}):\n{(res.stdout + res.stderr).strip()[-4000:]}"
            )

        port = 0
        for attempt in range(1, _STARTUP_ATTEMPTS + 1):
            port = _free_port()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_path)  # each attempt gets its own log
            opts = f"-p {port} -k {sock_dir} -c listen_addresses=127.0.0.1 -c fsync=on"
            res = subprocess.run(
                _as_pg_user([pg_ctl, "-D", data_dir, "-l", log_path, "-w", "-t", "60", "-o", opts, "start"]),
                env=env, cwd=root_dir, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if res.returncode == 0:
                break
            log_tail = _tail(log_path)
            _kill_postmaster_if_alive(data_dir)
            port_race = "could not bind" in log_tail or "already in use" in log_tail
            if not port_race or attempt == _STARTUP_ATTEMPTS:
                raise RuntimeError(
                    f"pg_ctl start failed (exit {res.returncode}) on port {port}:\n"
                    f"{(res.stdout + res.stderr).strip()}\n--- server log tail ({log_path}) ---\n{log_tail}"
                )

        server = PostgresServer(
            f"postgresql://{_PG_SUPERUSER}@127.0.0.1:{port}/{_PG_DEFAULT_DB}",
            external=False,
            root_dir=root_dir,
            pg_ctl=pg_ctl,
        )
        server._watchdog = watchdog
        server._register()
        try:
            server.psql(f'CREATE DATABASE "{_PG_DEFAULT_DB}"', dbname="postgres")
        except RuntimeError as e:
            server.stop()
            raise RuntimeError(f"{e}\n--- server log tail ({log_path}) ---\n{_tail(log_path)}") from None
        ok = True
        return server
    finally:
        if not ok:
            # Stop whatever started, remove the directory, then disarm the watchdog.
            data_dir = os.path.join(root_dir, "data")
            if os.path.exists(os.path.join(data_dir, "postmaster.pid")):
                with contextlib.suppress(Exception):
                    subprocess.run(
                        _as_pg_user([pg_ctl, "-D", data_dir, "-m", "immediate", "-w", "-t", "30", "stop"]),
                        env=env, cwd=root_dir, stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                    )  # fmt: skip
                _kill_postmaster_if_alive(data_dir)
            _rmtree(root_dir)
            if watchdog is not None:
                watchdog.disarm()


# --------------------------------------------------------------------------- Redis

_APT_INSTALL_LOCK = "/tmp/tenx-apt-install.lock"
_POLICY_RC_D = "/usr/sbin/policy-rc.d"


def _which_redis_server() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    for c in ("/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def apt_install(package: str, installed: Callable[[], object]) -> None:
    """``apt-get install <package>`` without starting its system service (root only).

    Serialised with a file lock (parallel test processes); ``installed()`` is checked again under
    the lock. ``policy-rc.d`` exit 101 keeps the package's postinst from starting a server that
    would outlive us.
    """
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open(_APT_INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed():
            return
        created_policy = False
        if not os.path.exists(_POLICY_RC_D):
            with open(_POLICY_RC_D, "w") as f:
                f.write("#!/bin/sh\n# temporary, written by tenxgraph.testing: do not start services\nexit 101\n")
            os.chmod(_POLICY_RC_D, 0o755)
            created_policy = True
        try:
            apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]
            steps = [
                [*apt, "update", "-qq"],
                [*apt, "install", "-y", "-qq", "--no-install-recommends", package],
            ]
            for cmd in steps:
                res = subprocess.run(
                    cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900
                )
                if res.returncode != 0:
                    raise RuntimeError(
                        f"`{shlex.join(cmd)}` failed (exit {res.returncode}) while installing {package}:\n"
                        f"{(res.stdout + res.stderr).strip()[-4000:]}"
                    )
        finally:
            if created_policy:
                with contextlib.suppress(OSError):
                    os.unlink(_POLICY_RC_D)


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
