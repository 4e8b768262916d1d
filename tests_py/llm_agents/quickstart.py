"""10xGraph's README quick start and its "build your own graph" example, as graph factories the
crash kit imports in its child processes. The code is the README's, with two changes: the model
string names an OpenAI model (the local stand-in speaks OpenAI's API; the README's is Gemini)
and each tool records its side effect in the test's EffectCounter, after the interrupt, so a
test can count refunds across killed processes.

The model is whatever ``OPENAI_BASE_URL`` points at: the test's
:class:`tenxgraph.testing.providers.OpenAIStandIn`.
"""

from __future__ import annotations

from typing import Any

from tenxgraph.core.graph import Agent, StateGraph, ToolNode
from tenxgraph.core.state import AgentState
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.testing import EffectCounter
from tenxgraph.utils import interrupt
from tenxgraph.utils.constants import END

MODEL = "openai/gpt-4o-mini"


def lookup_order(order_id: str) -> dict:
    """Look up an order by id."""
    EffectCounter.from_env().record("lookup_order", order_id=order_id)
    return {"order_id": order_id, "status": "delivered", "total": 42.00}


def refund_order(order_id: str, amount: float) -> str:
    """Refund an order. Requires approval."""
    decision = interrupt({"amount": amount}, message=f"Refund ${amount}?")
    if not decision.get("approved"):
        return "Refund declined by reviewer."
    EffectCounter.from_env().record("refund_order", order_id=order_id, amount=amount)
    return f"Refunded ${amount} for order {order_id}."


def build_react(checkpointer: Any):
    """The quick start: ``ReactAgent(...).compile(checkpointer=...)``."""
    return ReactAgent(
        model=MODEL,
        system_prompt=[{"role": "system", "content": "You are a support agent for an online store."}],
        tools=[lookup_order, refund_order],
    ).compile(checkpointer=checkpointer)


def route(state: AgentState) -> str:
    if state.context and state.context[-1].tools_calls:
        return "TOOL"
    return END


def build_own_graph(checkpointer: Any):
    """"Building your own graph": an Agent node with ``tool_node="TOOL"`` and a ToolNode."""
    graph = StateGraph()
    graph.add_node("MAIN", Agent(
        model=MODEL,
        system_prompt=[{"role": "system", "content": "You are a support agent."}],
        tool_node="TOOL",
    ))
    graph.add_node("TOOL", ToolNode([lookup_order, refund_order]))
    graph.add_conditional_edges("MAIN", route, {"TOOL": "TOOL", END: END})
    graph.add_edge("TOOL", "MAIN")
    graph.set_entry_point("MAIN")
    return graph.compile(checkpointer=checkpointer)
