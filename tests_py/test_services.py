"""The throwaway PostgreSQL / Redis servers of ``tenxgraph.testing``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse

import pytest

from tenxgraph.testing import (
    PG_DSN_ENV,
    REDIS_URL_ENV,
    PostgresServer,
    RedisServer,
    find_pg_binary,
    start_postgres,
    start_redis,
)
from tenxgraph.testing.services import redis_command
from tenxgraph.testing.pytest_plugin import pg_dsn, tenx_postgres, tenx_redis  # noqa: F401


def _psql(host: str, port: int, db: str, sql: str) -> str:
    res = subprocess.run(
        [find_pg_binary("psql"), "-X", "-h", host, "-p", str(port), "-U", "postgres", "-d", db, "-Atc", sql],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("PG")},
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _psql_dsn(dsn: str, sql: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    assert parts.hostname and parts.port
    return _psql(parts.hostname, parts.port, parts.path.lstrip("/"), sql)


def _redis(port: int, *args: str) -> bytes:
    """One RESP command over a raw socket; the raw reply (simple, error, integer or bulk)."""
    return redis_command(port, *args)


def _port_closed(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
        except OSError:
            return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_accepts_connection_and_query(tenx_postgres: PostgresServer) -> None:  # noqa: F811
    pg = tenx_postgres
    assert pg.dsn == f"postgresql://postgres@127.0.0.1:{pg.port}/tenx" or pg.external
    assert _psql(pg.host, pg.port, pg.dbname, "select 1") == "1"
    assert _psql(pg.host, pg.port, pg.dbname, "select current_database()") == pg.dbname
    if not pg.external:
        # listens on 127.0.0.1 only; fsync as requested
        assert _psql(pg.host, pg.port, "tenx", "show listen_addresses") == "127.0.0.1"
        assert _psql(pg.host, pg.port, "tenx", "show fsync") == "on"


_seen_databases: list[str] = []


@pytest.mark.parametrize("run", [1, 2])
def test_pg_dsn_is_a_fresh_database(pg_dsn: str, tenx_postgres: PostgresServer, run: int) -> None:  # noqa: F811
    db = urllib.parse.urlsplit(pg_dsn).path.lstrip("/")
    assert db.startswith("tenx_")
    assert _psql_dsn(pg_dsn, "select current_database()") == db
    # Nothing left by the other run: the table is created in every run.
    assert _psql_dsn(pg_dsn, "select count(*) from pg_tables where tablename = 'marker'") == "0"
    _psql_dsn(pg_dsn, "create table marker (run int); insert into marker values (%d)" % run)
    assert db not in _seen_databases
    if _seen_databases:  # the previous run's database was dropped after its test
        previous = _seen_databases[-1]
        exists = tenx_postgres.psql(f"select count(*) from pg_database where datname = '{previous}'")
        assert exists.strip() == "0"
    _seen_databases.append(db)


def test_create_database_gives_distinct_databases(tenx_postgres: PostgresServer) -> None:  # noqa: F811
    a = tenx_postgres.create_database()
    b = tenx_postgres.create_database()
    try:
        assert a != b
        _psql_dsn(a, "create table only_in_a (x int)")
        assert _psql_dsn(b, "select count(*) from pg_tables where tablename = 'only_in_a'") == "0"
    finally:
        for dsn in (a, b):
            tenx_postgres.drop_database(urllib.parse.urlsplit(dsn).path.lstrip("/"))


# --------------------------------------------------------------------------- Redis


def test_redis_ping_set_get(tenx_redis: RedisServer) -> None:  # noqa: F811
    r = tenx_redis
    assert r.url == f"redis://127.0.0.1:{r.port}/0" or r.external
    with socket.create_connection(("127.0.0.1", r.port), timeout=5) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(64).startswith(b"+PONG")
    assert _redis(r.port, "SET", "tenx:test:key", "héllo") == b"+OK\r\n"
    value = "héllo".encode()
    assert _redis(r.port, "GET", "tenx:test:key") == b"$%d\r\n%s\r\n" % (len(value), value)
    assert _redis(r.port, "GET", "tenx:test:missing") == b"$-1\r\n"
    _redis(r.port, "DEL", "tenx:test:key")


# --------------------------------------------------------------------------- stop / cleanup


def test_postgres_stop_really_stops() -> None:
    with start_postgres(use_env=False) as pg:
        assert _psql(pg.host, pg.port, "tenx", "select 1") == "1"
        data_dir = pg.data_dir
        assert data_dir and os.path.isdir(data_dir)
    assert _port_closed(pg.port)
    assert not os.path.exists(os.path.dirname(data_dir))
    pg.stop()  # idempotent


def test_redis_stop_really_stops() -> None:
    r = start_redis(use_env=False)
    assert _redis(r.port, "PING") == b"+PONG\r\n"
    r.stop()
    assert _port_closed(r.port)
    assert r.log_path and not os.path.exists(os.path.dirname(r.log_path))
    r.stop()  # idempotent


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from tenxgraph.testing import start_postgres, start_redis
    pg = start_postgres(use_env=False)
    r = start_redis(use_env=False)
    print(pg.port, r.port, pg.data_dir, r.log_path, flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)      # forgot stop(): atexit cleans up
    time.sleep(600)      # killed with SIGKILL: the watchdogs clean up
    """
)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_servers_do_not_outlive_their_process(how: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
        pg_port, redis_port, pg_data, redis_log = line.split()
        if how == "sigkill":
            assert _redis(int(redis_port), "PING") == b"+PONG\r\n"
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert _port_closed(int(pg_port))
    assert _port_closed(int(redis_port))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        os.path.exists(os.path.dirname(pg_data)) or os.path.exists(os.path.dirname(redis_log))
    ):
        time.sleep(0.05)
    assert not os.path.exists(os.path.dirname(pg_data))
    assert not os.path.exists(os.path.dirname(redis_log))
