"""The sync twin of a coroutine call, for the sync API (``invoke``, ``get_state``, ...).

Below both the graph and the checkpointers, which each offer sync wrappers.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

__all__ = ["run_sync"]

# How often a caller blocked in a worker's run looks for its own task's cancellation.
_POLL_SECONDS = 0.1


def run_sync(coro: Any) -> Any:
    """Runs a coroutine from sync code; inside a running loop (Jupyter, an async app) it runs on a
    private loop in a worker thread instead of failing, with the caller's contextvars.

    On that thread, a Ctrl-C (or any exception) raised in the waiting caller cancels the run, as
    ``asyncio.run`` does on its own thread, and the caller gets it once the run has unwound (its
    finished tool calls recorded). Before, the caller sat in the worker pool's exit until the run
    ended by itself: a hung tool held a Ctrl-C for its whole ``tool_timeout``."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # The caller's task: asyncio.run's Ctrl-C handler cancels it (and raises KeyboardInterrupt
    # only at the second Ctrl-C), which this blocking wait would never see.
    caller = asyncio.current_task()
    worker = _Worker(coro)
    thread = threading.Thread(target=contextvars.copy_context().run, args=(worker.main,),
                              name="tenxgraph-sync", daemon=True)
    thread.start()
    try:
        while not worker.done.wait(_POLL_SECONDS):
            if caller is not None and caller.cancelling():
                raise asyncio.CancelledError
    except BaseException:
        worker.cancel()
        thread.join()  # a second Ctrl-C here leaves the run to unwind on its own
        raise
    if worker.error is not None:
        raise worker.error
    return worker.result


class _Worker:
    """``asyncio.run(coro)`` on a thread, cancellable from another."""

    def __init__(self, coro: Any) -> None:
        self.coro = coro
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    def main(self) -> None:
        try:
            self.result = asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self.error = exc
        finally:
            self.done.set()

    async def _run(self) -> Any:
        with self._lock:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            cancelled = self._cancelled
        if cancelled:
            self.coro.close()
            raise asyncio.CancelledError
        return await self.coro

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop already closed: the run is over
                pass
