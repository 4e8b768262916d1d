"""A publisher whose client lives on a private event-loop thread (Redis, RabbitMQ).

Broker clients (redis.asyncio, aio-pika) bind their connections to the loop that opened them,
and a graph's runs come from many loops (every sync ``invoke`` has one of its own), so the
connections cannot live on the run's loop. Each such publisher starts one loop thread with its
first event and stops it on ``close()`` / ``sync_close()``; ``publish`` hands the send to that
loop, and cancelling the await (the outbox's deadline) cancels the send there.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import threading
from abc import abstractmethod
from types import ModuleType
from typing import Any

from tenxgraph.runtime.publisher.base_publisher import BasePublisher
from tenxgraph.runtime.publisher.errors import PublisherUnavailableError
from tenxgraph.runtime.publisher.events import EventModel

_log = logging.getLogger("tenxgraph.publisher")


def import_client(module: str, publisher: str, package: str, extra: str) -> ModuleType:
    """The client library, or ``PUBLISHER_002`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PublisherUnavailableError(
            f"{publisher} needs the '{package}' package: pip install \"10xgraph[{extra}]\"",
            "PUBLISHER_002", {"package": package, "extra": extra},
        ) from exc


class PrivateLoopPublisher(BasePublisher):
    """Base of the broker publishers: subclasses write ``_send`` and ``_close_client`` (both run
    on the private loop) and ``_close_bound`` (seconds a close may take)."""

    _thread_name = "tenxgraph-publisher"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._io_loop: asyncio.AbstractEventLoop | None = None
        self._io_thread: threading.Thread | None = None
        self._io_lock = threading.Lock()

    @abstractmethod
    async def _send(self, payload: bytes) -> Any:
        """Delivers one encoded event; runs on the private loop."""

    @abstractmethod
    async def _close_client(self) -> None:
        """Closes the connections; runs on the private loop, best effort."""

    @abstractmethod
    def _close_bound(self) -> float:
        """How long closing may take before the thread is left to die with the process."""

    def _encode(self, event: EventModel) -> bytes:
        # mode="json": every field becomes JSON (10xGraph's RabbitMQ publisher dumped in python
        # mode, so an event carrying a non-JSON value failed to encode and was lost).
        return json.dumps(event.model_dump(mode="json")).encode("utf-8")

    def _loop(self) -> asyncio.AbstractEventLoop:
        with self._io_lock:
            if self._is_closed:
                raise RuntimeError(f"Cannot publish to closed {type(self).__name__}")
            if self._io_loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._thread_name, daemon=True)
                thread.start()
                self._io_loop, self._io_thread = loop, thread
            return self._io_loop

    def _stop_loop(self) -> tuple[asyncio.AbstractEventLoop | None, threading.Thread | None]:
        """Marks the publisher closed and takes its loop, under the lock ``_loop`` starts one with."""
        with self._io_lock:
            self._is_closed = True
            loop, thread = self._io_loop, self._io_thread
            self._io_loop = self._io_thread = None
        return loop, thread

    async def _deliver(self, payload: bytes) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._send(payload), self._loop()))

    async def publish(self, event: EventModel) -> Any:
        """Sends ``event`` through the private loop. Raises ``RuntimeError`` once closed, and the
        client's errors when the broker cannot be reached (the outbox counts and logs them)."""
        if self._is_closed:
            raise RuntimeError(f"Cannot publish to closed {type(self).__name__}")
        return await self._deliver(self._encode(event))

    async def close(self) -> None:
        """Closes the connections and stops the private loop thread; idempotent. The waiting is
        done in a worker thread, so the caller's loop keeps running meanwhile."""
        if not self._is_closed:
            await asyncio.to_thread(self.sync_close)

    def sync_close(self) -> None:
        """:meth:`close` from sync code (not from inside a running event loop's thread)."""
        if self._is_closed:
            return
        loop, thread = self._stop_loop()
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close_client(), loop).result(self._close_bound())
        except Exception:  # noqa: BLE001 - best effort
            _log.debug("%s close did not finish", type(self).__name__, exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self._close_bound())
        if not thread.is_alive():
            loop.close()
