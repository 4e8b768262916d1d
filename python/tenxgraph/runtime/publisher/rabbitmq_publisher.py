"""Events to RabbitMQ through aio-pika, as 10xGraph 0.10's ``RabbitMQPublisher``.

    from tenxgraph.runtime.publisher import RabbitMQPublisher

    graph = StateGraph(AgentState, publisher=RabbitMQPublisher({"url": "amqp://guest:guest@localhost/"}))

Each event is one AMQP message whose body is the UTF-8 JSON of ``event.model_dump(mode="json")``,
published to the exchange ``exchange`` (declared on first use as ``exchange_type``, durable by
default) with ``routing_key``; both default to ``"tenxgraph.events"``, the type to ``"topic"``.
With ``declare=False`` the message goes to the broker's default exchange, so it lands in the
queue named ``routing_key`` (10xGraph's behaviour). Needs the ``rabbitmq`` extra
(``pip install "10xgraph[rabbitmq]"``).

Delivery follows the outbox's rules (:mod:`tenxgraph.runtime.publisher.publish`): a broker that is
down or slow makes ``publish`` fail or time out, which costs those events, counted, never a step
of the run. The connection is aio-pika's robust one: after the broker comes back it reconnects
by itself, and a publisher whose first connect failed tries again with the next event.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tenxgraph.runtime.publisher._private_loop import PrivateLoopPublisher, import_client
from tenxgraph.runtime.publisher.events import EventModel

__all__ = ["RabbitMQPublisher"]

_log = logging.getLogger("tenxgraph.publisher")


class RabbitMQPublisher(PrivateLoopPublisher):
    """Publishes every event to a RabbitMQ exchange (see the module docstring for the format).

    ``config`` keys, with 10xGraph's defaults: ``url`` ("amqp://guest:guest@localhost/"),
    ``exchange`` ("tenxgraph.events"), ``routing_key`` ("tenxgraph.events"), ``exchange_type``
    ("topic"; any of aio-pika's ``ExchangeType`` names, case-insensitive), ``declare`` (True),
    ``durable`` (True), ``connection_timeout`` (10 s), ``heartbeat`` (60 s). Nothing connects
    until the first event. Raises ``PublisherUnavailableError`` ``PUBLISHER_002`` when aio-pika
    is missing, and ``ValueError`` for an unknown ``exchange_type`` (10xGraph fell back to
    "topic", which silently changed how events were routed).
    """

    _thread_name = "tenxgraph-rabbitmq-publisher"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(dict(config or {}))
        cfg = self.config
        self.url: str = cfg.get("url", "amqp://guest:guest@localhost/")
        self.exchange: str = cfg.get("exchange", "tenxgraph.events")
        self.routing_key: str = cfg.get("routing_key", "tenxgraph.events")
        self.exchange_type: str = cfg.get("exchange_type", "topic")
        self.declare: bool = cfg.get("declare", True)
        self.durable: bool = cfg.get("durable", True)
        self.connection_timeout: float = cfg.get("connection_timeout", 10)
        self.heartbeat: int = cfg.get("heartbeat", 60)
        self._aio_pika = import_client("aio_pika", "RabbitMQPublisher", "aio-pika", "rabbitmq")
        kinds = {k.name.lower(): k for k in self._aio_pika.ExchangeType}
        kind = kinds.get(str(self.exchange_type).lower()) if isinstance(self.exchange_type, str) else None
        if kind is None:
            raise ValueError(f"RabbitMQPublisher exchange_type must be one of {sorted(kinds)}, "
                             f"got {self.exchange_type!r}")
        self._kind = kind
        self._conn: Any = None
        self._target: Any = None  # the exchange messages go to, once connected
        self._connecting: asyncio.Lock | None = None  # created on the private loop

    async def _connect(self) -> Any:
        """Runs on the private loop; one connect at a time, kept until ``close``."""
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._target is not None:
                return self._target
            conn = await self._aio_pika.connect_robust(self.url, timeout=self.connection_timeout,
                                                       heartbeat=self.heartbeat)
            try:
                channel = await conn.channel()
                if self.declare:
                    target = await channel.declare_exchange(self.exchange, self._kind, durable=self.durable)
                else:
                    target = channel.default_exchange
            except BaseException:
                await conn.close()
                raise
            self._conn, self._target = conn, target
            _log.info("RabbitMQPublisher connected to exchange %r", self.exchange if self.declare else "")
            return target

    async def _send(self, payload: bytes) -> Any:
        """Runs on the private loop."""
        target = self._target or await self._connect()
        await target.publish(self._aio_pika.Message(body=payload),
                             routing_key=self.routing_key)
        return True

    async def _close_client(self) -> None:
        """Runs on the private loop."""
        conn, self._conn, self._target = self._conn, None, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # noqa: BLE001 - closing is best effort (the broker may be down)
                _log.debug("RabbitMQPublisher close failed", exc_info=True)

    def _close_bound(self) -> float:
        return float(self.connection_timeout or 10) + 1.0

    async def publish(self, event: EventModel) -> Any:
        """Sends ``event``; returns True once the broker took it (10xGraph's return). Raises
        ``RuntimeError`` once closed, and aio-pika's errors when the broker cannot be reached
        (the outbox counts and logs them)."""
        return await super().publish(event)
