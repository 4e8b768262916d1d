"""Prebuilt agents: graphs of ordinary nodes (an ``Agent`` and a ``ToolNode``), so every durable
guarantee of the runtime holds in them. ``ReactAgent`` today; the others of 10xGraph are not
yet provided (see docs/migrating-from-10xgraph.md)."""

from tenxgraph.prebuilt.agent.react import ReactAgent

__all__ = ["ReactAgent"]
