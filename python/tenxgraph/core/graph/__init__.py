"""Graph building and running. Names load lazily (PEP 562), as in 10xGraph, so that importing a
submodule such as ``tool_node`` does not pull in the whole runtime."""

from __future__ import annotations


from tenxgraph._lazy import lazy_exports

_LAZY = {
    "Agent": "tenxgraph.core.graph.agent",
    "BaseAgent": "tenxgraph.core.graph.base_agent",
    "RetryConfig": "tenxgraph.core.llm.retry",
    "CompiledGraph": "tenxgraph.core.graph.compiled_graph",
    "Edge": "tenxgraph.core.graph.edge",
    "Node": "tenxgraph.core.graph.node",
    "RemoteToolConfig": "tenxgraph.core.graph.remote_tool",
    "StateGraph": "tenxgraph.core.graph.state_graph",
    "ToolNode": "tenxgraph.core.graph.tool_node",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
