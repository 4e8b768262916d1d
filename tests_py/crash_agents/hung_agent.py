"""Child process for the stop-vs-preempt test: one node that hangs until the run is stopped.

argv: db (SQLite path or Postgres DSN), redis url or "-", thread id, started-file. The node
touches started-file, then waits forever (no node timeout): only a hard stop ends it. Prints the
thread's final status, interrupt reason and stop flag as JSON."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer


def open_db(db: str, redis: str, schema: str):
    if db.startswith("postgresql://"):
        return PgCheckpointer(db, redis_url=None if redis == "-" else redis, schema=schema, enforce_user_isolation=False)
    return SqliteCheckpointer(db)


async def main(db: str, redis: str, schema: str, thread: str, started: str) -> None:
    async def hang(state: AgentState) -> Message:
        Path(started).touch()
        await asyncio.Event().wait()
        return Message.text_message("never", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("hang", hang)
    g.add_edge(START, "hang")
    g.add_edge("hang", END)
    cp = open_db(db, redis, schema)
    app = g.compile(checkpointer=cp)
    r = await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": thread, "node_timeout": None},
                          "full")
    meta = r["state"].execution_meta
    print(json.dumps({"status": str(meta.status), "reason": meta.interrupt_reason,
                      "stop": meta.stop_current_execution}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
