"""Test helpers: throwaway PostgreSQL/Redis servers (see :mod:`tenxgraph.testing.services`).

Pytest fixtures live in :mod:`tenxgraph.testing.pytest_plugin`.
"""

from tenxgraph.testing.services import (
    PG_DSN_ENV,
    REDIS_URL_ENV,
    PostgresServer,
    RedisServer,
    find_pg_binary,
    find_redis_server,
    start_postgres,
    start_redis,
)

__all__ = [
    "PG_DSN_ENV",
    "REDIS_URL_ENV",
    "PostgresServer",
    "RedisServer",
    "find_pg_binary",
    "find_redis_server",
    "start_postgres",
    "start_redis",
]
