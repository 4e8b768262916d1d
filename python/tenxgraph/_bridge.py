"""Starting a coroutine on the caller's event loop for the Rust core, with cancellation.

Rust holds a ``Submission`` while it awaits; if Rust stops waiting (node timeout, stop, the run
was dropped) it calls ``cancel()`` from a tokio thread and the asyncio task is really cancelled,
so the user's code sees ``CancelledError`` instead of running on unobserved.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["Submission", "await_native"]


async def await_native(waiter: Any) -> Any:
    """Awaits a ``_core.Waiter``: the Rust task writes one byte to a socket when done; the loop
    watches it, so no Rust thread has to call into Python to wake us. Cancelling the await
    cancels the Rust future."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = waiter.fileno()

    def on_ready() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_ready)
    try:
        await ready
    except asyncio.CancelledError:
        waiter.cancel()
        # The Rust future is dropped on a tokio thread; wait (briefly) until it is, so that when
        # the cancelled caller resumes the run has really ended: its lease is free, its Python
        # tasks are cancelled. The task writes its byte when it is dropped, too.
        # (`ready` itself was cancelled with us: watch the socket with a new future.)
        gone = loop.create_future()
        loop.remove_reader(fd)
        loop.add_reader(fd, lambda: gone.done() or gone.set_result(None))
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(gone, _CANCEL_GRACE_SECONDS)
        raise
    finally:
        loop.remove_reader(fd)
    return waiter.take()


_CANCEL_GRACE_SECONDS = 2.0


class Submission:
    __slots__ = ("_loop", "_task", "_cancelled", "_done")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        context: contextvars.Context,
        coro: Coroutine[Any, Any, Any],
        done: Callable[[bool, Any], None],
    ) -> None:
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._done = done
        try:
            loop.call_soon_threadsafe(self._start, context, coro)
        except RuntimeError:  # the loop is closed: the caller is gone, nothing will run this
            coro.close()
            raise

    def _start(self, context: contextvars.Context, coro: Coroutine[Any, Any, Any]) -> None:
        if self._cancelled:
            coro.close()  # never started: avoid "coroutine was never awaited"
            self._done(False, asyncio.CancelledError())
            return
        # Created inside the caller's context: the task runs on a copy of the contextvars that
        # were set when the user called ainvoke().
        self._task = context.run(self._loop.create_task, coro)
        self._task.add_done_callback(self._finish)

    def _finish(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self._done(False, asyncio.CancelledError())
            return
        exc = task.exception()
        if exc is not None:
            self._done(False, exc)
        else:
            self._done(True, task.result())

    def cancel(self) -> None:
        """Thread-safe: cancels the task (or prevents its start)."""
        self._cancelled = True
        try:
            self._loop.call_soon_threadsafe(self._cancel_on_loop)
        except RuntimeError:
            pass  # the loop is closed: nothing runs on it any more

    def _cancel_on_loop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
