"""A coordinator that looks something up and hands off to a researcher in one message: the
crash kit's factory ``build(checkpointer)`` for the handoff tests."""

from __future__ import annotations

import json
from typing import Any

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.prebuilt.tools import create_handoff_tool
from tenxgraph.testing import EffectCounter

to_researcher = create_handoff_tool("researcher", description="Send the question to the researcher")


async def lookup(topic: str) -> str:
    """Look a topic up."""
    EffectCounter.from_env().record("lookup", topic=topic)
    return f"notes on {topic}"


def coordinator(state: AgentState) -> list[Message]:
    return [Message(role="assistant", content=[], tools_calls=[
        {"id": "l1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"topic": "otters"})}},
        {"id": "h1", "type": "function", "function": {"name": "transfer_to_researcher", "arguments": "{}"}},
    ])]


def researcher(state: AgentState) -> list[Message]:
    tool_texts = [m.text() for m in state.context if m.role == "tool"]
    return [Message.text_message("researched: " + "; ".join(tool_texts), role="assistant")]


def build(checkpointer: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("coordinator", coordinator)
    g.add_node("tools", ToolNode([lookup, to_researcher]))
    g.add_node("researcher", researcher)
    g.set_entry_point("coordinator")
    g.add_edge("coordinator", "tools")
    g.add_edge("tools", "coordinator")  # without the handoff the run would loop back here
    g.add_edge("researcher", END)
    return g.compile(checkpointer=checkpointer)
