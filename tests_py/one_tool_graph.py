"""The smallest agents with tools, for storage tests that need tool calls in a turn: model ->
tools -> model -> END. The model asks for its calls (in parallel) once per user message, then
answers "done". The asking message's id is ``a-<user message id>`` and the call ids are
``call-<i>-<tool>``, so a test knows the ledger keys, and a thread made again with the same user
message gets the same keys."""

from __future__ import annotations

import json
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph, ToolNode


def tool_calls_graph(cp: Any, tools: list[Any], calls: list[tuple[str, dict[str, Any]]],
                     asking_id: str | None = None) -> Any:
    """``calls``: (tool name, arguments) of each call the model asks for; ``asking_id``: the asking
    message's id for every turn (default ``a-<user message id>``)."""

    async def model(state: AgentState) -> Message:
        last = state.context[-1]
        if last.role == "user":
            msg = Message.text_message("calling", role="assistant", message_id=asking_id or f"a-{last.message_id}")
            msg.tools_calls = [{"id": f"call-{i}-{name}", "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)}}
                               for i, (name, args) in enumerate(calls)]
            return msg
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


def one_tool_graph(cp: Any, tool: Any, tool_name: str, args: dict[str, Any]) -> Any:
    """One call of ``tool_name(**args)`` per user message."""
    return tool_calls_graph(cp, [tool], [(tool_name, args)])


def ledger_key(user_message_id: str, index: int, tool_name: str) -> str:
    """The ledger key of call ``index`` asked for after user message ``user_message_id``."""
    return json.dumps([f"a-{user_message_id}", f"call-{index}-{tool_name}"], separators=(",", ":"))
