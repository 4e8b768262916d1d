"""Prebuilt agents (``tenxgraph.prebuilt.agent``) and tools (``tenxgraph.prebuilt.tools``).

The names 10xGraph 0.10 re-exports here load on first access (PEP 562), so importing
``tenxgraph.prebuilt.tools`` never pulls in the LLM layer.
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {"ReactAgent": "tenxgraph.prebuilt.agent", "create_handoff_tool": "tenxgraph.prebuilt.tools",
         "is_handoff_tool": "tenxgraph.prebuilt.tools"}

__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module 'tenxgraph.prebuilt' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
