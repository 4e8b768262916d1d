"""StreamChunk: one item yielded by CompiledGraph.stream / astream."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, SerializeAsAny

from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message

__all__ = ["StreamChunk", "StreamEvent"]


class StreamEvent(StrEnum):
    """The kind of a ``StreamChunk``: message, state, updates or error (10xGraph's values)."""
    MESSAGE = "message"
    STATE = "state"
    UPDATES = "updates"
    ERROR = "error"


class StreamChunk(BaseModel):
    """``data["status"]`` tells UPDATES/ERROR chunks apart (``invoking_node``,
    ``node_invoked``, ``interrupted``, ``graph_invoked``, ``tool_result``, ...)."""

    event: StreamEvent = StreamEvent.MESSAGE
    message: SerializeAsAny[Message] | None = None
    # SerializeAsAny: a user's AgentState subclass must dump its own fields too.
    state: SerializeAsAny[AgentState] | None = None
    data: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    thread_id: str | int | None = None
    run_id: str | None = None
    timestamp: float = Field(default_factory=time.time)
