"""A model -> tools -> model agent with TOOL and AI callbacks that log to a file, for the
crash-replay test of tests_py/test_compat_callbacks.py.

    python callback_agent.py run|resume <sqlite db> <log file> <pg dsn or ""> <pg schema>

``run`` starts thread "cb"; ``resume`` continues it with ``ainvoke({})``. Every callback and every
real tool run appends one JSON line ``{"pid", "what", ...}`` to the log, flushed at once, so a
SIGKILL loses none of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from tenxgraph.core.graph import StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
from tenxgraph.utils import END, CallbackManager, InvocationType

MODE, DB, LOG, DSN, SCHEMA = sys.argv[1:6]


def log(what: str, **more: object) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "what": what, **more}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def charge_card(amount: int) -> str:
    log("tool_ran", tool="charge_card")
    return f"charged {amount}"


def model(state: AgentState) -> Message:
    if state.context[-1].role == "tool":
        return Message.text_message("paid", role="assistant")
    return Message(
        role="assistant",
        content=[],
        tools_calls=[{"id": "call_1", "type": "function",
                      "function": {"name": "charge_card", "arguments": '{"amount": 5}'}}],
    )


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


mgr = CallbackManager()
mgr.register_before_invoke(InvocationType.TOOL, lambda c, d: (log("before_tool", fn=c.function_name), d)[1])
mgr.register_after_invoke(InvocationType.TOOL, lambda c, i, o: (log("after_tool", fn=c.function_name), o)[1])
mgr.register_before_invoke(InvocationType.AI, lambda c, d: (log("before_ai", node=c.node_name), d)[1])
mgr.register_after_invoke(InvocationType.AI, lambda c, i, o: (log("after_ai", node=c.node_name), o)[1])

g = StateGraph(AgentState)
g.add_node("model", model)
g.add_node("tools", ToolNode([charge_card]))
g.add_conditional_edges("model", route, {"tools": "tools", END: END})
g.add_edge("tools", "model")
g.set_entry_point("model")
cp = PgCheckpointer(DSN, schema=SCHEMA, enforce_user_isolation=False) if DSN else SqliteCheckpointer(DB)
app = g.compile(checkpointer=cp, callback_manager=mgr)


async def main() -> None:
    cfg = {"thread_id": "cb", "user_id": "u"}
    if MODE == "run":
        cfg["failpoints"] = "after_record:charge_card=kill"
        out = await app.ainvoke({"messages": [Message.text_message("pay", role="user")]}, cfg)
    else:
        out = await app.ainvoke({}, cfg)
    log("done", texts=[m.text() for m in out["messages"]])
    await app.aclose()


asyncio.run(main())
