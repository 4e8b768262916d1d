"""The package is typed: stubs for the native module match it, and py.typed ships."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tenxgraph


def test_py_typed_marker_ships() -> None:
    assert (Path(tenxgraph.__file__).parent / "py.typed").exists()


def test_native_stub_matches_the_extension() -> None:
    pytest.importorskip("mypy")
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "tenxgraph._core"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_top_level_exports_match_10xgraph() -> None:
    """10xGraph 0.10's `tenxgraph` exports (reference section 1.1)."""
    from tenxgraph.core.graph.agent import Agent
    from tenxgraph.core.graph.state_graph import StateGraph
    from tenxgraph.core.graph.tool_node import ToolNode
    from tenxgraph.core.state import AgentState, Message

    assert tenxgraph.StateGraph is StateGraph and tenxgraph.ToolNode is ToolNode
    assert tenxgraph.Agent is Agent
    assert tenxgraph.AgentState is AgentState and tenxgraph.Message is Message
    assert (tenxgraph.START, tenxgraph.END) == ("__start__", "__end__")
    with pytest.raises(AttributeError):
        tenxgraph.NotAName  # noqa: B018
