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
there is one. A call whose loop is closed or no longer running (a user's loop left after a
Ctrl-C) can never end: a new attempt runs the call instead of waiting for it (helper red-team,
session 32: the resume waited up to ``tool_timeout``, past ``busy_timeout``, then told the
model the call had timed out, though it never ran).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Hashable

__all__ = ["Flight", "finish", "start", "wait"]

# How often a waiting attempt looks whether the call it waits for was stranded.
_STRANDED_CHECK = 0.5

_lock = threading.Lock()
_flights: dict[Hashable, Flight] = {}


class Flight:
    """One async call in flight, on ``loop``; ``result`` is made for an attempt that waits for it."""

    __slots__ = ("loop", "result")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.result: concurrent.futures.Future[str | None] | None = None

    def stranded(self) -> bool:
        """Its loop is closed or no longer running: the call cannot end by itself."""
        return self.loop is not None and (self.loop.is_closed() or not self.loop.is_running())


def start(key: Hashable) -> tuple[Flight | None, Flight | None]:
    """``(mine, None)``: no call runs under ``key`` (or only a stranded one); this attempt runs
    it, registered as ``mine`` (``finish`` it). ``(None, flight)``: one does; ``wait(flight)``
    gives its envelope once it is on record, or None when it ended without one (then run it)."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    with _lock:
        running = _flights.get(key)
        if running is None or running.stranded():
            mine = _flights[key] = Flight(loop)
            return mine, None
        if running.result is None:
            running.result = concurrent.futures.Future()
            running.result.set_running_or_notify_cancel()
        return None, running


def finish(key: Hashable, flight: Flight, envelope: str | None) -> None:
    """The call ended: its envelope (recorded, or about to be by its own run), or None."""
    with _lock:
        if _flights.get(key) is flight:
            del _flights[key]
        waiting = flight.result
    if waiting is not None and not waiting.done():
        waiting.set_result(envelope)


async def wait(flight: Flight) -> str | None:
    """The earlier attempt's envelope, awaited from any loop (the earlier run may have run on
    another one: the sync wrappers run their own); None once its loop stranded it."""
    assert flight.result is not None, "made by start()"
    waiting = asyncio.wrap_future(flight.result)
    while True:
        # asyncio.wait, not wait_for: a timeout must not cancel the future other attempts share.
        done, _ = await asyncio.wait({waiting}, timeout=_STRANDED_CHECK)
        if done:
            return waiting.result()
        if flight.stranded():
            return None
