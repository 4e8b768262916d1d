"""Capturing tenxgraph's log records, the Rust core's included: the core caches the level it
reads from Python's ``tenxgraph`` logger, so the cache is reset when the level is set and again
when it is put back."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tenxgraph.logs import reset_level_cache


@contextmanager
def tenxgraph_records(caplog: pytest.LogCaptureFixture, level: int) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(level, logger="tenxgraph")
    reset_level_cache()
    try:
        yield caplog
    finally:
        logging.getLogger("tenxgraph").setLevel(logging.NOTSET)
        reset_level_cache()
