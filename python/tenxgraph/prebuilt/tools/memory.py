"""``memory_tool``, ``make_user_memory_tool``, ``make_agent_memory_tool``: 10xGraph's long-term
memory tools, with its names, signatures and tool schemas.

Not supported: they read and write a long-term memory store (10xGraph's ``BaseStore``, backed
by Qdrant or mem0, external services), and tenxgraph has no such store (Agent ``memory=`` is not
supported either; docs/migrating-from-10xgraph.md). They can be registered, so an agent that
lists them builds and runs; a call returns the JSON tool error 10xGraph returns when no store is
configured (``{"error": "no memory store configured", ...}``, with the reason), which the model
reads. Nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from tenxgraph.utils.tool_decorator import tool

__all__ = ["make_agent_memory_tool", "make_user_memory_tool", "memory_tool"]

REASON = ("tenxgraph has no long-term memory store (10xGraph's BaseStore); memory tools are not supported, "
          "see docs/migrating-from-10xgraph.md")


def _no_store(which: str = "") -> str:
    return json.dumps({"error": f"no {which}memory store configured", "reason": REASON})


@tool(
    name="memory_tool",
    description=("Search, store, update or delete long-term memories. "
                 "Use action='search' with a query to recall relevant memories. "
                 "Use action='store' with content and a short snake_case memory_key "
                 "(e.g. 'user_name', 'favorite_language') to save new memories. "
                 "The system uses memory_key to detect duplicates — if a memory with the "
                 "same key already exists it will be updated automatically. "
                 "Use action='delete' with memory_id to remove memories."),
    tags=["memory", "long_term_memory"],
    side_effects="at_most_once",
)
async def memory_tool(  # noqa: PLR0913 - 10xGraph's signature
    action: Literal["search", "store", "update", "delete"] = "search",
    content: str = "",
    memory_key: str = "",
    memory_id: str = "",
    query: str = "",
    memory_type: str | None = None,
    category: str | None = None,
    metadata: dict[str, Any] | None = None,
    limit: int = 5,
    score_threshold: float | None = None,
    write_mode: Literal["merge", "replace"] = "merge",
    config: dict[str, Any] | None = None,
    store: Any = None,
    task_manager: Any = None,
) -> str:
    """Always the JSON tool error ``{"error": "no memory store configured", "reason": ...}``
    (tenxgraph has no memory store); nothing is stored, updated or deleted."""
    return _no_store()


def make_user_memory_tool(memory_config: Any) -> Callable[..., Any]:
    """The ``user_memory_tool`` 10xGraph's ``Agent(memory=...)`` registers, with its schema;
    a call returns the JSON tool error ``{"error": "no user memory store configured", ...}``."""

    @tool(
        name="user_memory_tool",
        description=("Search or remember user-scoped long-term memories. "
                     "Use action='search' with text to recall durable user facts. "
                     "Use action='remember' with text to save useful user facts or preferences. "
                     "The model does not provide memory identifiers."),
        tags=["memory", "long_term_memory", "user_memory"],
        side_effects="at_most_once",
    )
    async def user_memory_tool(
        action: Literal["search", "remember"] = "search",
        text: str = "",
        memory_type: str | None = None,
        category: str | None = None,
        limit: int | None = None,
        config: dict[str, Any] | None = None,
        store: Any = None,
        task_manager: Any = None,
    ) -> str:
        return _no_store("user ")

    return user_memory_tool


def make_agent_memory_tool(memory_config: Any) -> Callable[..., Any]:
    """The read-only ``agent_memory_tool`` of 10xGraph's ``Agent(memory=...)``, with its schema;
    a call returns the JSON tool error ``{"error": "no agent memory store configured", ...}``."""

    @tool(
        name="agent_memory_tool",
        description=("Search read-only agent/app-scoped long-term memories. "
                     "This tool cannot write, update, or delete memory."),
        tags=["memory", "long_term_memory", "agent_memory"],
    )
    async def agent_memory_tool(
        query: str,
        memory_type: str | None = None,
        category: str | None = None,
        limit: int | None = None,
        config: dict[str, Any] | None = None,
        store: Any = None,
        task_manager: Any = None,
    ) -> str:
        return _no_store("agent ")

    return agent_memory_tool
