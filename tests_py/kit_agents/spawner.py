"""An agent whose tool starts a long-lived process, as a tool that launches a worker or a job does.

``build(checkpointer)`` (``"tests_py.kit_agents.spawner:build"``): a scripted model asks for the
tools named in ``$KIT_TOOLS`` (default ``start_worker,charge_card``) in one message, then
answers. ``start_worker`` starts ``sleep`` with the tool's own stdout and stderr (what
``subprocess.Popen`` gives a child by default) and records the sleeper's pid in the test's
:class:`~tenxgraph.testing.EffectCounter`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.testing import EffectCounter

DONE = "Worker started, card charged."


async def start_worker(name: str) -> str:
    """Start a background worker process."""
    worker = subprocess.Popen(["sleep", os.environ.get("WORKER_SECONDS", "600")])
    print(f"stdout: worker {name} is pid {worker.pid}", flush=True)
    print(f"stderr: worker {name} is pid {worker.pid}", file=sys.stderr, flush=True)
    EffectCounter.from_env().record("start_worker", worker=name, pid=worker.pid)
    return f"worker {name} started"


async def charge_card(order_id: str) -> str:
    """Charge the card on file for an order."""
    EffectCounter.from_env().record("charge_card", order_id=order_id)
    return f"charged order {order_id}"


def _call(i: int, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}


async def model(state: AgentState) -> Message:
    if state.context[-1].role == "user":
        msg = Message.text_message("On it.", role="assistant")
        args = {"start_worker": {"name": "w1"}, "charge_card": {"order_id": "4821"}}
        tools = os.environ.get("KIT_TOOLS", "start_worker,charge_card").split(",")
        msg.tools_calls = [_call(i, t, args[t]) for i, t in enumerate(tools, 1)]
        return msg
    return Message.text_message(DONE, role="assistant")


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def build(checkpointer: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([start_worker, charge_card]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)
