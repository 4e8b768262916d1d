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

import json
import logging
from typing import Any

from tenxgraph.runtime.publisher._private_loop import PrivateLoopPublisher, import_client
from tenxgraph.runtime.publisher.events import EventModel

__all__ = ["RedisPublisher"]

_log = logging.getLogger("tenxgraph.publisher")

_MODES = ("pubsub", "stream")


class RedisPublisher(PrivateLoopPublisher):
    """Publishes every event to Redis (see the module docstring for the wire format).

    ``config`` keys, with 10xGraph's defaults: ``url`` ("redis://localhost:6379/0"), ``mode``
    ("pubsub" or "stream"), ``channel`` / ``stream`` ("tenxgraph.events"), ``maxlen`` (None),
    ``encoding`` ("utf-8"), ``max_connections`` (10), ``socket_timeout`` (5.0),
    ``socket_connect_timeout`` (5.0), ``socket_keepalive`` (True), ``health_check_interval`` (30).
    Nothing connects until the first event. Raises ``PublisherUnavailableError``
    ``PUBLISHER_002`` when the ``redis`` package is missing and ``ValueError`` for an unknown
    ``mode``.
    """

    _thread_name = "tenxgraph-redis-publisher"

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
        self._redis_asyncio = import_client("redis.asyncio", "RedisPublisher", "redis", "redis")
        self._client: Any = None

    def _encode(self, event: EventModel) -> bytes:
        return json.dumps(event.model_dump(mode="json")).encode(self.encoding)

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

    def _close_bound(self) -> float:
        return float(self.socket_timeout or 5.0) + 1.0

    async def publish(self, event: EventModel) -> Any:
        """Sends ``event``; returns Redis's answer (subscribers reached, or the stream entry id).
        Raises ``RuntimeError`` once closed, and redis-py's errors when Redis cannot be reached
        (the outbox counts and logs them)."""
        return await super().publish(event)
