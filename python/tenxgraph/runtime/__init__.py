"""Runtime components: the event publishers (``tenxgraph.runtime.publisher``).

10xGraph's ``runtime`` also holds the LLM response converters (``adapters``) and the agent
protocols (``protocols``); they belong to the LLM layer, which tenxgraph provides separately.
Names load lazily (PEP 562), so ``tenxgraph.runtime`` and its submodules import in any order.
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
    "RabbitMQPublisher": "tenxgraph.runtime.publisher.rabbitmq_publisher",
    "RedisPublisher": "tenxgraph.runtime.publisher.redis_publisher",
    "publish_event": "tenxgraph.runtime.publisher.publish",
}

__all__ = sorted([*_LAZY, "publisher"])


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, {"publisher": "tenxgraph.runtime.publisher"})
