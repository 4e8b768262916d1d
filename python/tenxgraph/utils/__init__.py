"""tenxgraph.utils: constants, Command, ThreadInfo, the @tool decorator and reducers."""

from __future__ import annotations

import importlib
from typing import Any

from tenxgraph.core.state.reducers import (
    add_messages,
    append_items,
    replace_messages,
    replace_value,
)
from tenxgraph.utils.command import Command
from tenxgraph.utils.constants import (
    DEFAULT_ANONYMOUS_USER_ID,
    DEFAULT_NODE_TIMEOUT_SECONDS,
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    END,
    RESUME_KEY,
    START,
    ExecutionState,
    ResponseGranularity,
)
from tenxgraph.utils.thread_info import ThreadInfo
from tenxgraph.utils.tool_decorator import get_tool_metadata, has_tool_decorator, tool

# interrupt, Interrupt, GraphInterrupt and pending_interrupt are re-exported from
# tenxgraph.utils.interrupt. That module is resolved lazily below, on first access, so
# this package imports cleanly before it exists and no cycle runs through the interrupt
# machinery when only constants are needed.
_INTERRUPT_NAMES = frozenset({"interrupt", "Interrupt", "GraphInterrupt", "pending_interrupt"})


def __getattr__(name: str) -> Any:
    if name in _INTERRUPT_NAMES:
        try:
            module = importlib.import_module("tenxgraph.utils.interrupt")
        except ModuleNotFoundError as exc:
            if exc.name != "tenxgraph.utils.interrupt":
                raise
            raise AttributeError(
                f"module {__name__!r} has no attribute {name!r} "
                "(tenxgraph.utils.interrupt is not available)"
            ) from exc
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _INTERRUPT_NAMES)


__all__ = [
    "DEFAULT_ANONYMOUS_USER_ID",
    "DEFAULT_NODE_TIMEOUT_SECONDS",
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "END",
    "RESUME_KEY",
    "START",
    "Command",
    "ExecutionState",
    "ResponseGranularity",
    "ThreadInfo",
    "add_messages",
    "append_items",
    "get_tool_metadata",
    "has_tool_decorator",
    "replace_messages",
    "replace_value",
    "tool",
]
