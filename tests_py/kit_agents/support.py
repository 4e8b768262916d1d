"""The support agent, as a user of ``tenxgraph.testing`` would write it for crash tests.

``build(checkpointer)`` is the factory the kit imports in its child processes
(``"tests_py.kit_agents.support:build"``). A scripted model asks for ``lookup_order``,
``charge_card`` and ``send_receipt`` in one message, then summarises. Every tool records its
side effect in the test's :class:`~tenxgraph.testing.EffectCounter` (``$TENXGRAPH_EFFECTS``),
a file that outlives the processes a test kills.
"""

from __future__ import annotations

import json
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.testing import EffectCounter

DONE = "Done: charged and emailed."


async def lookup_order(order_id: str) -> str:
    """Look up an order by id."""
    EffectCounter.from_env().record("lookup_order", order_id=order_id)
    return f"order {order_id}: 1 x headphones, 129.00 USD, card on file"


async def charge_card(order_id: str, amount_cents: int, idempotency_key: str) -> str:
    """Charge the customer's saved card for an order."""
    EffectCounter.from_env().record("charge_card", order_id=order_id, amount_cents=amount_cents, key=idempotency_key)
    return f"charged {amount_cents / 100:.2f} USD for order {order_id}"


async def send_receipt(order_id: str) -> str:
    """Email the receipt for an order."""
    EffectCounter.from_env().record("send_receipt", order_id=order_id)
    return f"receipt for order {order_id} sent"


def tool_call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def model(state: AgentState) -> Message:
    """Three tool calls for a user message; a summary once the tool results are in."""
    if state.context[-1].role == "user":
        msg = Message.text_message("Let me take care of that.", role="assistant")
        msg.tools_calls = [
            tool_call("call_1", "lookup_order", order_id="4821"),
            tool_call("call_2", "charge_card", order_id="4821", amount_cents=12900),
            tool_call("call_3", "send_receipt", order_id="4821"),
        ]
        return msg
    return Message.text_message(DONE, role="assistant")


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def build(checkpointer: Any):
    graph = StateGraph(AgentState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup_order, charge_card, send_receipt]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)
