"""A tool agent for PgCheckpointer(id_type="bigint") crash tests (tests_py/test_pg_int_ids.py).

``build(checkpointer)`` is the kit's factory. Message ids come from ``BigIntIDGenerator``, so every
id the graph writes fits the bigint columns. The model asks for ``charge`` once, then answers;
``charge`` records its side effect in ``$TENXGRAPH_EFFECTS`` (the kit's EffectCounter), which
outlives the processes a test kills.
"""

from __future__ import annotations

import json
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.testing import EffectCounter
from tenxgraph.utils.id_generator import BigIntIDGenerator

DONE = "charged, thanks"


async def charge(amount: int) -> str:
    """Charge the card on file."""
    EffectCounter.from_env().record("charge", amount=amount)
    return f"charged {amount}"


async def model(state: AgentState) -> Message:
    if state.context[-1].role == "user":
        msg = Message.text_message("charging", role="assistant")
        msg.tools_calls = [{"id": "call_1", "type": "function",
                            "function": {"name": "charge", "arguments": json.dumps({"amount": 42})}}]
        return msg
    return Message.text_message(DONE, role="assistant")


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def build(checkpointer: Any):
    graph = StateGraph(AgentState, id_generator=BigIntIDGenerator())
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([charge]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)
