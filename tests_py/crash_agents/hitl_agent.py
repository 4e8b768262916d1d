"""Child process for the interrupt crash test: a node asks for approval; the process then waits
(as a server would) until it is killed; a new process resumes the thread."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from tenxgraph import END, START, AgentState, StateGraph
from tenxgraph.core.state.message import Message
from tenxgraph.utils import interrupt, pending_interrupt

sys.path.insert(0, os.path.dirname(__file__))
from three_steps import effect, open_checkpointer  # noqa: E402


async def approve(state: AgentState) -> str:
    effect("start:approve")
    decision = interrupt({"amount": 42}, message="Refund $42?", response_schema={"type": "object", "required": ["ok"]})
    effect(f"decided:{decision['ok']}")
    return f"approved={decision['ok']}"


def build(db: str):
    g = StateGraph()
    g.add_node("approve", approve)
    g.add_edge(START, "approve")
    g.add_edge("approve", END)
    return g.compile(checkpointer=open_checkpointer(db))


async def main(mode: str, db: str, thread: str) -> None:
    app = build(db)
    cfg = {"thread_id": thread}
    if mode == "start":
        r = await app.ainvoke({"messages": [Message.text_message("refund")]}, cfg, "full")
        effect("paused:" + pending_interrupt(r["state"]).key)
        time.sleep(3600)  # waiting for a human; the process is killed here
    else:
        r = await app.ainvoke({"resume": json.loads(mode)}, cfg)
        print(json.dumps([m.text() for m in r["messages"]]))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
