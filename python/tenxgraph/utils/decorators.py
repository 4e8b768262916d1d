"""``tenxgraph.utils.decorators``: 10xGraph 0.10's module name for the ``@tool`` decorator and its
metadata helpers (the implementation lives in :mod:`tenxgraph.utils.tool_decorator`)."""

from __future__ import annotations

from tenxgraph.utils.tool_decorator import get_tool_metadata, has_tool_decorator, tool

__all__ = ["get_tool_metadata", "has_tool_decorator", "tool"]
