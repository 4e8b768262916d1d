"""The agent loop most tests build: the model node, then the tool node while the model's last
message asks for tool calls, then the model again."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tenxgraph import END, START, AgentState, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode


def agent_loop(model: Callable[..., Any], tools: Sequence[Callable[..., Any]], checkpointer: Any,
               **compile_kw: Any) -> Any:
    """START -> model -> tools -> model ... -> END, compiled on ``checkpointer``."""

    def route(state: AgentState) -> str:
        return "tools" if state.context[-1].tools_calls else END

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode(list(tools)))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer, **compile_kw)
