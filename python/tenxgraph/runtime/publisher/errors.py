"""The error a publisher that cannot work here raises when it is constructed."""

from __future__ import annotations

from typing import Any

from tenxgraph.core.exceptions import GraphError

__all__ = ["PublisherUnavailableError"]


class PublisherUnavailableError(GraphError, RuntimeError):
    """Raised by a publisher's constructor when it cannot deliver anything in this install, so a
    deployment fails at start-up rather than dropping every event of every run.

    ``PUBLISHER_001``: the publisher is not implemented by tenxgraph (Kafka);
    ``PUBLISHER_002``: its client library is not installed (``context["package"]``, the extra).
    A ``RuntimeError`` too, the type 10xGraph 0.10 raised when a client library was missing.
    """

    def __init__(self, message: str, error_code: str = "PUBLISHER_001",
                 context: dict[str, Any] | None = None) -> None:
        super().__init__(message, error_code, context)
