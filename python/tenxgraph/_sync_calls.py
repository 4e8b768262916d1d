"""Sync (``def``) tool calls in flight, process-wide.

Python cannot stop a thread. A sync tool cut off by ``tool_timeout``, ``node_timeout`` or
``stop()`` runs on in its thread, and its side effect still happens. So the runtime does not
pretend: each ledgered sync call is registered here under ``(store, idempotency key)`` (the key is
derived from the thread and the ledger key) until its result is settled:

- a new attempt of the same call in this process (a resume, a replayed node) waits for the thread
  already running instead of starting a second one, bounded by its own deadline;
- a result that arrives when no attempt is waiting any more is recorded in the ledger by the
  worker thread itself (``late_record``); the ledger keeps the first result recorded and lets a
  result replace an intent, so a late record never overwrites an answer already given.

Each call gets a thread of its own, not the event loop's default executor: ``asyncio.run`` (under
``invoke``) waits for that executor on exit, so a run cut off at its deadline would still hang
until the tool finished.

At interpreter exit the process waits for those threads, so a tool mid-effect can finish and its
late result be recorded (a restart then answers from the ledger instead of running it again), but
only for ``TENXGRAPH_SYNC_TOOL_EXIT_GRACE`` seconds (default 10, a container's usual stop grace):
the threads are daemons, and a tool blocked for ever no longer keeps its process from exiting.
What is still running then is named in a warning (``sync_tool_abandoned_at_exit``); it is left as
a SIGKILL would leave it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from tenxgraph.logs import run_logger

__all__ = ["RECORD_IN", "THREAD_GONE", "drop_recorded", "in_flight", "recorded", "recorded_as", "run",
           "unsettled_on"]

_log = run_logger("tenxgraph.tools")
_lock = threading.Lock()
_flights: dict[Hashable, _Flight] = {}
# Calls whose late result was recorded, kept for a while after (key -> (flight, when)): an
# attempt that read the ledger before the record went in, and looks for the call after it left
# ``_flights``, joins its result instead of running the tool a second time (third red-team pass,
# session 37: a retry started as the cut call returned fired it again).
_recorded: dict[Hashable, tuple[_Flight, float]] = {}
RECORDED_KEPT_SECONDS = 300.0
RECORDED_KEPT_MAX = 256
# What a ``late_record`` returns when the ledger holds the call's result (its own, or one recorded
# first), and when its write was refused because the thread is gone; anything else: not held.
RECORD_IN = "in"
THREAD_GONE = "thread gone"
# The threads of sync calls and of their late records that have not ended (see the module notes).
_threads: set[threading.Thread] = set()

DEFAULT_EXIT_GRACE = 10.0


class _Flight:
    """One sync call's thread and its result."""

    def __init__(self, late_record: Callable[[Any], Any] | None) -> None:
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        # Running from the start: cancelling an attempt's wrapper must never cancel the result.
        self.future.set_running_or_notify_cancel()
        self.late_record = late_record
        # How its late record ended (RECORD_IN, THREAD_GONE, ...), once it has.
        self.recorded_as: Any = None
        self.waiters = 0
        # Someone answers for the result: an attempt returned it (its run records it), or a late
        # record was started.
        self.settled = False


def unsettled_on(store: int) -> bool:
    """Whether a call keyed ``(store, ...)`` is running or its result is not recorded yet."""
    with _lock:
        return any(isinstance(k, tuple) and k and k[0] == store for k in _flights)


def recorded(key: Hashable) -> bool:
    """Whether a call under ``key`` is not running and its late result was recorded lately
    (an attempt that finds it joins it: see ``_recorded``)."""
    with _lock:
        return key not in _flights and _fresh_recorded(key) is not None


def _fresh_recorded(key: Hashable) -> _Flight | None:
    """The call under ``key`` whose late result was recorded lately, if kept (``_lock`` held)."""
    entry = _recorded.get(key)
    return entry[0] if entry is not None and time.monotonic() - entry[1] < RECORDED_KEPT_SECONDS else None


def recorded_as(key: Hashable) -> Any:
    """How the late record of the call under ``key`` ended (None when there is none kept)."""
    with _lock:
        entry = _recorded.get(key)
        return None if entry is None else entry[0].recorded_as


def drop_recorded(key: Hashable) -> None:
    """Forget the recorded call under ``key``: its ledger row is gone (the thread was deleted
    since), so a new attempt of a call under that key is a new call and runs."""
    with _lock:
        _recorded.pop(key, None)


def in_flight(key: Hashable) -> bool:
    """Whether a sync call under ``key`` is running (or its result is not settled yet)."""
    with _lock:
        return key in _flights


async def run(key: Hashable | None, work: Callable[[], Any], late_record: Callable[[Any], Any] | None,
              name: str = "tool") -> Any:
    """``work()`` in a thread of its own, in a copy of the caller's contextvars; its return value.

    With a ``key``: an attempt while a call under the same key is unsettled waits for that call
    instead (``work`` is not run), and a result no attempt is waiting for goes to
    ``late_record(result)``, called on the worker thread (it may block). ``work`` should turn
    ordinary exceptions into results; anything it raises reaches the waiting attempts only."""
    flight, joined = _join_or_start(key, late_record)
    if joined:
        _log.info("sync tool call still running from an earlier attempt: waiting for it, not starting it again",
                  extra={"tool": name, "event": "sync_tool_joined"})
    else:
        ctx = contextvars.copy_context()
        _start(f"tenxgraph-tool-{name}", _work, key, flight, ctx, work)
    try:
        result = await asyncio.wrap_future(flight.future)
    except asyncio.CancelledError:
        _give_up(key, flight)
        raise
    except BaseException:
        _forget(key, flight, answered=True)
        raise
    _forget(key, flight, answered=True)
    return result


def _join_or_start(key: Hashable | None, late_record: Callable[[Any], Any] | None) -> tuple[_Flight, bool]:
    if key is None:
        alone = _Flight(None)
        alone.waiters = 1
        return alone, False
    with _lock:
        running = _flights.get(key)
        if running is None:
            running = _fresh_recorded(key)  # its result is in: joined, it returns at once
        flight = running if running is not None else _flights.setdefault(key, _Flight(late_record))
        flight.waiters += 1
        return flight, running is not None


def _work(key: Hashable | None, flight: _Flight, ctx: contextvars.Context, work: Callable[[], Any]) -> None:
    try:
        result = ctx.run(work)
    except BaseException as exc:  # noqa: BLE001 - handed to the attempt waiting, if any
        with _lock:
            flight.future.set_exception(exc)
            orphaned = flight.waiters == 0
        if orphaned:
            _log.warning("sync tool call cut off earlier ended with %r; nothing to record", exc,
                         extra={"event": "sync_tool_late_error"})
            _forget(key, flight, answered=False)
        return
    with _lock:
        flight.future.set_result(result)
        record = flight.waiters == 0 and not flight.settled and key is not None
        if record:
            flight.settled = True
    if record:
        _record_late(key, flight, result)


def _give_up(key: Hashable | None, flight: _Flight) -> None:
    """An attempt stopped waiting (its deadline, stop(), its run gone). When it was the last one
    and the result is already in, nobody else will record it: start the late record now."""
    with _lock:
        flight.waiters -= 1
        last = flight.waiters == 0
        failed = flight.future.done() and flight.future.exception() is not None
        record = last and flight.future.done() and not failed and not flight.settled and key is not None
        if record:
            flight.settled = True
        if last and failed and key is not None and _flights.get(key) is flight:
            del _flights[key]  # an error is no result: nothing to record or to wait for
    if record:
        result = flight.future.result()
        _start("tenxgraph-late-record", _record_late, key, flight, result)


def _record_late(key: Hashable | None, flight: _Flight, result: Any) -> None:
    try:
        if flight.late_record is not None:
            flight.recorded_as = flight.late_record(result)
    except Exception as exc:  # noqa: BLE001 - logged by late_record's owner; never kill the thread loudly
        _log.error("recording a late sync tool result failed: %s", exc, extra={"event": "sync_tool_late_record_failed"})
    finally:
        # Only now: until the record is in, a new attempt must find this call here, not run it;
        # and for a while after, one that read the ledger before the record went in.
        with _lock:
            # Only its result is kept: the recorder holds the run's state, the step and its store.
            flight.late_record = None
            if key is not None:
                now = time.monotonic()
                for old in [k for k, (_, when) in _recorded.items() if now - when >= RECORDED_KEPT_SECONDS]:
                    del _recorded[old]
                while len(_recorded) >= RECORDED_KEPT_MAX:
                    del _recorded[next(iter(_recorded))]
                _recorded[key] = (flight, now)
        _forget(key, flight, answered=False)


def _forget(key: Hashable | None, flight: _Flight, *, answered: bool) -> None:
    with _lock:
        if answered:
            flight.waiters -= 1
            flight.settled = True
        if key is not None and _flights.get(key) is flight and (flight.waiters == 0 or not answered):
            del _flights[key]


def _start(name: str, target: Callable[..., None], *args: Any) -> None:
    thread = threading.Thread(target=_tracked, args=(target, args), name=name, daemon=True)
    with _lock:
        _threads.add(thread)
    try:
        thread.start()
    except BaseException:
        # Never started (no threads left, or the interpreter shutting down): nothing to wait for,
        # and a join at exit would raise.
        with _lock:
            _threads.discard(thread)
        raise


def _tracked(target: Callable[..., None], args: tuple[Any, ...]) -> None:
    try:
        target(*args)
    finally:
        with _lock:
            _threads.discard(threading.current_thread())


def exit_grace() -> float:
    """``TENXGRAPH_SYNC_TOOL_EXIT_GRACE`` in seconds (>= 0), else the default; a bad value warns
    and gives the default (read at exit, where raising helps nobody)."""
    raw = os.environ.get("TENXGRAPH_SYNC_TOOL_EXIT_GRACE", "").strip()
    if not raw:
        return DEFAULT_EXIT_GRACE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (0.0 <= value < float("inf")):
        _log.warning("TENXGRAPH_SYNC_TOOL_EXIT_GRACE must be a number of seconds >= 0, got %r; using %gs",
                     raw, DEFAULT_EXIT_GRACE, extra={"event": "invalid_setting"})
        return DEFAULT_EXIT_GRACE
    return value


def wait_at_exit(grace: float | None = None) -> list[str]:
    """Waits up to ``grace`` seconds (default: ``exit_grace()``) for the sync calls still running
    and their late records; returns the names of the threads still running after it, each named
    in a warning. Registered with ``atexit``."""
    deadline = time.monotonic() + (exit_grace() if grace is None else grace)
    with _lock:
        pending = list(_threads)
    for thread in pending:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in pending if t.is_alive()]
    for name in left:
        _log.warning("process exiting while sync tool thread %s still runs: it is abandoned, as a kill would leave "
                     "it (its result, if it ever comes, is not recorded; a resume treats the call as unrecorded)",
                     name, extra={"event": "sync_tool_abandoned_at_exit"})
    return left


atexit.register(wait_at_exit)
