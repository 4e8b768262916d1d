"""Fan-out: one event to several publishers."""

from __future__ import annotations

import asyncio
import logging

from tenxgraph.runtime.publisher.base_publisher import BasePublisher
from tenxgraph.runtime.publisher.events import EventModel

__all__ = ["CompositePublisher"]

_log = logging.getLogger("tenxgraph.publisher")


class CompositePublisher(BasePublisher):
    """Sends every event to each of ``publishers`` concurrently; one that fails is logged and
    the others still get the event."""

    def __init__(self, publishers: list[BasePublisher]) -> None:
        super().__init__({})
        self._publishers = publishers

    def add_publisher(self, publisher: BasePublisher) -> None:
        """Adds a publisher; every later event goes to it too."""
        self._publishers.append(publisher)

    def remove_publisher(self, publisher: BasePublisher) -> None:
        """Removes a publisher; raises ValueError when it was never added."""
        self._publishers.remove(publisher)

    async def publish(self, event: EventModel) -> None:
        results = await asyncio.gather(*(p.publish(event) for p in self._publishers), return_exceptions=True)
        for p, r in zip(self._publishers, results):
            if isinstance(r, BaseException):
                _log.warning("publisher %s failed on an event: %r", type(p).__name__, r)

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self._publishers), return_exceptions=True)

    def sync_close(self) -> None:
        for p in self._publishers:
            try:
                p.sync_close()
            except Exception as exc:  # noqa: BLE001 - closing one must not skip the rest
                _log.warning("publisher %s failed to close: %r", type(p).__name__, exc)
