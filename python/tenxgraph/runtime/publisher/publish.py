"""Getting events to a publisher without ever holding up a run.

Each publisher gets an outbox per event loop: a bounded queue drained by one task on that loop,
which awaits ``publisher.publish(event)`` for one event at a time, in order, each under a
deadline (:data:`PUBLISH_TIMEOUT_SECONDS`). Queuing an event is O(1) and never waits:

* a full outbox (:data:`MAX_PENDING_EVENTS`, 10xGraph's bound on in-flight publishes) drops the
  new event, counted in ``dropped_count`` and warned about at most every few seconds;
* a ``publish`` that raises is logged and counted in ``failed_count``;
* a ``publish`` that does not finish within the deadline is cancelled and counted in
  ``timed_out_count``; the next event goes on.

So a slow, hung or failing publisher costs events, never a step. The drain shares the run's loop
(publishers may hold loop-bound clients, or feed an ``asyncio.Queue`` a web handler reads), so
``publish`` must not block the loop thread itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import threading
import time
from typing import Any

from tenxgraph._abandon import within
from tenxgraph.runtime.publisher.base_publisher import BasePublisher
from tenxgraph.runtime.publisher.events import EventModel

__all__ = [
    "MAX_PENDING_EVENTS",
    "PUBLISH_TIMEOUT_SECONDS",
    "EventOutbox",
    "outbox_for",
    "publish_event",
]

_log = logging.getLogger("tenxgraph.publisher")

MAX_PENDING_EVENTS = 1000
PUBLISH_TIMEOUT_SECONDS = 10.0
_WARN_EVERY_SECONDS = 5.0

# The publisher of the run whose code is executing (set by the runtime around a run), so a node
# or tool calling publish_event(event) reaches its graph's publisher, as 10xGraph's injection did.
_current: contextvars.ContextVar[tuple[EventOutbox, asyncio.AbstractEventLoop] | None] = contextvars.ContextVar(
    "tenxgraph_publisher", default=None
)


class _LoopQueue:
    __slots__ = ("events", "task")

    def __init__(self) -> None:
        self.events: collections.deque[EventModel] = collections.deque()
        self.task: asyncio.Task[None] | None = None


class EventOutbox:
    """The delivery side of one publisher (see the module docstring). Counters are cumulative."""

    def __init__(self, publisher: BasePublisher, max_pending: int = MAX_PENDING_EVENTS,
                 publish_timeout: float | None = PUBLISH_TIMEOUT_SECONDS) -> None:
        self.publisher = publisher
        self.max_pending = max_pending
        self.publish_timeout = publish_timeout
        self.delivered_count = 0
        self.dropped_count = 0
        self.failed_count = 0
        self.timed_out_count = 0
        self._queues: dict[asyncio.AbstractEventLoop, _LoopQueue] = {}
        self._lock = threading.Lock()
        self._last_warning = 0.0

    @property
    def pending_count(self) -> int:
        """Events queued or being delivered now, over every loop. Thread-safe."""
        with self._lock:
            return sum(len(q.events) + (q.task is not None) for q in self._queues.values())

    def submit(self, event: EventModel, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Queues ``event`` for delivery on ``loop`` (default: the running loop). Safe from any
        thread; never blocks; never raises for a publisher's sake."""
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._drop("no running event loop to deliver it on")
                return
        # Always through the loop's callback queue, from its own thread too: the run reports
        # from the loop thread and from the core's threads, and one FIFO keeps their order.
        try:
            loop.call_soon_threadsafe(self._put, loop, event)
        except RuntimeError:  # the loop is closed
            self._drop("its run's event loop is closed")

    def _put(self, loop: asyncio.AbstractEventLoop, event: EventModel) -> None:
        with self._lock:
            q = self._queues.get(loop)
            if q is None:
                q = self._queues[loop] = _LoopQueue()
            if self.max_pending and len(q.events) >= self.max_pending:
                full = True
            else:
                full = False
                q.events.append(event)
                start = q.task is None
        if full:
            self._drop(f"{self.max_pending} events are already waiting (the publisher is not keeping up)")
            return
        if start:
            # The drain must not inherit the run's context: it outlives the run.
            q.task = loop.create_task(self._drain(loop, q), context=contextvars.Context())

    def _drop(self, why: str) -> None:
        self.dropped_count += 1
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY_SECONDS:
            self._last_warning = now
            _log.warning("event for %s dropped: %s; %d dropped so far",
                         type(self.publisher).__name__, why, self.dropped_count)

    async def _drain(self, loop: asyncio.AbstractEventLoop, q: _LoopQueue) -> None:
        try:
            while True:
                with self._lock:
                    if not q.events:
                        q.task = None
                        self._queues.pop(loop, None)
                        return
                    event = q.events.popleft()
                await self._deliver(event)
        finally:
            with self._lock:
                if q.task is asyncio.current_task():
                    q.task = None
                    self._queues.pop(loop, None)

    async def _deliver(self, event: EventModel) -> None:
        try:
            if self.publish_timeout is None:
                await self.publisher.publish(event)
            else:
                # Not wait_for: a publish that swallows its cancellation held the outbox, and the
                # loop's close, for ever. Cancelled and left.
                await within(self.publisher.publish(event), self.publish_timeout)
            self.delivered_count += 1
        except asyncio.TimeoutError:
            self.timed_out_count += 1
            _log.warning("%s.publish did not finish within %ss; cancelled (%d so far)",
                         type(self.publisher).__name__, self.publish_timeout, self.timed_out_count)
        except Exception as exc:  # noqa: BLE001 - a publisher's failure is never the run's
            self.failed_count += 1
            _log.error("Failed to publish event: %r", exc)

    async def flush(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for this loop's queued events to be delivered;
        returns whether they all were."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)  # events submitted before this call reach the queue first
        with self._lock:
            q = self._queues.get(loop)
            task = q.task if q is not None else None
        if task is None:
            return True
        done, _ = await asyncio.wait({task}, timeout=max(timeout, 0.0))
        return bool(done)


_strong: dict[int, EventOutbox] = {}  # publishers that take no attribute (__slots__)
_outboxes_lock = threading.Lock()
_ATTR = "_tenxgraph_outbox"


def outbox_for(publisher: BasePublisher) -> EventOutbox:
    """The outbox of ``publisher`` (one per publisher object, made on first use). It lives on
    the publisher, so a graph built per request with its own publisher leaves nothing behind."""
    box = getattr(publisher, _ATTR, None)
    if isinstance(box, EventOutbox) and box.publisher is publisher:
        return box
    with _outboxes_lock:
        box = getattr(publisher, _ATTR, None)
        if isinstance(box, EventOutbox) and box.publisher is publisher:
            return box
        box = EventOutbox(publisher)
        try:
            setattr(publisher, _ATTR, box)
        except (AttributeError, TypeError):
            held = _strong.get(id(publisher))
            if held is not None and held.publisher is publisher:
                return held
            _strong[id(publisher)] = box
        return box


def forget_outbox(publisher: BasePublisher) -> None:
    """Drops the outbox ``outbox_for`` had to keep in this module for ``publisher`` (one that
    takes no attribute). Called when the graph that owns the publisher closes it: the entry held
    the publisher itself, so neither was ever freed, one pair per graph built with such a
    publisher (a graph per request) for the life of the process."""
    with _outboxes_lock:
        held = _strong.get(id(publisher))
        if held is not None and held.publisher is publisher:
            del _strong[id(publisher)]


def publish_event(event: EventModel, publisher: BasePublisher | None = None, task_manager: Any = None) -> None:
    """Fire-and-forget: queue ``event`` for ``publisher`` (default: the publisher of the graph
    whose node or tool is running; no publisher, nothing happens). Returns at once.

    ``task_manager``: a ``BackgroundTaskManager``-like object whose ``create_task(coro)`` runs
    the publish instead of the outbox (10xGraph's signature)."""
    current = _current.get()
    if publisher is None:
        if current is None:
            return
        box, loop = current
        box.submit(event, loop)
        return
    if task_manager is not None:
        task_manager.create_task(_publish_logged(publisher, event))
        return
    run_loop = current[1] if current is not None else None
    outbox_for(publisher).submit(event, run_loop)


async def _publish_logged(publisher: BasePublisher, event: EventModel) -> None:
    try:
        await publisher.publish(event)
    except Exception as exc:  # noqa: BLE001
        _log.error("Failed to publish event: %r", exc)


def activate(box: EventOutbox | None, loop: asyncio.AbstractEventLoop) -> contextvars.Token[Any]:
    """Makes ``box`` the current run's publisher (the runtime calls this around a run)."""
    return _current.set((box, loop) if box is not None else None)


def deactivate(token: contextvars.Token[Any]) -> None:
    _current.reset(token)
