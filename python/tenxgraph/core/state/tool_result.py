"""ToolResult: a tool's return value that also updates graph state."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

__all__ = ["ToolResult"]

_MISSING: Any = object()


class ToolResult(BaseModel):
    """Returned by a tool: ``message`` becomes the tool result output seen by the model;
    each key of ``state`` that the graph state has is set on it."""

    message: Any
    state: dict[str, Any] | None = None
    is_error: bool = False

    def __init__(
        self,
        message: Any = _MISSING,
        state: dict[str, Any] | None = None,
        is_error: bool = False,
        **data: Any,
    ) -> None:
        # Positional form ToolResult("done", {"k": v}) as in 10xGraph; an omitted message
        # is left out so pydantic reports it missing.
        if message is not _MISSING:
            data["message"] = message
        super().__init__(state=state, is_error=is_error, **data)
