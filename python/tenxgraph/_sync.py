"""The sync twin of a coroutine call, for the sync API (``invoke``, ``get_state``, ...).

Below both the graph and the checkpointers, which each offer sync wrappers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["run_loop", "run_sync"]

_log = logging.getLogger("tenxgraph.sync")

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
        return run_loop(coro)
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


def run_loop(coro: Any) -> Any:
    """``asyncio.run(coro)`` (its Ctrl-C handling, task cancellation and async generator
    clean-up), except that the loop's default executor is ``_LeftBehind``: a call the run handed
    to ``asyncio.to_thread`` or ``run_in_executor(None, ...)`` that never returns (a blocking
    client on a hung server, cut off by ``node_timeout``) is left running when the loop closes.
    ``asyncio.run`` waited for it without a limit, so a sync ``invoke()`` or ``stream()`` never
    returned the NodeTimeoutError that ``ainvoke`` raised at once (10xGraph 0.10 does the same;
    Python 3.12 caps that wait at 300 s)."""
    executor = _LeftBehind()
    runner = asyncio.Runner()
    try:
        runner.get_loop().set_default_executor(executor)
        return runner.run(coro)
    finally:
        executor.closing()
        _close(runner)


# How long the tasks a run left (an event publisher's send, a tool's own task) get to end once
# cancelled when a sync call's loop closes.
_CLOSE_SECONDS = 5.0


def _close(runner: asyncio.Runner) -> None:
    """``runner.close()``, except that tasks which do not end when cancelled (a publisher's
    retry loop with a bare ``except:`` swallows it) are waited for ``_CLOSE_SECONDS``, then left:
    ``asyncio.Runner`` waits for them without a limit, and a sync ``invoke()`` whose run had
    completed never returned (10xGraph 0.10 the same)."""
    loop = runner.get_loop()
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if pending:
        for task in pending:
            task.cancel()
        _, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=_CLOSE_SECONDS))
        if stuck:
            _log.warning("%d task(s) the run started did not end within %ss of being cancelled (an event publisher "
                         "that swallows its cancellation?); the loop is closed without them", len(stuck),
                         _CLOSE_SECONDS, extra={"event": "tasks_left_behind"})
            try:
                loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), _CLOSE_SECONDS))
            except Exception:  # noqa: BLE001 - a generator that will not close is left too
                pass
            asyncio.set_event_loop(None)
            loop.close()
            return
    runner.close()


class _LeftBehind(concurrent.futures.ThreadPoolExecutor):
    """A daemon thread per call, never waited for at shutdown (nor at the interpreter's exit,
    where a ThreadPoolExecutor's threads are joined): a call still running when its loop closes
    is logged and left to finish, or not, on its own, as a sync tool cut off by its timeout is.
    A ThreadPoolExecutor only by type (the loop takes no other); none of its threads is made."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="tenxgraph-unused")
        self._running = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            with self._lock:
                self._running += 1
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self._running -= 1

        threading.Thread(target=work, name="tenxgraph-to-thread", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None  # see the class: nothing is waited for

    def closing(self) -> None:
        with self._lock:
            left = self._running
        if left:
            _log.warning("%d call(s) handed to a thread by the run (asyncio.to_thread, run_in_executor) are "
                         "still running after it ended; they are left behind, not waited for", left,
                         extra={"event": "thread_calls_left_behind"})


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
            self.result = run_loop(self._run())
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
