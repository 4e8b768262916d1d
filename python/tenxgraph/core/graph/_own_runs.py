"""The runs of this process in flight, by thread: a caller that cancels its own run and at once
calls again for the same thread (a client's timeout and retry, ``task.cancel()`` then the same
turn) met that run still holding the thread. ``cancel()`` only asks: the task unwinds (records
the results of tools that returned, releases its lease) at its next step of the loop, and the
retry ran first, so it was refused ``STORAGE_BUSY_002`` naming its own cancelled run (red-team,
session 41), though the engine promises a caller's own retry a wait for a run it dropped. A run
of this loop whose task was asked to cancel is waited for (at most ``busy_timeout``) before the
call goes to the engine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["in_flight", "settle_cancelled"]

_lock = threading.Lock()
_runs: dict[str, set[asyncio.Task[object]]] = {}


@contextmanager
def in_flight(thread_id: str) -> Iterator[None]:
    """Registers the current task as running a call for ``thread_id`` while the block runs."""
    task = asyncio.current_task()
    if task is None:
        yield
        return
    with _lock:
        _runs.setdefault(thread_id, set()).add(task)
    try:
        yield
    finally:
        with _lock:
            tasks = _runs.get(thread_id)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    del _runs[thread_id]


async def settle_cancelled(thread_id: str, timeout: float) -> None:
    """Waits (at most ``timeout`` seconds) for the runs of ``thread_id`` on this loop whose tasks
    were asked to cancel and have not unwound yet. Runs on other loops, and runs not cancelled,
    are the engine's to answer (its lease)."""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    with _lock:
        tasks = list(_runs.get(thread_id, ()))
    pending = [t for t in tasks if t is not me and not t.done() and t.get_loop() is loop and t.cancelling()]
    if pending:
        await asyncio.wait(pending, timeout=max(timeout, 0.0))
