"""Child for the expired-lease test: a turn whose ``slow_charge`` tool blocks until a file exists
(only while ``$TENX_BLOCK`` names one), run with lease renewals cut (``lease_renew=raise``: a
partition; only while ``$TENX_PARTITION`` is set) and a short lease. With ``$TENX_RETRY_BUSY`` a
busy thread is tried again (0.1 s apart, for up to 60 s). Prints the outcome as JSON. argv: db,
thread id, mode (run|resume), lease ttl."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import ThreadBusyError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
from tenxgraph.testing import EffectCounter

DONE = "all done"


async def slow_charge(order_id: str) -> str:
    """Charge an order (slow)."""
    block = os.environ.get("TENX_BLOCK")
    if block:
        Path(block + ".entered").touch()
        while not Path(block).exists():
            await asyncio.sleep(0.01)
    EffectCounter.from_env().record("slow_charge", order_id=order_id, pid=os.getpid())
    return f"charged {order_id}"


async def note(order_id: str) -> str:
    """Write a note."""
    EffectCounter.from_env().record("note", order_id=order_id, pid=os.getpid())
    return f"noted {order_id}"


def call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def model(state: AgentState) -> Message:
    if state.context[-1].role == "user":
        msg = Message.text_message("working", role="assistant")
        msg.tools_calls = [call("c1", "note", order_id="A1"), call("c2", "slow_charge", order_id="A1")]
        return msg
    return Message.text_message(DONE, role="assistant")


def build(cp: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([note, slow_charge]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


async def main(db: str, tid: str, mode: str, ttl: str) -> None:
    cp = PgCheckpointer(db) if db.startswith("postgresql://") else SqliteCheckpointer(db)
    app = build(cp)
    cfg: dict[str, Any] = {"thread_id": tid, "lease_ttl": float(ttl)}
    if os.environ.get("TENX_PARTITION"):
        cfg["failpoints"] = "lease_renew=raise"
    data = {"messages": [Message.text_message("charge A1")]} if mode == "run" else {}
    retry_until = time.monotonic() + (60 if os.environ.get("TENX_RETRY_BUSY") else 0)
    busy = 0
    while True:
        try:
            r = await app.ainvoke(data, cfg)
            out = {"outcome": "completed", "last": r["messages"][-1].text()}
        except ThreadBusyError:
            busy += 1
            if time.monotonic() < retry_until:
                await asyncio.sleep(0.1)
                continue
            out = {"outcome": "error", "type": "ThreadBusyError", "code": "busy", "tries": busy}
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            out = {"outcome": "error", "type": type(exc).__name__, "code": getattr(exc, "error_code", None)}
        break
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
