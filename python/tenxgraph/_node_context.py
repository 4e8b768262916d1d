"""What a running node may ask of its run: the graph it is in and, when the run is streamed,
where its deltas go. Set by the runtime around each node call (a contextvar, so parallel runs
and the tasks a node starts each see their own)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["NodeContext", "current", "use"]


@dataclass(frozen=True)
class NodeContext:
    graph: Any  # the CompiledGraph
    node: str
    # Streamed runs: shows a Message(delta=True) to the consumer now. Deltas are never persisted;
    # the node's final message still waits for its step to commit.
    emit_delta: Callable[[Any], None] | None = None


_CURRENT: contextvars.ContextVar[NodeContext | None] = contextvars.ContextVar("tenxgraph_node_context", default=None)


def current() -> NodeContext | None:
    return _CURRENT.get()


def use(ctx: NodeContext) -> contextvars.Token[NodeContext | None]:
    return _CURRENT.set(ctx)


def reset(token: contextvars.Token[NodeContext | None]) -> None:
    _CURRENT.reset(token)
