"""An agent whose tool node has a client-side (remote) tool beside a local one, for crashes around
the client's answer. ``build(checkpointer)`` (``"tests_py.crash_agents.remote_answer_agent:build"``):
the model asks for ``add`` (runs here) and, when the user says "paste", ``read_clipboard`` (the
client runs it: the run pauses after the tool node), then answers with the last tool result's
text. While the file named by ``$REMOTE_AGENT_ROUTE_FAILS`` exists, routing out of the tool node
raises."""

from __future__ import annotations

import json
import os
from typing import Any

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core.graph import RemoteToolConfig, ToolNode
from tenxgraph.core.state.message_block import ToolResultBlock
from tenxgraph.testing import EffectCounter

CLIPBOARD = RemoteToolConfig(node="tools", name="read_clipboard", description="Read the client's clipboard",
                             parameters={"type": "object", "properties": {"fmt": {"type": "string"}}})


def add(a: int, b: int) -> int:
    """Add two numbers."""
    EffectCounter.from_env().record("add", a=a, b=b)
    return a + b


def model(state: AgentState) -> Message:
    last = state.context[-1]
    if last.role == "tool":
        EffectCounter.from_env().record("model_on_results")
        return Message.text_message("done: " + last.text(), role="assistant")
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}}]
    if "paste" in last.text():  # the client's tool only when the user asks for it
        calls.append({"id": "r1", "type": "function",
                      "function": {"name": "read_clipboard", "arguments": json.dumps({"fmt": "txt"})}})
    return Message(role="assistant", content=[], tools_calls=calls)


# While this file exists, routing out of the tool node fails (a router's bug, fixed by a deploy).
ROUTE_FAILS_ENV = "REMOTE_AGENT_ROUTE_FAILS"


def after_tools(state: AgentState) -> str:
    flag = os.environ.get(ROUTE_FAILS_ENV)
    if flag and os.path.exists(flag):
        raise RuntimeError("router bug")
    return "model"


def build(checkpointer: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([add]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_conditional_edges("tools", after_tools, {"model": "model"})
    app = g.compile(checkpointer=checkpointer)
    app.attach_remote_tools([CLIPBOARD])
    return app


def answer() -> Message:
    """The client's result for ``read_clipboard``."""
    return Message.tool_message([ToolResultBlock(call_id="r1", output="CLIP", status="completed")],
                                message_id="client-r1")
