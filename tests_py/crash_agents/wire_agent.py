"""An agent whose one tool call is an at-most-once wire, asked once per user message: run in
process with the test's own ``wire`` tool, or as a child process (``python wire_agent.py DB
PAYLOAD FAILPOINTS``, with ``$EFFECTS`` the file each wire appends a line to, fsynced before it
returns) that prints the run's status and pending interrupt as JSON."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.interrupt import pending_interrupt
from tenxgraph.utils.tool_decorator import tool


async def model(state: AgentState) -> Message:
    if state.context[-1].role == "user":
        m = Message.text_message("wiring", role="assistant")
        m.tools_calls = [{"id": "call_1", "type": "function",
                          "function": {"name": "wire", "arguments": '{"amount": 100}'}}]
        return m
    return Message.text_message("DONE", role="assistant")


def wire_graph(checkpointer: Any, wire: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([wire]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


@tool(side_effects="at_most_once", on_unknown="interrupt")
async def wire(amount: int, idempotency_key: str) -> str:
    """Wire money (at most once)."""
    fd = os.open(os.environ["EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"wire\n")
    os.fsync(fd)
    os.close(fd)
    return "wired"


async def main(db: str, payload: str, failpoints: str) -> None:
    app = wire_graph(SqliteCheckpointer(db), wire)
    cfg: dict[str, Any] = {"thread_id": "t"}
    if failpoints:
        cfg["failpoints"] = failpoints
    r = await app.ainvoke(json.loads(payload), cfg, response_granularity="full")
    p = pending_interrupt(r["state"])
    print(json.dumps({"status": str(r["state"].execution_meta.status.value), "pending": p.reason if p else None,
                      "key": p.key if p else None, "last": r["state"].context[-1].text()}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
