"""Small graphs shared by the tool-handler tests: a scripted model that issues given tool calls,
and a ToolNode; every tool call is counted in a plain dict the test owns."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode


def call(call_id: str, name: str, args: Any = None, raw_args: str | None = None) -> dict[str, Any]:
    arguments = raw_args if raw_args is not None else json.dumps(args or {})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def scripted_model(turns: Sequence[list[dict[str, Any]]]) -> Callable[..., Any]:
    """Turn i (counted by user messages) asks for ``turns[i]``; after tool results it answers."""

    async def model(state: AgentState) -> Message:
        last = state.context[-1]
        if last.role == "user":
            n = sum(1 for m in state.context if m.role == "user") - 1
            msg = Message.text_message(f"calling tools (turn {n + 1})", role="assistant")
            msg.tools_calls = turns[min(n, len(turns) - 1)]
            return msg
        return Message.text_message("done", role="assistant")

    return model


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def tool_graph(state_cls: type[AgentState], tools: list[Callable[..., Any]], turns: Sequence[list[dict]], **compile_kw: Any):
    g = StateGraph(state_cls)
    g.add_node("model", scripted_model(turns))
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(**compile_kw)


def one_reply_graph(checkpointer: Any) -> Any:
    """START -> a node that answers "ok" -> END."""
    g = StateGraph(AgentState)
    g.add_node("model", lambda s: Message.text_message("ok", role="assistant"))
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=checkpointer)


def tool_texts(messages: list[Message]) -> dict[str, Any]:
    """call_id -> the tool result output, for every tool message."""
    out: dict[str, Any] = {}
    for m in messages:
        if m.role != "tool":
            continue
        for b in m.content:
            if getattr(b, "type", None) == "tool_result":
                out[b.call_id] = b.output
    return out


async def seen_cancelled(seen: list[str], timeout: float = 30.0) -> None:
    """Waits until a cancelled coroutine's ``finally`` appended "cancelled" to ``seen``: the loop
    runs it when it next gets to it, on a loaded machine after the caller already has its error."""
    deadline = time.monotonic() + timeout
    while not seen and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert seen == ["cancelled"], seen


def one_node_graph(checkpointer: Any, reply: str = "ok", interrupt_before: list[str] | None = None) -> Any:
    """START -> model -> END, the model answering ``reply``: the least a turn can be."""

    async def model(state: AgentState) -> Message:
        return Message.text_message(reply, role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=checkpointer, interrupt_before=interrupt_before)
