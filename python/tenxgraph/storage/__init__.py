"""Storage backends: the checkpointers (``tenxgraph.storage.checkpointer``), also importable from
here as in 10xGraph 0.10. Its long-term memory stores (``storage.store``) and media storage
(``storage.media``) are not provided (docs/migrating-from-10xgraph.md)."""

from __future__ import annotations

from tenxgraph._lazy import lazy_exports

_LAZY = {
    "BaseCheckpointer": "tenxgraph.storage.checkpointer",
    "InMemoryCheckpointer": "tenxgraph.storage.checkpointer",
    "PgCheckpointer": "tenxgraph.storage.checkpointer",
    "SqliteCheckpointer": "tenxgraph.storage.checkpointer",
    # 10xGraph exports its memory tools here too; ours answer "no memory store configured".
    "make_agent_memory_tool": "tenxgraph.prebuilt.tools",
    "make_user_memory_tool": "tenxgraph.prebuilt.tools",
    "memory_tool": "tenxgraph.prebuilt.tools",
}

__all__ = sorted([*_LAZY, "checkpointer"])

__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, {"checkpointer": "tenxgraph.storage.checkpointer"})
