"""Test helpers for tenxgraph and for agents built on it.

- :mod:`tenxgraph.testing.services`: throwaway PostgreSQL/Redis servers.
- :mod:`tenxgraph.testing.effects`: :class:`EffectCounter`, side effects counted in a file
  that outlives killed processes.
- :mod:`tenxgraph.testing.crash`: :func:`run_until_crash` / :func:`resume`, a graph crashed at
  a failpoint in a child process and resumed in a fresh one.
- :mod:`tenxgraph.testing.race`: :func:`race`, several processes invoking one thread at once.

Pytest fixtures live in :mod:`tenxgraph.testing.pytest_plugin` (registered automatically).
See docs/testing-kit.md.
"""

from tenxgraph.testing.crash import (
    FAILPOINTS_ENV,
    ChildException,
    CrashKit,
    CrashResult,
    ResumeResult,
    parse_failpoints,
    resume,
    run_until_crash,
)
from tenxgraph.testing.effects import EFFECTS_ENV, Effect, EffectCounter
from tenxgraph.testing.race import WorkerResult, race
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
    "EFFECTS_ENV",
    "FAILPOINTS_ENV",
    "PG_DSN_ENV",
    "REDIS_URL_ENV",
    "ChildException",
    "CrashKit",
    "CrashResult",
    "Effect",
    "EffectCounter",
    "PostgresServer",
    "RedisServer",
    "ResumeResult",
    "WorkerResult",
    "find_pg_binary",
    "find_redis_server",
    "parse_failpoints",
    "race",
    "resume",
    "run_until_crash",
    "start_postgres",
    "start_redis",
]
