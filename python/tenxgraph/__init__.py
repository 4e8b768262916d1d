"""tenxgraph: a durable runtime for Python agents with a Rust core.

Compatible with the core API of 10xGraph 0.10: ``StateGraph``, ``AgentState``, ``Message``,
``START``/``END``; the loop, checkpoints and tool ledger run in Rust.
"""

from __future__ import annotations

import atexit
from importlib.metadata import PackageNotFoundError, version

from tenxgraph._lazy import lazy_exports

try:
    __version__ = version("10xgraph")
except PackageNotFoundError:
    __version__ = "0.0.0+unknown"

from tenxgraph import _core

# Rust threads (pools, timers) may still log while the interpreter finalizes; stop that first.
atexit.register(_core.shutdown)

_LAZY = {
    "StateGraph": "tenxgraph.core.graph",
    "Agent": "tenxgraph.core.graph",
    "CompiledGraph": "tenxgraph.core.graph",
    "ToolNode": "tenxgraph.core.graph.tool_node",
    "AgentState": "tenxgraph.core.state",
    "Message": "tenxgraph.core.state",
    "START": "tenxgraph.utils.constants",
    "END": "tenxgraph.utils.constants",
    "load_config": "tenxgraph.config",
}

__all__ = ["__version__", *_LAZY]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)
