"""``LangsmithPublisher``: an ``OtelPublisher`` whose spans go to LangSmith over OTLP/HTTP.

    publisher = LangsmithPublisher(project="my-agent")     # LANGSMITH_API_KEY in the environment
    graph = StateGraph(AgentState, publisher=publisher)

Needs the ``langsmith`` extra. See :mod:`tenxgraph.runtime.publisher.exporters`.
"""

from __future__ import annotations

from typing import Any

from tenxgraph.runtime.publisher.exporters import LANGSMITH_ENDPOINT, install_provider, langsmith_processor
from tenxgraph.runtime.publisher.otel_publisher import ObservabilityLevel, OtelPublisher

__all__ = ["LangsmithPublisher"]


class LangsmithPublisher(OtelPublisher):
    """Spans of runs, nodes and tool calls (``OtelPublisher``'s) exported to
    ``<endpoint>/v1/traces`` with ``x-api-key`` and ``Langsmith-Project``. The processor is
    attached to ``tracer_provider``, or to a new provider set as the global one. Raises
    ``ValueError`` without an API key and ``ImportError`` without the ``langsmith`` extra."""

    def __init__(self, *, api_key: str | None = None, project: str | None = None,
                 endpoint: str = LANGSMITH_ENDPOINT, level: ObservabilityLevel = ObservabilityLevel.STANDARD,
                 tracer_provider: Any = None) -> None:
        level = ObservabilityLevel(level)
        processor = langsmith_processor(api_key=api_key, project=project, endpoint=endpoint)
        self.span_processor = processor
        super().__init__(tracer=install_provider(processor, tracer_provider), level=level)
