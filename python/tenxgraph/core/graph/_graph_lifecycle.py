"""The life of a ``CompiledGraph`` around its runs: recovery of dead runs (``arecover``,
``start_recovery``, ``compile(recover_on_start=...)``) and closing (``aclose``, ``async with``)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Self, cast

from tenxgraph import _in_flight as in_flight
from tenxgraph._live_states import LiveStates
from tenxgraph._sync import run_sync
from tenxgraph.logs import run_logger
from tenxgraph.runtime.publisher.publish import forget_outbox

if TYPE_CHECKING:
    from tenxgraph.core.graph.compiled_graph import CompiledGraph
    from tenxgraph.runtime.publisher.publish import EventOutbox
    from tenxgraph.storage.checkpointer import BaseCheckpointer
    from tenxgraph.utils.background_task_manager import BackgroundTaskManager

__all__ = ["GraphLifecycle", "recovery_options"]

_log = run_logger("tenxgraph.graph")


def recovery_options(value: Any) -> dict[str, Any] | None:
    """``compile(recover_on_start=...)``: False (off), True (defaults) or ``arecover``'s options."""
    if value is False or value is None:
        return None
    if value is True:
        return {}
    if isinstance(value, dict):
        unknown = set(value) - {"concurrency", "limit", "config"}
        if unknown:
            raise ValueError(f"recover_on_start options are concurrency, limit and config; got {sorted(unknown)}")
        return dict(value)
    raise TypeError(f"recover_on_start must be a bool or a dict of arecover() options, got {type(value).__name__}")


class GraphLifecycle:
    """Mixin of ``CompiledGraph``: recovery passes and closing."""

    _checkpointer: BaseCheckpointer
    _store: Any
    _publisher: Any
    _outbox: EventOutbox | None
    _live: LiveStates
    _task_manager: BackgroundTaskManager
    _closed: bool
    _recover_on_start: dict[str, Any] | None
    recovery: asyncio.Task[Any] | None
    shutdown_timeout: float

    async def arecover(
        self,
        *,
        concurrency: int = 4,
        limit: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> Any:
        """Resumes every thread of this graph's checkpointer whose run died (latest state
        ``running``, no live lease holder), as its owner, ``concurrency`` at a time; returns a
        :class:`tenxgraph.recovery.RecoveryReport` (resumed, skipped, failed). Safe to run from
        several workers at once: each thread is resumed by one of them. Paused, completed and
        failed threads are never touched. ``config``: run settings for every resume
        (``node_timeout``, ``recursion_limit``, ...). See :mod:`tenxgraph.recovery`."""
        from tenxgraph.recovery import recover

        return await recover(cast("CompiledGraph[Any]", self), concurrency=concurrency, limit=limit, config=config)

    def recover(
        self,
        *,
        concurrency: int = 4,
        limit: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> Any:
        """Sync ``arecover``."""
        return run_sync(self.arecover(concurrency=concurrency, limit=limit, config=config))

    def start_recovery(self, **options: Any) -> asyncio.Task[Any]:
        """Starts a recovery pass (``arecover(**options)``) in the background of the running
        event loop, for a worker to call when it starts; the task (also ``self.recovery``)
        resolves to the report. ``aclose()`` waits for it up to ``shutdown_timeout``, then
        cancels it (a cancelled resume leaves its thread for the next pass)."""
        task = asyncio.get_running_loop().create_task(self.arecover(**options), name="tenxgraph-recovery")
        self.recovery = task
        return task

    async def aclose(self) -> dict[str, Any]:
        """Closes the graph: runs in flight first (they get a third of ``shutdown_timeout`` to end,
        then are cancelled, recording what their tools returned as they unwind), then the
        publisher (its queued events delivered), background tasks, the checkpointer and the
        store, each within a third of ``shutdown_timeout``. Returns 10xGraph's statistics (one entry per
        component, ``total_duration``) plus ``"status": "closed"``; never raises. A second call
        returns ``{"status": "already_closed"}``."""
        from tenxgraph.utils.shutdown import shutdown_with_timeout

        if self._closed:
            return {"status": "already_closed"}
        started = time.perf_counter()
        await self._finish_recovery()
        self._closed = True
        self._live.clear()
        share = max(self.shutdown_timeout / 3, 0.1)
        # Runs in flight end before anything closes: given a third of shutdown_timeout, then
        # cancelled (what their tools returned is recorded as they unwind, within another third).
        cancelled = await in_flight.drain(self._checkpointer, share, share)
        if cancelled:
            _log.warning("aclose: %d run(s) still in flight after %.1f s were cancelled; their committed steps and "
                         "finished tool calls are kept, and the threads resume where they stopped", cancelled, share)
        stats: dict[str, Any] = {"status": "closed"}
        # The publisher first: the run's last events go out while everything else is still open.
        stats["publisher"] = (await shutdown_with_timeout(self._close_publisher(share), share, "publisher")
                              if self._publisher is not None else {"status": "skipped", "reason": "no publisher"})
        try:
            stats["background_tasks"] = await self._task_manager.shutdown(timeout=self.shutdown_timeout)
        except Exception as exc:  # closing must not raise past the caller's cleanup
            stats["background_tasks"] = {"status": "error", "error": str(exc)}
        stats["checkpointer"] = await shutdown_with_timeout(self._checkpointer.arelease(), share, "checkpointer")
        if stats["checkpointer"]["status"] != "completed":
            _log.warning("checkpointer release failed: %s", stats["checkpointer"])
        release = getattr(self._store, "arelease", None)
        stats["store"] = (await shutdown_with_timeout(release(), share, "store") if callable(release)
                          else {"status": "skipped", "reason": "no store"})
        stats["total_duration"] = time.perf_counter() - started
        return stats

    async def _close_publisher(self, bound: float) -> None:
        """Delivers what is still queued (within half of ``bound``), then closes the publisher;
        the caller bounds the whole."""
        assert self._outbox is not None and self._publisher is not None
        if not await self._outbox.flush(bound / 2):
            _log.warning("publisher: events still queued at close were dropped")
        try:
            await self._publisher.close()
        finally:
            forget_outbox(self._publisher)

    async def _finish_recovery(self) -> None:
        task = self.recovery
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=max(self.shutdown_timeout * 2 / 3, 0.1))
        except asyncio.TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            _log.warning("recovery was still running at aclose(); cancelled (its threads wait for the next pass)")
        except Exception as exc:  # the pass's own error (the store could not list threads)
            _log.warning("recovery failed: %s", exc)

    async def __aenter__(self) -> Self:
        """With ``compile(recover_on_start=...)``, starts a recovery pass in the background
        (``self.recovery``)."""
        if self._recover_on_start is not None and self.recovery is None:
            self.start_recovery(**self._recover_on_start)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
