"""Command: a node's return value that combines a state update with a routing decision."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

__all__ = ["Command"]

StateT = TypeVar("StateT")


class Command(Generic[StateT]):
    """Return from a node to update state and/or jump to another node.

    ``update`` may be an AgentState, a Message, a str, a list of those, or a converter.
    ``goto`` overrides the graph's edges for this step and may be ``END``.
    ``state`` replaces the whole state. ``graph`` (with ``Command.PARENT``) is accepted
    for compatibility; the core loop ignores it.
    """

    PARENT: ClassVar[str] = "PARENT"

    def __init__(
        self,
        update: Any = None,
        goto: str | None = None,
        graph: str | None = None,
        state: StateT | None = None,
    ) -> None:
        self.update = update
        self.goto = goto
        self.graph = graph
        self.state = state

    def __repr__(self) -> str:
        return (
            f"Command(update={self.update!r}, goto={self.goto!r}, "
            f"graph={self.graph!r}, state={self.state!r})"
        )
