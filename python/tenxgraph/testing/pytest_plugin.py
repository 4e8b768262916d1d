"""Pytest fixtures of ``tenxgraph.testing``: throwaway PostgreSQL and Redis servers, effect counting, crash kits.

- ``tenx_postgres`` (session): a :class:`PostgresServer` (database ``tenx``).
- ``tenx_redis`` (session): a :class:`RedisServer`.
- ``pg_dsn`` (function): the DSN of a fresh database ``tenx_<uuid>`` on ``tenx_postgres``,
  dropped after the test.
- ``effects`` (function): an :class:`EffectCounter` on a fresh file of the test's tmp dir; its
  path is exported as ``$TENXGRAPH_EFFECTS`` for the test, so child processes (and
  ``EffectCounter.from_env()`` in your tools) record into it.
- ``sqlite_db`` (function): a path (str) for a SQLite database in the test's tmp dir.
- ``crash_kit`` (function): a :class:`CrashKit`, ``run_until_crash`` / ``resume`` / ``race``
  bound to the test's tmp dir, with ``db`` defaulting to ``sqlite_db`` and ``effects`` set.

``TENXGRAPH_TEST_PG_DSN`` / ``TENXGRAPH_TEST_REDIS_URL`` point the fixtures at existing servers
(``pg_dsn`` then needs the right to CREATE DATABASE there).
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenxgraph.testing.crash import CrashKit
from tenxgraph.testing.effects import EFFECTS_ENV, EffectCounter
from tenxgraph.testing.services import PostgresServer, RedisServer, start_postgres, start_redis

__all__ = ["crash_kit", "effects", "pg_dsn", "sqlite_db", "tenx_postgres", "tenx_redis"]


@pytest.fixture(scope="session")
def tenx_postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the session (``start_postgres``; the server of
    ``TENXGRAPH_TEST_PG_DSN`` when set), stopped at the session's end."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tenx_redis() -> Iterator[RedisServer]:
    """A throwaway Redis server for the session (``start_redis``; the server of
    ``TENXGRAPH_TEST_REDIS_URL`` when set), stopped at the session's end."""
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(tenx_postgres: PostgresServer) -> Iterator[str]:
    """The DSN of a fresh database ``tenx_<uuid>`` on ``tenx_postgres``, dropped after the test (a
    failed drop is a warning, never a test error)."""
    name = f"tenx_{uuid.uuid4().hex}"
    dsn = tenx_postgres.create_database(name)
    try:
        yield dsn
    finally:
        try:
            tenx_postgres.drop_database(name)
        except RuntimeError as e:  # never turn a passing test into an error over cleanup
            warnings.warn(f"could not drop test database {name}: {e}", stacklevel=1)


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EffectCounter:
    """A fresh :class:`EffectCounter`; ``$TENXGRAPH_EFFECTS`` names its file during the test."""
    counter = EffectCounter(tmp_path / "effects.jsonl")
    monkeypatch.setenv(EFFECTS_ENV, str(counter.path))
    return counter


@pytest.fixture
def sqlite_db(tmp_path: Path) -> str:
    """The path of a (not yet created) SQLite database file in the test's tmp dir."""
    return str(tmp_path / "tenx.db")


@pytest.fixture
def crash_kit(tmp_path: Path, sqlite_db: str, effects: EffectCounter) -> CrashKit:
    """``run_until_crash`` / ``resume`` / ``race`` bound to this test (files under tmp_path/crash-kit,
    db defaults to ``sqlite_db``, ``crash_kit.effects`` is the ``effects`` counter)."""
    return CrashKit(tmp_path / "crash-kit", db=sqlite_db, effects=effects)
