"""Events to Redis: a Pub/Sub channel (default) or a Stream, as 10xGraph 0.10's ``RedisPublisher``.

    from tenxgraph.runtime.publisher import RedisPublisher

    graph = StateGraph(AgentState, publisher=RedisPublisher({"url": "redis://localhost:6379/0"}))

Each event is one message: the JSON of ``event.model_dump(mode="json")`` encoded with
``encoding``; ``PUBLISH <channel>`` in ``"pubsub"`` mode, ``XADD <stream> * data <json>`` (with
``MAXLEN ~ maxlen`` when set) in ``"stream"`` mode. Channel and stream default to
``"tenxgraph.events"``. Needs the ``redis`` extra (``pip install "10xgraph[redis]"``).

Delivery follows the outbox's rules (:mod:`tenxgraph.runtime.publisher.publish`): a Redis that is
down, stopped or slow makes ``publish`` fail or time out (``socket_timeout``, and the outbox's own
deadline), which costs those events, counted, never a step of the run. The client reconnects by
itself on the next event once Redis is back. Its connections live on a private event loop
thread (started by the first event, stopped by ``close()`` / ``sync_close()``), so one pool serves
every run, sync ``invoke`` included, whatever loop the run is on.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import threading
from typing import Any

from tenxgraph.runtime.publisher.base_publisher import BasePublisher
from tenxgraph.runtime.publisher.errors import PublisherUnavailableError
from tenxgraph.runtime.publisher.events import EventModel

__all__ = ["RedisPublisher"]

_log = logging.getLogger("tenxgraph.publisher")

_MODES = ("pubsub", "stream")


class RedisPublisher(BasePublisher):
    """Publishes every event to Redis (see the module docstring for the wire format).

    ``config`` keys, with 10xGraph's defaults: ``url`` ("redis://localhost:6379/0"), ``mode``
    ("pubsub" or "stream"), ``channel`` / ``stream`` ("tenxgraph.events"), ``maxlen`` (None),
    ``encoding`` ("utf-8"), ``max_connections`` (10), ``socket_timeout`` (5.0),
    ``socket_connect_timeout`` (5.0), ``socket_keepalive`` (True), ``health_check_interval`` (30).
    Nothing connects until the first event. Raises ``PublisherUnavailableError``
    ``PUBLISHER_002`` when the ``redis`` package is missing and ``ValueError`` for an unknown
    ``mode``.
    """

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(dict(config or {}))
        cfg = self.config
        self.url: str = cfg.get("url", "redis://localhost:6379/0")
        self.mode: str = cfg.get("mode", "pubsub")
        self.channel: str = cfg.get("channel", "tenxgraph.events")
        self.stream: str = cfg.get("stream", "tenxgraph.events")
        self.maxlen: int | None = cfg.get("maxlen")
        self.encoding: str = cfg.get("encoding", "utf-8")
        self.max_connections: int = cfg.get("max_connections", 10)
        self.socket_timeout: float = cfg.get("socket_timeout", 5.0)
        self.socket_connect_timeout: float = cfg.get("socket_connect_timeout", 5.0)
        self.socket_keepalive: bool = cfg.get("socket_keepalive", True)
        self.health_check_interval: int = cfg.get("health_check_interval", 30)
        if self.mode not in _MODES:
            # 10xGraph treated any other value as "pubsub"; a typo there silently changed where
            # events went.
            raise ValueError(f"RedisPublisher mode must be 'pubsub' or 'stream', got {self.mode!r}")
        if self.maxlen is not None and (isinstance(self.maxlen, bool) or not isinstance(self.maxlen, int)
                                        or self.maxlen <= 0):
            raise ValueError(f"RedisPublisher maxlen must be a positive int or None, got {self.maxlen!r}")
        try:
            self._redis_asyncio = importlib.import_module("redis.asyncio")
        except ImportError as exc:
            raise PublisherUnavailableError(
                "RedisPublisher needs the 'redis' package: pip install \"10xgraph[redis]\"",
                "PUBLISHER_002", {"package": "redis", "extra": "redis"},
            ) from exc
        # One client on one private loop thread, started with the first event: redis.asyncio
        # connections belong to the loop that opened them, and a graph's runs come from many
        # loops (each sync invoke has one of its own), so they cannot live on the run's loop.
        self._io_loop: asyncio.AbstractEventLoop | None = None
        self._io_thread: threading.Thread | None = None
        self._io_lock = threading.Lock()
        self._client: Any = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        with self._io_lock:
            if self._is_closed:
                raise RuntimeError("Cannot publish to closed RedisPublisher")
            if self._io_loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="tenxgraph-redis-publisher", daemon=True)
                thread.start()
                self._io_loop, self._io_thread = loop, thread
            return self._io_loop

    async def _send(self, payload: bytes) -> Any:
        """Runs on the private loop."""
        if self._client is None:
            pool = self._redis_asyncio.ConnectionPool.from_url(
                self.url,
                encoding=self.encoding,
                decode_responses=False,
                max_connections=self.max_connections,
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.socket_connect_timeout,
                socket_keepalive=self.socket_keepalive,
                health_check_interval=self.health_check_interval,
            )
            self._client = self._redis_asyncio.Redis(connection_pool=pool)
        if self.mode == "stream":
            if self.maxlen is not None:
                return await self._client.xadd(self.stream, {"data": payload}, maxlen=self.maxlen, approximate=True)
            return await self._client.xadd(self.stream, {"data": payload})
        return await self._client.publish(self.channel, payload)

    async def _close_client(self) -> None:
        """Runs on the private loop."""
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
                # A client given its pool leaves the pool's connections open on aclose().
                await client.connection_pool.disconnect()
            except Exception:  # noqa: BLE001 - closing is best effort (Redis may be down)
                _log.debug("RedisPublisher close failed", exc_info=True)

    def _stop_loop(self) -> tuple[asyncio.AbstractEventLoop | None, threading.Thread | None]:
        """Marks the publisher closed and takes its loop, under the lock ``_loop`` starts one with."""
        with self._io_lock:
            self._is_closed = True
            loop, thread = self._io_loop, self._io_thread
            self._io_loop = self._io_thread = None
        return loop, thread

    def _close_bound(self) -> float:
        return float(self.socket_timeout or 5.0) + 1.0

    async def publish(self, event: EventModel) -> Any:
        """Sends ``event``; returns Redis's answer (subscribers reached, or the stream entry id).
        Raises ``RuntimeError`` once closed, and redis-py's errors when Redis cannot be reached
        (the outbox counts and logs them)."""
        if self._is_closed:
            raise RuntimeError("Cannot publish to closed RedisPublisher")
        payload = json.dumps(event.model_dump(mode="json")).encode(self.encoding)
        # Cancelling this await (the outbox's deadline) cancels the send on the private loop.
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._send(payload), self._loop()))

    async def close(self) -> None:
        """Closes the connections and stops the private loop thread; idempotent."""
        if self._is_closed:
            return
        loop, thread = self._stop_loop()
        if loop is None or thread is None:
            return
        try:
            await asyncio.wait_for(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._close_client(), loop)),
                                   self._close_bound())
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - best effort
            _log.debug("RedisPublisher close did not finish", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, self._close_bound())
        if not thread.is_alive():
            loop.close()

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
            _log.debug("RedisPublisher close did not finish", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self._close_bound())
        if not thread.is_alive():
            loop.close()
