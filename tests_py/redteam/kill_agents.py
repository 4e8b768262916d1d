"""Graph factories for the random-kill tests (child processes of tests_py/redteam/killer.py).

``build_react``: a prebuilt ReactAgent whose model is the test's stateless OpenAI stand-in
(``answering_stand_in``: the same request always gets the same answer, so a model call that a
kill repeated does not shift a script). The model asks for ``charge_card`` (idempotent: may run
again only when a kill caught it before its result was recorded) and ``send_receipt``
(``at_most_once``: never twice; an attempt cut off is reported as outcome unknown) in one turn,
then answers. Both record their side effect in the test's EffectCounter before they return.

``build_mcp`` / ``build_mcp_at_most_once``: tests_py/mcp_kit/agent.py's graph (``charge_card``
on the MCP server of tests_py/mcp_kit/server.py, which counts calls on its side, and the local
``note``).
"""

from __future__ import annotations

import threading
from typing import Any

from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.testing import EffectCounter
from tenxgraph.testing.providers import OpenAIStandIn
from tenxgraph.testing.providers.scripted_server import Reply
from tenxgraph.utils.tool_decorator import tool

MODEL = "openai/gpt-4o-mini"
FINAL = "All done."


def charge_card(order_id: str, amount: float) -> str:
    """Charge the customer's card for an order."""
    EffectCounter.from_env().record("charge_card", order_id=order_id, amount=amount)
    return f"Charged ${amount} for {order_id}."


@tool(side_effects="at_most_once")
def send_receipt(order_id: str) -> str:
    """Email the receipt for an order."""
    EffectCounter.from_env().record("send_receipt", order_id=order_id)
    return f"Receipt sent for {order_id}."


def build_react(checkpointer: Any) -> Any:
    return ReactAgent(model=MODEL, tools=[charge_card, send_receipt]).compile(checkpointer=checkpointer)


def build_mcp(checkpointer: Any) -> Any:
    from tests_py.mcp_kit.agent import build

    return build(checkpointer)


def build_mcp_at_most_once(checkpointer: Any) -> Any:
    from tests_py.mcp_kit.agent import build_at_most_once

    return build_at_most_once(checkpointer)


class AnsweringStandIn(OpenAIStandIn):
    """Answers from the request instead of a queue: a conversation that ends with the user's
    message gets the two tool calls, one that ends with tool results gets ``FINAL``."""

    def __init__(self) -> None:
        super().__init__()
        self._body = threading.local()

    def _model(self, path: str, body: dict[str, Any]) -> str:
        self._body.value = body  # the handler asks for the model, then for the reply
        return super()._model(path, body)

    def _next(self, model: str) -> Reply | None:
        messages = self._body.value.get("messages") or []
        if messages and messages[-1].get("role") == "tool":
            return Reply("text", text=FINAL)
        calls = [("charge_card", '{"order_id": "A1", "amount": 5.0}'), ("send_receipt", '{"order_id": "A1"}')]
        return Reply("tool_calls", tool_calls=[
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls, 1)])
