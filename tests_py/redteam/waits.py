"""Polling a condition with a deadline, for tests that wait on files or database state (not on
sleeps with thin margins)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0, every: float = 0.02) -> Any:
    """``check()``'s first truthy answer; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


async def await_until(what: str, check: Callable[[], Any], timeout: float = 30.0, every: float = 0.01) -> Any:
    """``wait_until`` for a coroutine: the event loop runs between the checks."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(every)
