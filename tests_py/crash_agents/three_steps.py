"""A graph run in a child process by the crash tests: a -> b -> c on SQLite.

Every node appends to an effects file outside the process, so a parent can count what really ran
across a SIGKILL. With TENX_HANG_IN=b, node b announces itself and then hangs, waiting to be killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer


def open_checkpointer(db: str):
    """A SQLite file path, or a Postgres DSN (schema from TENX_SCHEMA)."""
    if db.startswith("postgresql://"):
        return PgCheckpointer(db, schema=os.environ.get("TENX_SCHEMA", "public"))
    return SqliteCheckpointer(db)


class Ticket(AgentState):
    visited: list[str] = []


def effect(line: str) -> None:
    with open(os.environ["TENX_EFFECTS"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def make_node(name: str):
    async def node(state: Ticket) -> Ticket:
        effect(f"start:{name}")
        if os.environ.get("TENX_HANG_IN") == name:
            effect(f"hanging:{name}")
            time.sleep(3600)  # blocks the whole process: only SIGKILL ends it
        state.visited.append(name)
        state.context.append(Message.text_message(f"{name} done", role="assistant"))
        effect(f"end:{name}")
        return state

    node.__name__ = name
    return node


def build(db: str):
    g = StateGraph(Ticket)
    for n in ("a", "b", "c"):
        g.add_node(n, make_node(n))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile(checkpointer=open_checkpointer(db))


async def main(mode: str, db: str, thread: str) -> None:
    app = build(db)
    config = {"thread_id": thread}
    data = {"messages": [Message.text_message("open a ticket", message_id="user-1")]} if mode == "start" else {}
    result = await app.ainvoke(data, config, response_granularity="full")
    state = result["state"]
    print(json.dumps({
        "visited": state.visited,
        "status": str(state.execution_meta.status),
        "step": state.execution_meta.step,
        "messages": [m.text() for m in result["messages"]],
    }))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
