"""The smallest agent with a tool: model -> tools -> model -> END, for storage tests that need a
tool call in a turn. The model asks for ``tool_name(**args)`` once per user message, then answers
"done"."""

from __future__ import annotations

import json
import uuid
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph, ToolNode


def one_tool_graph(cp: Any, tool: Any, tool_name: str, args: dict[str, Any]) -> Any:
    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("calling", role="assistant", message_id=f"a-{uuid.uuid4().hex}")
            msg.tools_calls = [{"id": f"call-{tool_name}", "type": "function",
                                "function": {"name": tool_name, "arguments": json.dumps(args)}}]
            return msg
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([tool]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)
