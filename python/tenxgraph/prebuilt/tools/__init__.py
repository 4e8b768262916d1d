"""Prebuilt tools (10xGraph 0.10's set): ``safe_calculator``, the workspace file tools, ``fetch_url``,
the Google search tools (need the google-genai SDK and Google's service), the memory tools (not
supported: no memory store; a call returns a tool error) and the handoff tools, which move a
conversation to another agent node of the graph."""

from tenxgraph.prebuilt.tools.calculator import safe_calculator
from tenxgraph.prebuilt.tools.fetch import fetch_url
from tenxgraph.prebuilt.tools.files import file_read, file_search, file_write
from tenxgraph.prebuilt.tools.handoff import create_handoff_tool, is_handoff_tool
from tenxgraph.prebuilt.tools.memory import make_agent_memory_tool, make_user_memory_tool, memory_tool
from tenxgraph.prebuilt.tools.search import google_web_search, vertex_ai_search

__all__ = [
    "create_handoff_tool",
    "fetch_url",
    "file_read",
    "file_search",
    "file_write",
    "google_web_search",
    "is_handoff_tool",
    "make_agent_memory_tool",
    "make_user_memory_tool",
    "memory_tool",
    "safe_calculator",
    "vertex_ai_search",
]
