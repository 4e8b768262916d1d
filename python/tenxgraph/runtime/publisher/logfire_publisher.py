"""``LogfirePublisher``: an ``OtelPublisher`` whose spans go to Logfire.

    publisher = LogfirePublisher(service_name="my-agent")  # LOGFIRE_TOKEN in the environment
    graph = StateGraph(AgentState, publisher=publisher)

Needs the ``logfire`` extra. See :mod:`tenxgraph.runtime.publisher.exporters`.
"""

from __future__ import annotations

from typing import Any

from tenxgraph.runtime.publisher.exporters import configure_logfire
from tenxgraph.runtime.publisher.otel_publisher import ObservabilityLevel, OtelPublisher

__all__ = ["LogfirePublisher"]


class LogfirePublisher(OtelPublisher):
    """Calls ``logfire.configure(...)`` (10xGraph's arguments; the rest go to it verbatim), whose
    provider becomes the global one, and publishes spans to it. Raises ``ImportError`` without
    the ``logfire`` extra."""

    def __init__(self, *, token: str | None = None, service_name: str | None = None, send_to_logfire: bool = True,
                 console: Any = None, level: ObservabilityLevel = ObservabilityLevel.STANDARD,
                 additional_span_processors: list[Any] | None = None, **configure_kwargs: Any) -> None:
        level = ObservabilityLevel(level)
        configure_logfire(token=token, service_name=service_name, send_to_logfire=send_to_logfire, console=console,
                          additional_span_processors=additional_span_processors, **configure_kwargs)
        super().__init__(level=level)
