"""Runs in flight on each checkpointer, so that closing a graph (``aclose()``) or releasing a
checkpointer (``arelease()``) lets them end, or cancels them and lets them unwind, before the
store closes. Closed under a run, the store refused the ledger write of a tool that returned a
moment later, and the thread's next run fired that tool again (helper red-team, session 32:
10 of 10 on SQLite and PostgreSQL).

A run is registered by the task that drives it and the loop that task runs on; runs of a sync
``invoke`` run on a private loop thread and are cancelled through it. A task whose loop is closed
or no longer running can never end by itself and is not waited for. Sync tool calls of the store
still in their threads (Python cannot stop them) are waited for too, within the same bound, so
their late results reach the ledger.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tenxgraph import _sync_calls

__all__ = ["UNWIND_SECONDS", "drain", "settle_cancelled", "tracked"]

# A cancelled run's own bounds: its tool tasks unwind (5 s), then what they returned is recorded
# (10 s) (tenxgraph._run_tools).
UNWIND_SECONDS = 15.0

_lock = threading.Lock()
# Per checkpointer: each run's task, its loop, its thread, and how many cancels its task had
# been asked before the run began (a task that swallowed one stays "cancelling" for good).
_runs: dict[int, set[tuple[asyncio.Task[Any], asyncio.AbstractEventLoop, str, int]]] = {}
_POLL = 0.02


@contextmanager
def tracked(checkpointer: Any, thread_id: str) -> Iterator[None]:
    """Registers the current task as a run on ``checkpointer`` of ``thread_id`` for the block."""
    task = asyncio.current_task()
    if task is None:
        yield
        return
    entry = (task, asyncio.get_running_loop(), thread_id, task.cancelling())
    key = id(checkpointer)
    with _lock:
        _runs.setdefault(key, set()).add(entry)
    try:
        yield
    finally:
        with _lock:
            runs = _runs.get(key)
            if runs is not None:
                runs.discard(entry)
                if not runs:
                    del _runs[key]


def _live(checkpointer: Any, me: asyncio.Task[Any] | None) -> list[tuple[asyncio.Task[Any], asyncio.AbstractEventLoop]]:
    with _lock:
        runs = list(_runs.get(id(checkpointer), ()))
    return [(t, loop) for t, loop, _, _ in runs
            if t is not me and not t.done() and not loop.is_closed() and loop.is_running()]


async def settle_cancelled(checkpointer: Any, thread_id: str, timeout: float) -> None:
    """Waits (at most ``timeout`` seconds) for the runs of ``thread_id`` on ``checkpointer`` and
    this loop whose tasks were asked to cancel and have not unwound yet. A caller that cancels
    its own run and at once calls again for the thread (a client's timeout and retry) met that
    run still holding the thread: ``cancel()`` only asks, the task unwinds (records what its
    tools returned, releases its lease) at its next step of the loop, and the retry went first,
    refused ``STORAGE_BUSY_002`` naming its own cancelled run (red-team, session 41). Runs on
    other loops, and runs not cancelled, are the engine's to answer (its lease)."""
    me = asyncio.current_task()
    here = asyncio.get_running_loop()
    with _lock:
        runs = list(_runs.get(id(checkpointer), ()))
    pending = [t for t, loop, thread, before in runs
               if thread == thread_id and t is not me and loop is here and not t.done() and t.cancelling() > before]
    if pending:
        # A cancelled run unwinds within UNWIND_SECONDS; one that goes on (its code caught the
        # cancel) is a live holder, the engine's to answer.
        await asyncio.wait(pending, timeout=min(max(timeout, 0.0), UNWIND_SECONDS))


async def drain(checkpointer: Any, patience: float, unwind: float) -> int:
    """Waits up to ``patience`` seconds for the runs in flight on ``checkpointer`` to end, then
    cancels the rest and waits up to ``unwind`` seconds for them to unwind (a cancelled run
    records what its tools returned). The calling task itself is left alone. Returns how many
    runs were cancelled."""
    me = asyncio.current_task()
    here = asyncio.get_running_loop()
    deadline = time.monotonic() + max(patience, 0.0)
    while _live(checkpointer, me) and time.monotonic() < deadline:
        await asyncio.sleep(_POLL)
    left = _live(checkpointer, me)
    for task, loop in left:
        if loop is here:
            task.cancel()
        else:
            loop.call_soon_threadsafe(task.cancel)
    deadline = time.monotonic() + max(unwind, 0.0)
    native = getattr(checkpointer, "_native", None)
    while ((_live(checkpointer, me) or (native is not None and _sync_calls.unsettled_on(id(native))))
           and time.monotonic() < deadline):
        await asyncio.sleep(_POLL)
    return len(left)
