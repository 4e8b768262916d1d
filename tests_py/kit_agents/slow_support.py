"""The support agent with two tool rounds and tools that take time on both sides of their side
effect, so a kill at a random moment lands inside tools and between steps, not only in commits
(tests_py/test_redteam_kills_tools.py). Effects are counted in ``$TENXGRAPH_EFFECTS``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.testing import EffectCounter

DONE = "Done: charged, emailed and logged."


async def _effect(name: str, **data: Any) -> None:
    await asyncio.sleep(0.02)
    EffectCounter.from_env().record(name, **data)
    await asyncio.sleep(0.02)


async def charge_card(order_id: str, amount_cents: int) -> str:
    """Charge the customer's saved card for an order."""
    await _effect("charge_card", order_id=order_id)
    return f"charged {amount_cents} for {order_id}"


async def send_receipt(order_id: str) -> str:
    """Email the receipt for an order."""
    await _effect("send_receipt", order_id=order_id)
    return f"receipt for {order_id} sent"


def audit_log(order_id: str) -> str:
    """Write the audit record (a sync tool: it runs in a thread)."""
    import time

    time.sleep(0.02)
    EffectCounter.from_env().record("audit_log", order_id=order_id)
    time.sleep(0.02)
    return f"logged {order_id}"


def call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def model(state: AgentState) -> Message:
    await asyncio.sleep(0.01)
    tools_done = sum(1 for m in state.context if m.role == "tool")
    if state.context[-1].role == "user":
        msg = Message.text_message("Charging and emailing.", role="assistant")
        msg.tools_calls = [call("call_1", "charge_card", order_id="A1", amount_cents=500),
                           call("call_2", "send_receipt", order_id="A1")]
        return msg
    if tools_done == 2:
        msg = Message.text_message("Logging.", role="assistant")
        msg.tools_calls = [call("call_3", "audit_log", order_id="A1")]
        return msg
    return Message.text_message(DONE, role="assistant")


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def build(checkpointer: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([charge_card, send_receipt, audit_log]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)
