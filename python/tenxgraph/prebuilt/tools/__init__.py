"""Prebuilt tools. Handoff tools move a conversation to another agent node of the graph."""

from tenxgraph.prebuilt.tools.handoff import create_handoff_tool, is_handoff_tool

__all__ = ["create_handoff_tool", "is_handoff_tool"]
