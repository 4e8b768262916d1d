"""The publisher interface: where a run's events go."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from tenxgraph.runtime.publisher.events import EventModel

__all__ = ["BasePublisher"]


class BasePublisher(ABC):
    """Receives a run's events. ``publish`` is awaited off the run's path: a slow, hung or
    failing publisher loses events (counted, see :mod:`tenxgraph.runtime.publisher.publish`),
    never a step of the run. It must not block the event loop (it shares the run's loop).

    Usable as an async context manager; leaving it calls :meth:`close`.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._is_closed = False

    @abstractmethod
    async def publish(self, event: EventModel) -> Any:
        """Deliver one event."""
        raise NotImplementedError

    @abstractmethod
    async def close(self) -> Any:
        """Release resources; idempotent."""
        raise NotImplementedError

    @abstractmethod
    def sync_close(self) -> Any:
        """Release resources from sync code; idempotent."""
        raise NotImplementedError

    async def __aenter__(self) -> BasePublisher:
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> bool:
        await self.close()
        return False
