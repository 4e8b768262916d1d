"""A throwaway PostgreSQL server: ``initdb`` into a fresh temporary directory, ``pg_ctl`` on a free
port of 127.0.0.1, as the ``postgres`` OS user when we are root (see tenxgraph.testing.services)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import urllib.parse
import uuid

from tenxgraph.testing._server import (
    PG_DSN_ENV,
    _STARTUP_ATTEMPTS,
    _Server,
    _Watchdog,
    _free_port,
    _is_root,
    _rmtree,
    _short_tmp_base,
    _tail,
)

_PG_OS_USER = "postgres"
_PG_SUPERUSER = "postgres"
_PG_DEFAULT_DB = "tenx"

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
            # 300 connections, not the default 100: a test session holds pools of checkpointers its
            # tests never closed until the collector frees them, beside two workers, child processes
            # and 10xGraph's own pools, and 100 ran out once in a CI run ("too many clients").
            opts = f"-p {port} -k {sock_dir} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=300"
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

