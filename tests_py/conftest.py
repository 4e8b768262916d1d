"""Shared fixtures: every runtime test runs against each checkpointer backend."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer


@pytest.fixture(params=["memory", "sqlite"], ids=["memory", "sqlite"])
def checkpointer(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        return InMemoryCheckpointer()
    return SqliteCheckpointer(tmp_path / "cp.db")


@pytest.fixture
def make_thread() -> Callable[[str], str]:
    """Returns a factory of unique thread ids: ``make_thread("name")``."""
    counter = itertools.count()
    run = uuid.uuid4().hex[:8]

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{run}-{next(counter)}"

    return make
