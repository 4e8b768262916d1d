"""Publishers: where a graph's events go.

A publisher receives one ``EventModel`` per point of a run: the graph's start, progress and end
(or error / interruption), each node's start and end, each tool call's start and end. Give one
to ``StateGraph(publisher=...)`` (a list becomes a ``CompositePublisher``). ``ConsolePublisher``
prints each event, for debugging; ``OtelPublisher`` (extra ``otel``) turns them into spans;
``RedisPublisher`` (extra ``redis``) sends them to a Redis channel or stream,
``RabbitMQPublisher`` (extra ``rabbitmq``) to a RabbitMQ exchange. ``KafkaPublisher`` imports but
is not supported (``PublisherUnavailableError``).
Delivery never holds up a run: see :mod:`tenxgraph.runtime.publisher.publish` for the bounded
outbox, its deadlines and its counters. Names load lazily, so any submodule imports first.
"""

from __future__ import annotations


from tenxgraph._lazy import lazy_exports

_LAZY = {
    "BasePublisher": "tenxgraph.runtime.publisher.base_publisher",
    "CompositePublisher": "tenxgraph.runtime.publisher.composite_publisher",
    "ConsolePublisher": "tenxgraph.runtime.publisher.console_publisher",
    "ContentType": "tenxgraph.runtime.publisher.events",
    "Event": "tenxgraph.runtime.publisher.events",
    "EventModel": "tenxgraph.runtime.publisher.events",
    "EventType": "tenxgraph.runtime.publisher.events",
    "KafkaPublisher": "tenxgraph.runtime.publisher.kafka_publisher",
    "LangsmithPublisher": "tenxgraph.runtime.publisher.langsmith_publisher",
    "LogfirePublisher": "tenxgraph.runtime.publisher.logfire_publisher",
    "ObservabilityLevel": "tenxgraph.runtime.publisher.otel_publisher",
    "OtelPublisher": "tenxgraph.runtime.publisher.otel_publisher",
    "PublisherUnavailableError": "tenxgraph.runtime.publisher.errors",
    "RabbitMQPublisher": "tenxgraph.runtime.publisher.rabbitmq_publisher",
    "RedisPublisher": "tenxgraph.runtime.publisher.redis_publisher",
    "publish_event": "tenxgraph.runtime.publisher.publish",
    "setup_langsmith": "tenxgraph.runtime.publisher.exporters",
    "setup_logfire": "tenxgraph.runtime.publisher.exporters",
    "setup_observability": "tenxgraph.runtime.publisher.exporters",
    "setup_tracing": "tenxgraph.runtime.publisher.otel_publisher",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
