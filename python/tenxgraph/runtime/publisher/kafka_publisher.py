"""10xGraph 0.10's Kafka publisher, which tenxgraph does not implement (yet).

It stays importable so ``from tenxgraph.runtime.publisher import KafkaPublisher`` (and a star
import) work, but constructing one raises :class:`PublisherUnavailableError` ``PUBLISHER_001``:
a publisher that could never deliver would otherwise drop every event of every run silently.
It was not built because no Kafka broker can be had here to test it against (Debian does not
package one).
Write a ``BasePublisher`` for your broker meanwhile (its ``publish`` is awaited off the run's
path, under the outbox's deadline).
"""

from __future__ import annotations

from typing import Any, NoReturn

from tenxgraph.runtime.publisher.errors import PublisherUnavailableError

__all__ = ["KafkaPublisher"]


def _refuse(name: str, broker: str) -> NoReturn:
    raise PublisherUnavailableError(
        f"{name} is not supported by tenxgraph yet (no {broker} client is built in); "
        "subclass tenxgraph.runtime.publisher.BasePublisher to publish to it",
        "PUBLISHER_001", {"publisher": name},
    )


class KafkaPublisher:
    """10xGraph's Kafka publisher. Not supported: constructing it raises
    ``PublisherUnavailableError`` ``PUBLISHER_001``."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        _refuse("KafkaPublisher", "Kafka")

