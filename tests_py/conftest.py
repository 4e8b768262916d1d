"""Shared fixtures: every runtime test runs against each checkpointer backend."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tenxgraph.storage.checkpointer import InMemoryCheckpointer, PgCheckpointer, SqliteCheckpointer

BACKENDS = ["memory", "sqlite", "postgres", "postgres+redis"]


def make_checkpointer(kind: str, request: pytest.FixtureRequest, tmp_path: Path, **kw):
    """A fresh, empty checkpointer of ``kind``; Postgres ones get a schema of their own."""
    if kind == "memory":
        return InMemoryCheckpointer(**kw)
    if kind == "sqlite":
        return SqliteCheckpointer(tmp_path / "cp.db", **kw)
    pg = request.getfixturevalue("tenx_postgres")
    redis_url = request.getfixturevalue("tenx_redis").url if kind == "postgres+redis" else None
    kw.setdefault("enforce_user_isolation", False)  # the embedded defaults, so one suite fits all
    cp = PgCheckpointer(pg.dsn, redis_url=redis_url, schema=f"t_{uuid.uuid4().hex[:16]}", **kw)
    # Connected and migrated here, as the constructor used to: tests that time a run's first
    # steps must not include opening the pool and creating the schema.
    cp.setup()
    return cp


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
def checkpointer(request: pytest.FixtureRequest, tmp_path: Path):
    return make_checkpointer(request.param, request, tmp_path)


@pytest.fixture
def make_thread() -> Callable[[str], str]:
    """Returns a factory of unique thread ids: ``make_thread("name")``."""
    counter = itertools.count()
    run = uuid.uuid4().hex[:8]

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{run}-{next(counter)}"

    return make


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--torture-rounds", type=int, default=None,
                     help="rounds of tests_py/test_torture.py (default 12, or TENXGRAPH_TORTURE_ROUNDS)")


from tests_py.oracle import oracle  # noqa: E402,F401  (the differential fixture, tests_py/oracle.py)


@pytest.fixture(autouse=True)
def _process_wide_id_generator_restored():
    """``StateGraph(id_generator=...)`` installs a process-wide message id generator (10xGraph's
    DI-bound "generated_id"); a test that builds such a graph must not decide the ids of the
    tests after it."""
    from tenxgraph.core.state.message import get_id_generator, set_id_generator

    before = get_id_generator()
    yield
    set_id_generator(before)
