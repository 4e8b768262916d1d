"""A refund that needs a human's approval, for crash tests around a pause: the model asks for
``refund``; the tool pauses at ``interrupt()`` before it pays; the resumed tool records the
payment in the test's ``EffectCounter`` (``$TENXGRAPH_EFFECTS``) with the answer it got."""

from __future__ import annotations

import json
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.testing import EffectCounter
from tenxgraph.utils import interrupt


async def refund(order_id: str, amount_cents: int) -> str:
    """Refund an order, once a human approved it."""
    answer = interrupt({"order_id": order_id, "amount_cents": amount_cents}, message="approve the refund?")
    EffectCounter.from_env().record("refund", order_id=order_id, answer=answer)
    return f"refunded {amount_cents} for {order_id}: {answer}"


async def model(state: AgentState) -> Message:
    last = state.context[-1]
    if last.role == "user":
        call = {"id": "r1", "type": "function",
                "function": {"name": "refund", "arguments": json.dumps({"order_id": "o-7", "amount_cents": 1299})}}
        return Message(role="assistant", content=[], tools_calls=[call])
    return Message.text_message(f"done ({last.text()})", role="assistant")


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def build(checkpointer: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([refund]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)
