"""BackgroundTaskManager: fire-and-forget asyncio tasks that are tracked, bounded and shut down.

As 10xGraph's: at most ``max_pending_tasks`` in flight (the newest is dropped and counted beyond
that, so a stuck sink sheds load instead of growing memory), a per-task timeout, failures logged
(never raised into the caller), and ``shutdown()`` cancels what is left within a deadline.
It records 10xGraph's ``background_task_manager.*`` counters in :mod:`tenxgraph.utils.metrics`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from tenxgraph.utils import metrics

__all__ = ["BackgroundTaskManager", "TaskMetadata", "DEFAULT_MAX_PENDING_TASKS"]

_log = logging.getLogger("tenxgraph.utils")
DEFAULT_MAX_PENDING_TASKS = 1000
_DROP_WARNING_EVERY_SECONDS = 5.0
# Long enough for an ordinary cleanup (a flush, a connection closed) to finish, short enough that
# a shutdown does not stall on a task that will never end.
_CANCEL_ALL_TIMEOUT = 1.0


@dataclass
class TaskMetadata:
    """What the manager keeps about one task in flight: name, creation time (epoch seconds),
    timeout and the caller's context dict (logged with a failure)."""
    name: str
    created_at: float
    timeout: float | None = None
    context: dict[str, Any] | None = field(default=None)


class BackgroundTaskManager:
    """Tracks fire-and-forget asyncio tasks (see the module docstring): bounded by
    ``max_pending_tasks``, each with an optional timeout, failures logged and never raised.
    Not thread-safe: use it from one event loop."""
    def __init__(self, default_shutdown_timeout: float = 30.0,
                 max_pending_tasks: int = DEFAULT_MAX_PENDING_TASKS) -> None:
        self._meta: dict[asyncio.Task[Any], TaskMetadata] = {}
        self._shutdown_timeout = default_shutdown_timeout
        self._max_pending = max_pending_tasks
        self._is_shutdown = False
        self._dropped = 0
        self._last_drop_warning = 0.0
        self._timers: set[asyncio.Task[Any]] = set()

    @property
    def pending_count(self) -> int:
        """Tasks in flight now (created, not yet finished)."""
        return len(self._meta)

    @property
    def dropped_count(self) -> int:
        """Tasks refused since creation because ``max_pending_tasks`` were in flight."""
        return self._dropped

    def create_task(self, coro: Coroutine[Any, Any, Any], *, name: str = "background_task",
                    timeout: float | None = None, context: dict[str, Any] | None = None) -> asyncio.Task[Any] | None:
        """Starts ``coro`` in the background; None (and the coroutine closed, never run) when
        ``max_pending_tasks`` are already in flight (0 disables the bound), or after ``shutdown()``:
        a task started then would outlive the shutdown that was meant to wait for it (10xGraph
        0.10 still started it)."""
        if self._is_shutdown:
            coro.close()
            _log.warning("background task %r refused: the manager has been shut down", name)
            return None
        if self._max_pending and len(self._meta) >= self._max_pending:
            self._dropped += 1
            metrics.counter("background_task_manager.tasks_dropped").inc()
            coro.close()
            now = time.monotonic()
            if now - self._last_drop_warning >= _DROP_WARNING_EVERY_SECONDS:
                self._last_drop_warning = now
                _log.warning("background queue full (%d in flight): dropped %r (%d dropped so far)",
                             len(self._meta), name, self._dropped)
            return None
        task = asyncio.get_running_loop().create_task(coro, name=name)
        metrics.counter("background_task_manager.tasks_created").inc()
        self._meta[task] = TaskMetadata(name=name, created_at=time.time(), timeout=timeout, context=context or {})
        task.add_done_callback(self._done)
        if timeout:
            timer = asyncio.get_running_loop().create_task(self._expire(task, timeout))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)
            task.add_done_callback(lambda _t: timer.cancel())
        return task

    async def _expire(self, task: asyncio.Task[Any], timeout: float) -> None:
        await asyncio.sleep(timeout)
        if not task.done():
            meta = self._meta.get(task)
            _log.warning("background task %r timed out after %ss", meta.name if meta else "?", timeout)
            task.cancel()
            metrics.counter("background_task_manager.tasks_timed_out").inc()

    def _done(self, task: asyncio.Task[Any]) -> None:
        meta = self._meta.pop(task, None)
        if task.cancelled():
            metrics.counter("background_task_manager.tasks_cancelled").inc()
            return
        exc = task.exception()
        if exc is None:
            metrics.counter("background_task_manager.tasks_completed").inc()
        else:
            metrics.counter("background_task_manager.tasks_failed").inc()
            _log.error("background task %r failed: %s", meta.name if meta else "?", exc, exc_info=exc,
                       extra={"task_context": meta.context if meta else {}})

    async def cancel_all(self, timeout: float | None = _CANCEL_ALL_TIMEOUT) -> None:
        """Cancels every task in flight and waits up to ``timeout`` seconds (default 1; None: no
        bound) for them to end, returning as soon as they all have. Their errors are logged, not
        raised. A task still running then (its cleanup hangs, or it swallowed the cancellation)
        is logged by name and left to end on its own: a caller shutting down must not hang on
        it. 10xGraph 0.10 cancels and returns after 0.1 s, whether the tasks ended or not."""
        tasks = [t for t in self._meta if not t.done()]
        for t in tasks:
            t.cancel()
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            names = sorted(m.name for t, m in self._meta.items() if t in pending)
            _log.warning("cancel_all: %d background task(s) still running %ss after being cancelled: %s",
                         len(pending), timeout, ", ".join(names))

    async def wait_for_all(self, timeout: float | None = None, return_exceptions: bool = False) -> None:
        """Waits for the tasks in flight; with ``timeout``, gives up (logged) after that long
        and leaves them running."""
        tasks = list(self._meta)
        if not tasks:
            return
        gathered = asyncio.gather(*tasks, return_exceptions=return_exceptions)
        if not timeout:
            await gathered
            return
        done, _pending = await asyncio.wait({asyncio.ensure_future(gathered)}, timeout=timeout)
        if not done:
            _log.warning("timed out waiting for %d background tasks; they keep running", len(self._meta))
            metrics.counter("background_task_manager.wait_timeout").inc()
        else:
            next(iter(done)).result()

    def get_task_count(self) -> int:
        """Tasks in flight now (same as ``pending_count``)."""
        return len(self._meta)

    def get_task_info(self) -> list[dict[str, Any]]:
        """One dict per task in flight: name, age_seconds, timeout, context, done, cancelled."""
        now = time.time()
        return [{"name": m.name, "age_seconds": now - m.created_at, "timeout": m.timeout, "context": m.context,
                 "done": t.done(), "cancelled": t.cancelled() if t.done() else False}
                for t, m in self._meta.items()]

    async def shutdown(self, timeout: float | None = None) -> dict[str, Any]:
        """Cancels the tasks in flight and waits up to ``timeout`` (default: the constructor's)
        for them to end. Returns 10xGraph's statistics; a second call ``{"status":
        "already_shutdown", "tasks_remaining": 0}``."""
        if self._is_shutdown:
            return {"status": "already_shutdown", "tasks_remaining": 0}
        self._is_shutdown = True
        limit = self._shutdown_timeout if timeout is None else timeout
        started = time.time()
        tasks = list(self._meta)
        for t in tasks:
            t.cancel()
        status = "completed"
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=limit)
            status = "timeout" if pending else "completed"
        metrics.counter(f"background_task_manager.shutdown_{status}").inc()
        remaining = sum(1 for t in tasks if not t.done())
        return {"status": status, "initial_tasks": len(tasks), "completed_tasks": len(tasks) - remaining,
                "remaining_tasks": remaining, "duration_seconds": time.time() - started}

    async def __aenter__(self) -> BackgroundTaskManager:
        return self

    async def __aexit__(self, *exc: object) -> bool:
        await self.shutdown()
        return False
