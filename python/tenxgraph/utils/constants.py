"""Graph sentinels, run-state and granularity enums, and runtime defaults."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

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

DEFAULT_NODE_TIMEOUT_SECONDS: Final = 900.0
DEFAULT_TOOL_TIMEOUT_SECONDS: Final = 300.0
DEFAULT_ANONYMOUS_USER_ID: Final = "anonymous"

# Input key that answers a pending interrupt(): ainvoke({"resume": value}, config).
RESUME_KEY: Final = "resume"


class ExecutionState(StrEnum):
    """Coarse run state of a graph execution.

    Distinct from the pydantic ``tenxgraph.core.state.ExecutionState`` model, which tracks
    one thread's position in the graph. Here both interrupt kinds collapse to
    ``INTERRUPTED`` and a user stop gets its own value, ``STOPPED``.
    """

    RUNNING = "running"
    INTERRUPTED = "interrupted"
    COMPLETED = "completed"
    ERROR = "error"
    STOPPED = "stopped"


class ResponseGranularity(StrEnum):
    """How much invoke returns and which chunks stream yields (see CompiledGraph)."""

    FULL = "full"
    PARTIAL = "partial"
    LOW = "low"
