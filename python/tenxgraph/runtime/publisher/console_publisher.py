"""A publisher that prints events: for development and debugging."""

from __future__ import annotations

import logging
from typing import Any

from tenxgraph.runtime.publisher.base_publisher import BasePublisher
from tenxgraph.runtime.publisher.events import EventModel

__all__ = ["ConsolePublisher"]

_log = logging.getLogger("tenxgraph.publisher")


class ConsolePublisher(BasePublisher):
    """Writes one line per event to stdout, or with ``{"use_logger": True}`` to the
    ``tenxgraph.publisher`` logger at INFO. Other keys (10xGraph's): ``format`` ("json"),
    ``include_timestamp`` (True), ``indent`` (2)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config or {})
        cfg = config or {}
        self.format = cfg.get("format", "json")
        self.include_timestamp = cfg.get("include_timestamp", True)
        self.indent = cfg.get("indent", 2)
        self.use_logger = cfg.get("use_logger", False)

    async def publish(self, event: EventModel) -> None:
        if self._is_closed:
            raise RuntimeError("Cannot publish to closed ConsolePublisher")
        line = (f"{event.timestamp} -> Source: {event.node_name}.{event.event_type}:"
                f"-> Payload: {event.data} -> {event.metadata}")
        if self.use_logger:
            _log.info(line)
        else:
            print(line)  # noqa: T201 - printing is this publisher's job

    async def close(self) -> None:
        self._is_closed = True

    def sync_close(self) -> None:
        self._is_closed = True
