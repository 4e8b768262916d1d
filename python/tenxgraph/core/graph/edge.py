"""Edge: a static or conditional connection between two nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Edge"]


class Edge:
    """One edge of a ``StateGraph``: ``from_node`` to ``to_node``, or, with ``condition``, one
    answer of a condition (``condition_result`` the path-map key; ``to_node`` "" when the
    condition names the target itself)."""
    def __init__(self, from_node: str, to_node: str, condition: Callable[..., Any] | None = None) -> None:
        self.from_node = from_node
        self.to_node = to_node
        self.condition = condition
        self.condition_result: str | None = None

    def __repr__(self) -> str:
        return f"Edge({self.from_node!r} -> {self.to_node!r}{', conditional' if self.condition else ''})"
