"""Pytest fixtures for throwaway PostgreSQL and Redis servers.

- ``tenx_postgres`` (session): a :class:`PostgresServer` (database ``tenx``).
- ``tenx_redis`` (session): a :class:`RedisServer`.
- ``pg_dsn`` (function): the DSN of a fresh database ``tenx_<uuid>`` on ``tenx_postgres``,
  dropped after the test.

``TENXGRAPH_TEST_PG_DSN`` / ``TENXGRAPH_TEST_REDIS_URL`` point the fixtures at existing servers
(``pg_dsn`` then needs the right to CREATE DATABASE there).
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator

import pytest

from tenxgraph.testing.services import PostgresServer, RedisServer, start_postgres, start_redis

__all__ = ["pg_dsn", "tenx_postgres", "tenx_redis"]


@pytest.fixture(scope="session")
def tenx_postgres() -> Iterator[PostgresServer]:
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tenx_redis() -> Iterator[RedisServer]:
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(tenx_postgres: PostgresServer) -> Iterator[str]:
    name = f"tenx_{uuid.uuid4().hex}"
    dsn = tenx_postgres.create_database(name)
    try:
        yield dsn
    finally:
        try:
            tenx_postgres.drop_database(name)
        except RuntimeError as e:  # never turn a passing test into an error over cleanup
            warnings.warn(f"could not drop test database {name}: {e}", stacklevel=1)
