"""Graph sentinels, run-state and granularity enums, and runtime defaults."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from tenxgraph import _core

__all__ = [
    "DEFAULT_ANONYMOUS_USER_ID",
    "DEFAULT_NODE_TIMEOUT_SECONDS",
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "END",
    "RESUME_KEY",
    "START",
    "ExecutionState",
    "ResponseGranularity",
]

START: Final = "__start__"
END: Final = "__end__"

# The engine applies the deadlines, so it owns their defaults; these are its values.
DEFAULT_NODE_TIMEOUT_SECONDS: Final[float] = _core.DEFAULT_NODE_TIMEOUT_SECONDS
DEFAULT_TOOL_TIMEOUT_SECONDS: Final[float] = _core.DEFAULT_TOOL_TIMEOUT_SECONDS
DEFAULT_ANONYMOUS_USER_ID: Final = "anonymous"

# Input key that answers a pending interrupt(): ainvoke({"resume": value}, config).
RESUME_KEY: Final = "resume"


class ExecutionState(StrEnum):
    """Coarse run state of a graph execution.

    Distinct from the pydantic ``tenxgraph.core.state.ExecutionState`` model, which tracks
    one thread's position in the graph. Here both interrupt kinds collapse to
    ``INTERRUPTED`` and a user stop gets its own value, ``STOPPED``. ``PAUSED``, ``ABORTED``
    and ``IDLE`` are 10xGraph's members with its values, for code that names them; no run of
    ours reports them.
    """

    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    ABORTED = "aborted"
    IDLE = "idle"
    STOPPED = "stopped"


class ResponseGranularity(StrEnum):
    """How much invoke returns and which chunks stream yields (see CompiledGraph)."""

    FULL = "full"
    PARTIAL = "partial"
    LOW = "low"
