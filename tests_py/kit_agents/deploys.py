"""An agent as two deploys wrote it, for the tests of a thread crashed under one and continued by
the other: ``build`` is the first; ``build_node_renamed`` renamed its tool node, and
``build_tool_renamed`` its at-most-once tool."""

from __future__ import annotations

import json
import os
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.testing import EffectCounter
from tenxgraph.testing.effects import EFFECTS_ENV
from tenxgraph.utils.tool_decorator import tool


def _effect(name: str) -> None:
    if os.environ.get(EFFECTS_ENV):
        EffectCounter.from_env().record(name)


def pay(order_id: str) -> str:
    """Pay for an order."""
    _effect("pay")
    return f"paid {order_id}"


def _charge(order_id: str) -> str:
    """Charge the card for an order."""
    _effect("charge")
    return f"charged {order_id}"


def _graph(checkpointer: Any, tool_node: str, charge_name: str) -> Any:
    def model(state: AgentState) -> Message:
        last = state.context[-1]
        if last.role == "user":
            name = charge_name if "charge" in last.text() else "pay"
            call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps({"order_id": "42"})}}
            return Message(role="assistant", content=[], tools_calls=[call])
        return Message.text_message("done: " + last.text(), role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node(tool_node, ToolNode([pay, tool(name=charge_name, side_effects="at_most_once")(_charge)]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: tool_node if s.context[-1].tools_calls else END,
                            {tool_node: tool_node, END: END})
    g.add_edge(tool_node, "model")
    return g.compile(checkpointer=checkpointer)


def build(checkpointer: Any) -> Any:
    return _graph(checkpointer, "tools", "charge")


def build_node_renamed(checkpointer: Any) -> Any:
    return _graph(checkpointer, "tools_v2", "charge")


def build_tool_renamed(checkpointer: Any) -> Any:
    return _graph(checkpointer, "tools", "charge_v2")
