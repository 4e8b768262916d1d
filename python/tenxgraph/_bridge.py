"""The asyncio side of the Rust core's futures.

``drive`` awaits a ``_core.Driver``: the Rust future is polled on this loop's thread (see
src/py/driver.rs); a wake from another thread arrives as a byte on the thread's wake socket,
which each loop watches from its first native await on (one ``add_reader`` per loop and thread,
not one per await). Cancelling the await drops the Rust future on the spot, which cancels the
Python tasks it awaited.

``Submission`` starts a coroutine on a loop running on another thread (a checkpointer written in
Python has a loop of its own) and is cancellable from the thread that awaits it.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from tenxgraph import _core

__all__ = ["Submission", "drive"]


# The wake sockets each loop watches, as (process, fd): a loop normally runs on one thread of one
# process, but nothing stops it from moving, and a forked child makes its own. A hub socket is
# never closed (src/py/driver.rs: an ended thread's goes to the next thread), so within a process
# an fd number names one socket for good and the registration stays valid on any thread: the
# callback is given its fd and, run on a thread whose socket that is not, unregisters itself
# (`_unwatch`).
_watching: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[tuple[int, int]]] = (
    weakref.WeakKeyDictionary())


def _watch_wakes(loop: asyncio.AbstractEventLoop) -> None:
    fd = _core.wake_hub_fileno()
    key = (os.getpid(), fd)
    watched = _watching.get(loop)
    if watched is None:
        watched = _watching[loop] = set()
    if key not in watched:
        # The loop may still list this fd number for another library's socket that was closed
        # without remove_reader, which the OS dropped from the selector: without removing it
        # first, add_reader would only update asyncio's own record and the hub's socket would
        # never be polled (a hung run).
        loop.remove_reader(fd)
        watched.difference_update({k for k in watched if k[1] == fd})
        # Registered in an empty context: the reader outlives the run that first awaited here,
        # and must not keep that run's context alive (each poll runs in its own run's context).
        contextvars.Context().run(loop.add_reader, fd, _core.wake_hub_run, fd)
        watched.add(key)


def _unwatch(fd: int) -> None:
    """Called by ``_core.wake_hub_run(fd)`` when ``fd`` is not the current thread's hub socket:
    the running loop awaited on a thread that has ended, whose hub is another thread's now (or
    free). It stops watching it (a later await on the thread that has it registers it again)."""
    loop = asyncio.get_running_loop()
    loop.remove_reader(fd)
    watched = _watching.get(loop)
    if watched is not None:
        watched.discard((os.getpid(), fd))


async def drive(driver: Any) -> Any:
    """Awaits a ``_core.Driver`` on the running loop; cancelling the await drops the Rust future
    before the cancellation propagates, so the run has really ended when the caller resumes."""
    loop = asyncio.get_running_loop()
    _watch_wakes(loop)
    done = loop.create_future()
    try:
        driver.start(loop, contextvars.copy_context(), done)
        await done
    except asyncio.CancelledError:
        driver.cancel()
        raise
    return done.result()


class Submission:
    """A coroutine started as a task on ``loop`` (another thread's) in ``context``; ``done`` gets
    the task (or a cancelled future when ``cancel`` came first)."""

    __slots__ = ("_loop", "_task", "_cancelled", "_done")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        context: contextvars.Context,
        coro: Coroutine[Any, Any, Any],
        done: Callable[[asyncio.Future[Any]], None],
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
            never = self._loop.create_future()
            never.cancel()
            self._done(never)
            return
        self._task = context.run(self._loop.create_task, coro)
        self._task.add_done_callback(self._done)

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
