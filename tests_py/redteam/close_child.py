"""Child process for the SIGKILL tests: argv = kind, where (sqlite path or pg dsn|schema), thread,
action (fail|turn:<text>|resume), effects file, ready file. Prints one JSON line."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests_py.redteam.graphs import agent_loop  # noqa: E402
from tests_py.redteam.tool_history import order_turn_message, turn  # noqa: E402
from tenxgraph import AgentState, Message  # noqa: E402
from tenxgraph.utils import tool  # noqa: E402

kind, where, thread, action, effects_path, ready = sys.argv[1:7]
HANG = os.environ.get("RT_HANG") == "1"
AMO = os.environ.get("RT_AMO") == "1"


def effect(what: str) -> None:
    fd = os.open(effects_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (what + "\n").encode())
    os.close(fd)


deco = tool(side_effects="at_most_once") if AMO else (lambda f: f)


@deco
async def charge(order_id: str) -> str:
    """Charge."""
    effect(f"charge {order_id}")
    return f"charged {order_id}"


@deco
async def ship(order_id: str) -> str:
    """Ship."""
    if HANG:
        await asyncio.Event().wait()
    await asyncio.sleep(0.02)
    effect(f"ship {order_id}")
    return f"shipped {order_id}"


async def model(state: AgentState) -> Message:
    await asyncio.sleep(0.05)
    return order_turn_message(state)


def checkpointer() -> Any:
    from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
    if kind == "sqlite":
        return SqliteCheckpointer(where)
    dsn, schema = where.split("|")
    cp = PgCheckpointer(dsn, schema=schema, enforce_user_isolation=False)
    cp.setup()
    return cp


async def main() -> None:
    cp = checkpointer()
    app = agent_loop(model, [charge, ship], cp)
    # The short node timeout only where ship hangs (the turn that must fail there); elsewhere a
    # loaded machine must not time a node out. A lease that a killed child leaves expires in 3 s,
    # long enough for a starved holder to renew it.
    cfg = {"thread_id": thread, "user_id": "u1", "node_timeout": 0.5 if HANG else 60, "lease_ttl": 3.0,
           "on_busy": "wait", "busy_timeout": 60}
    data = {} if action == "resume" else turn(action.split(":", 1)[1])
    open(ready, "w").close()
    try:
        await app.ainvoke(data, cfg)
        out = {"ok": True}
    except Exception as exc:
        out = {"ok": False, "code": getattr(exc, "error_code", None), "type": type(exc).__name__, "msg": str(exc)[:300]}
    print(json.dumps(out), flush=True)


asyncio.run(main())
