"""Async tool calls in flight, process-wide: the async twin of ``tenxgraph._sync_calls``.

An async tool can catch its ``CancelledError`` and finish its work anyway. When its run stopped
waiting for it (``tool_timeout``, ``node_timeout``, ``stop()``, the caller's cancel), the call
goes on in its task and its result is recorded when it returns (``RunTools._record_late_async``).
A resume that came before that (a client retrying at once) found no record and ran the call a
second time, with the same idempotency key, while the first was still running (helper red-team,
session 29: charged twice in 4 of 4 rounds on every backend). Each ledgered async call is
registered here under ``(store, idempotency key)`` until its result is recorded or handed on; a
new attempt of the same call in this process waits for it and takes its result instead.

The registry costs a lock and a dict entry per call; the waiting side's future is made only when
there is one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Hashable

__all__ = ["Flight", "finish", "start", "wait"]

_lock = threading.Lock()
_flights: dict[Hashable, Flight] = {}


class Flight:
    """One async call in flight; ``result`` is made for an attempt that waits for it."""

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: concurrent.futures.Future[str | None] | None = None


def start(key: Hashable) -> tuple[Flight | None, concurrent.futures.Future[str | None] | None]:
    """``(mine, None)``: no call runs under ``key``; this attempt runs it, registered as ``mine``
    (``finish`` it). ``(None, future)``: one does; ``future`` gives its envelope once it is on
    record, or None when it ended without one (then run it)."""
    with _lock:
        running = _flights.get(key)
        if running is None:
            mine = _flights[key] = Flight()
            return mine, None
        if running.result is None:
            running.result = concurrent.futures.Future()
            running.result.set_running_or_notify_cancel()
        return None, running.result


def finish(key: Hashable, flight: Flight, envelope: str | None) -> None:
    """The call ended: its envelope (recorded, or about to be by its own run), or None."""
    with _lock:
        if _flights.get(key) is flight:
            del _flights[key]
        waiting = flight.result
    if waiting is not None and not waiting.done():
        waiting.set_result(envelope)


async def wait(future: concurrent.futures.Future[str | None]) -> str | None:
    """The earlier attempt's envelope, awaited from any loop (the earlier run may have run on
    another one: the sync wrappers run their own)."""
    return await asyncio.wrap_future(future)
