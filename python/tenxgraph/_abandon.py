"""Waiting for user code with a deadline, without waiting for its cancellation.

``asyncio.wait_for`` cancels the work at its deadline and then waits, without a limit, for that
work to end: code that swallows its cancellation (a retry loop with a bare ``except:``) held the
caller for ever (an event publisher, session 29; a lifecycle hook and an input validator,
session 35). ``within`` cancels it and leaves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["within"]

T = TypeVar("T")


def _consume(task: asyncio.Future[Any]) -> None:
    """Work left after its deadline: its outcome is nobody's (no 'never retrieved' warning)."""
    if not task.cancelled():
        task.exception()


async def within(work: Awaitable[T], limit: float) -> T:
    """``work``'s result if it ends within ``limit`` seconds; else ``TimeoutError``, the work
    cancelled and not waited for. Cancelling the caller cancels the work too (also not waited
    for: the caller's own cancellation must not hang either)."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
    except asyncio.CancelledError:
        task.cancel()
        task.add_done_callback(_consume)
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_consume)
        raise TimeoutError
    return task.result()
