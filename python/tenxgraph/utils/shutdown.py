"""Graceful shutdown helpers, as 10xGraph's ``tenxgraph.utils.shutdown`` offers them.

``GracefulShutdownManager`` turns SIGINT/SIGTERM into a flag an asyncio app polls (or callbacks);
``DelayedKeyboardInterrupt`` holds those signals back over a critical section and delivers them
at its end; ``shutdown_with_timeout`` awaits one cleanup step within a deadline and reports how it
went instead of raising, so one stuck component never blocks the others' cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "DelayedKeyboardInterrupt",
    "GracefulShutdownManager",
    "delayed_keyboard_interrupt",
    "setup_exception_handler",
    "shutdown_with_timeout",
]

_log = logging.getLogger("tenxgraph.utils.shutdown")
SIGNAL_NAMES: dict[int, str] = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class DelayedKeyboardInterrupt:
    """Holds SIGINT/SIGTERM back while the block runs; on exit the previous handler gets the
    signal (for SIGINT by default: KeyboardInterrupt). Main thread only, as ``signal.signal``."""

    def __init__(self) -> None:
        self._received: tuple[int, Any] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> DelayedKeyboardInterrupt:
        self._previous = {sig: signal.signal(sig, self._hold) for sig in SIGNAL_NAMES}
        return self

    def _hold(self, sig: int, frame: Any) -> None:
        self._received = (sig, frame)
        _log.warning("%s received; delivering it when the critical section ends", SIGNAL_NAMES.get(sig, sig))

    def __exit__(self, *exc: object) -> bool:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._received is not None:
            sig, frame = self._received
            handler = self._previous.get(sig)
            if callable(handler):
                handler(sig, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(sig)
        return False


@contextlib.contextmanager
def delayed_keyboard_interrupt() -> Iterator[DelayedKeyboardInterrupt]:
    """``with delayed_keyboard_interrupt():`` runs the block under ``DelayedKeyboardInterrupt``."""
    with DelayedKeyboardInterrupt() as held:
        yield held


def _wake() -> None:
    """Nothing: a handle that wakes a loop blocked in its selector."""


class GracefulShutdownManager:
    """SIGINT/SIGTERM set ``shutdown_requested`` and run the registered callbacks, on the event
    loop, instead of killing the process mid-step."""

    def __init__(self, shutdown_timeout: float = 30.0) -> None:
        self.shutdown_requested = False
        self.shutdown_timeout = shutdown_timeout
        self._callbacks: list[Callable[[], Any]] = []
        self._previous: dict[int, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def register_signal_handlers(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Routes SIGINT/SIGTERM to this manager through ``loop.add_signal_handler`` (the running
        loop when None). Called with no loop running (before ``asyncio.run``, or in a program with
        no loop), it installs process handlers instead (``signal.signal``): a signal then sets the
        flag and runs the callbacks at once, in the main thread, as a ``signal.signal`` handler
        runs, and wakes the loop running there, if any. Where registering is impossible (not the
        main thread, Windows) it logs a warning and leaves the signal's handler alone; it never
        raises for that. Calling it again (the same loop or another) is harmless:
        :meth:`unregister_signal_handlers` still restores the handlers found at the first call."""
        if threading.current_thread() is not threading.main_thread():
            # Only the main thread may set a signal's handler. Checked before anything else: the
            # move below would take the handlers off the main loop's registration, and the
            # signals would then reach a loop that no longer routes them.
            for name in SIGNAL_NAMES.values():
                _log.warning("could not register a handler for %s: not the main thread", name)
            return
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                # 10xGraph takes asyncio.get_event_loop() here: deprecated with no loop (3.12),
                # an error (3.14), and before that a new loop nothing ever runs, whose handlers
                # swallow Ctrl-C for the rest of the process (asyncio.run makes another loop).
                loop = None
        if self._loop is not None and self._loop is not loop:
            # Moving to another loop (or to process handlers): the old one must not keep routing
            # (or, when it closes, reset) these signals behind the restore.
            for sig in self._previous:
                with contextlib.suppress(Exception):
                    self._loop.remove_signal_handler(sig)
        self._loop = loop
        for sig in SIGNAL_NAMES:
            try:
                # A second registration would find asyncio's own no-op handler (or this manager's
                # process handler) installed by the first one; the handler to restore is the one
                # found before any.
                self._previous.setdefault(sig, signal.getsignal(sig))
                if loop is None:
                    signal.signal(sig, self._on_process_signal)
                else:
                    loop.add_signal_handler(sig, self._on_signal, sig)
            except (ValueError, NotImplementedError, RuntimeError) as exc:  # not the main thread, Windows
                _log.warning("could not register a handler for %s: %s", SIGNAL_NAMES[sig], exc)

    def _on_process_signal(self, sig: int, frame: Any) -> None:
        # Run here, in the main thread between two bytecodes, as any signal.signal handler (and
        # asyncio.Runner's own SIGINT handler, which cancels its task from there): handed to the
        # loop instead, a signal that came in the loop's last iteration (the end of asyncio.run,
        # of every sync invoke) was dropped with it by loop.close(), flag and callbacks alike.
        self._on_signal(sig)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        # A loop blocked in its selector goes on waiting after a Python-level handler ran: wake
        # it, so what the callbacks scheduled or cancelled happens now.
        running.call_soon_threadsafe(_wake)

    def unregister_signal_handlers(self) -> None:
        """Removes the loop handlers and restores the handlers found at the first registration
        since the last unregister; a handler that cannot be restored is logged, not raised."""
        for sig, handler in self._previous.items():
            with contextlib.suppress(Exception):
                if self._loop is not None:
                    self._loop.remove_signal_handler(sig)
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError, TypeError) as exc:
                _log.warning("could not restore the handler for %s: %s", SIGNAL_NAMES[sig], exc)
        self._previous.clear()

    def _on_signal(self, sig: int) -> None:
        _log.info("%s received: shutting down gracefully", SIGNAL_NAMES.get(sig, sig))
        self.shutdown_requested = True
        for cb in list(self._callbacks):
            try:
                cb()
            except Exception:  # one failing callback must not stop the others
                _log.exception("shutdown callback %r failed", cb)

    def add_shutdown_callback(self, callback: Callable[[], Any]) -> None:
        """Adds a callback run (on the loop, in registration order) when a signal arrives; one that
        raises is logged and the others still run."""
        self._callbacks.append(callback)

    def protect_section(self) -> DelayedKeyboardInterrupt:
        """A new ``DelayedKeyboardInterrupt``: ``with manager.protect_section(): ...`` holds the signals
        back over the block."""
        return DelayedKeyboardInterrupt()

    async def wait_for_shutdown(self, check_interval: float = 0.1) -> None:
        """Returns once ``shutdown_requested`` is set, polling every ``check_interval`` seconds."""
        while not self.shutdown_requested:
            await asyncio.sleep(check_interval)


def setup_exception_handler(loop: asyncio.AbstractEventLoop) -> None:
    """Quiets the connection-reset noise a loop reports while sockets close at shutdown; every
    other unhandled exception is logged at error level."""

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, ConnectionResetError) or (isinstance(exc, OSError) and getattr(exc, "winerror", None) == 6):
            _log.debug("ignored during shutdown: %s", context.get("message"))
            return
        _log.error("unhandled exception in event loop: %s", context.get("message", "no message"), exc_info=exc)

    loop.set_exception_handler(handler)


async def shutdown_with_timeout(coro_or_task: Any, timeout: float, task_name: str = "task") -> dict[str, Any]:
    """Awaits one cleanup step for at most ``timeout`` seconds. Returns ``{"status": "completed",
    "duration"}``, ``{"status": "timeout", "duration"}`` (the step is cancelled) or ``{"status":
    "error", "error", "duration"}``; never raises (except when the caller itself is cancelled)."""
    started = time.monotonic()
    task = asyncio.ensure_future(coro_or_task)
    try:
        await asyncio.wait_for(task, timeout=timeout)
    except asyncio.TimeoutError:
        _log.warning("shutdown of %s timed out after %.2fs", task_name, time.monotonic() - started)
        return {"status": "timeout", "duration": time.monotonic() - started}
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        _log.warning("shutdown of %s failed: %s", task_name, exc)
        return {"status": "error", "error": str(exc), "duration": time.monotonic() - started}
    return {"status": "completed", "duration": time.monotonic() - started}
