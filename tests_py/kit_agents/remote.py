"""An agent with a client-run tool (``read_clipboard``, attached to its ToolNode) beside a local
one (``add``), for the remote-tool tests: ``build(checkpointer)`` is the crash kit's factory."""

from __future__ import annotations

import json
from typing import Any

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core.graph import RemoteToolConfig
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.testing import EffectCounter

CLIPBOARD = RemoteToolConfig(node="tools", name="read_clipboard", description="Read the client's clipboard",
                             parameters={"type": "object", "properties": {"fmt": {"type": "string"}}})


def add(a: int, b: int) -> int:
    """Add two numbers."""
    counter = EffectCounter.from_env() if _has_counter() else None
    if counter is not None:
        counter.record("add", a=a, b=b)
    return a + b


def _has_counter() -> bool:
    import os

    from tenxgraph.testing.effects import EFFECTS_ENV

    return bool(os.environ.get(EFFECTS_ENV))


def model(state: AgentState) -> list[Message]:
    if state.context[-1].role == "tool":
        outputs = [str(b.output) for m in state.context if m.role == "tool" for b in m.content if hasattr(b, "output")]
        return [Message.text_message("done: " + " | ".join(outputs), role="assistant")]
    return [Message(role="assistant", content=[], tools_calls=[
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}},
        {"id": "c2", "type": "function", "function": {"name": "read_clipboard", "arguments": json.dumps({"fmt": "txt"})}},
    ])]


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def build(checkpointer: Any, attach: bool = True) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([add]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=checkpointer)
    if attach:
        app.attach_remote_tools([CLIPBOARD])
    return app


def build_per_run(checkpointer: Any) -> Any:
    """The same agent without attached tools: the run's ``config["remote_tools"]`` names them."""
    return build(checkpointer, attach=False)
