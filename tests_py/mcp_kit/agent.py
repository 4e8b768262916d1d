"""A model -> tools -> model graph whose ToolNode has one local tool and the MCP server of
tests_py/mcp_kit/server.py (at ``MCP_URL``), as a factory for the crash kit's child processes.

The "model" is scripted: its first turn calls ``charge_card`` (on the MCP server) and the local
``note`` in parallel; its second turn answers with the tool results. Every MCP and TOOL callback
appends a JSON line ``{"pid", "what", "fn"}`` to ``MCP_CB_LOG`` (flushed at once), so a test can
see which process fired which callback across a SIGKILL.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fastmcp import Client

from tenxgraph.core.graph import StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import ToolResultBlock
from tenxgraph.utils import END, CallbackManager, InvocationType


def _log(what: str, fn: str | None) -> None:
    path = os.environ.get("MCP_CB_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "what": what, "fn": fn}) + "\n")
            f.flush()


def note(text: str) -> str:
    """Write a note (a local tool)."""
    return f"noted {text}"


PAY = [("charge_card", {"amount": 5}), ("note", {"text": "paid"})]


def scripted_model(calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """A model node whose first turn makes ``calls`` and whose second answers with the tool
    results (their outputs, as JSON text)."""

    def model(state: AgentState) -> Message:
        if state.context[-1].role == "tool":
            results = [b.output for m in state.context if m.role == "tool" for b in m.content
                       if isinstance(b, ToolResultBlock)]
            return Message.text_message(json.dumps(results), role="assistant")
        return Message(role="assistant", content=[], tools_calls=[
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate(calls, 1)])

    return model


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def callbacks() -> CallbackManager:
    mgr = CallbackManager()
    for kind in (InvocationType.MCP, InvocationType.TOOL):
        mgr.register_before_invoke(kind, lambda c, d: (_log(f"before_{c.invocation_type}", c.function_name), d)[1])
        mgr.register_after_invoke(kind, lambda c, i, o: (_log(f"after_{c.invocation_type}", c.function_name), o)[1])
        mgr.register_on_error(kind, lambda c, i, e: _log(f"error_{c.invocation_type}", c.function_name))
    return mgr


def build_graph(checkpointer: Any, client: Any, calls: list[tuple[str, dict[str, Any]]], **tool_node: Any):
    graph = StateGraph(AgentState)
    graph.add_node("model", scripted_model(calls))
    graph.add_node("tools", ToolNode([note], client=client, **tool_node))
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    graph.set_entry_point("model")
    return graph.compile(checkpointer=checkpointer, callback_manager=callbacks())


def build(checkpointer: Any):
    """The crash kit's factory: PAY against the server at ``MCP_URL``."""
    return build_graph(checkpointer, Client(os.environ["MCP_URL"]), PAY)


def build_at_most_once(checkpointer: Any):
    """PAY as ``build``, with the server's ``charge_card`` classed at-most-once in the ledger."""
    return build_graph(checkpointer, Client(os.environ["MCP_URL"]), PAY,
                       mcp_side_effects={"charge_card": "at_most_once"})
