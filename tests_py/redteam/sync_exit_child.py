"""Child for the sync-tool exit tests. argv: mode db effects_dir n seconds.
mode: sqlite | pgfreeze (db = dsn|schema; a FreezeProxy in this process is frozen right after the
invoke returns, so the late records hang)."""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

# Ctrl-C as at a terminal: a suite started as a background job (as CI may) passes SIGINT on
# ignored, and the test's Ctrl-C would then never reach this process.
signal.signal(signal.SIGINT, signal.default_int_handler)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tenxgraph import END, START, AgentState, Message, StateGraph  # noqa: E402
from tenxgraph.core.graph.tool_node import ToolNode  # noqa: E402

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(message)s")
mode, db, effects, n, seconds = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])


def slow(i: int) -> str:
    """Takes its time."""
    (effects / f"started-{i}-{os.getpid()}").touch()
    time.sleep(seconds)
    (effects / f"done-{i}-{os.getpid()}").touch()
    return f"finished {i}"


async def model(state: AgentState) -> Message:
    if state.context[-1].role == "user":
        msg = Message.text_message("calling", role="assistant", message_id="a-1")
        msg.tools_calls = [{"id": f"call-{i}", "type": "function",
                            "function": {"name": "slow", "arguments": json.dumps({"i": i})}} for i in range(n)]
        return msg
    return Message.text_message("ok", role="assistant")


proxy = None
if mode == "sqlite":
    from tenxgraph.storage.checkpointer import SqliteCheckpointer
    cp = SqliteCheckpointer(db)
else:
    from urllib.parse import urlsplit
    from tests_py.redteam.blackhole import FreezeProxy
    from tenxgraph.storage.checkpointer import PgCheckpointer
    dsn, schema = db.split("|")
    parts = urlsplit(dsn)
    proxy = FreezeProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    cp = PgCheckpointer(proxy.dsn_for(dsn, "rt18_exit"), schema=schema, enforce_user_isolation=False,
                        pool_config={"command_timeout": 60})
    cp.setup()
g = StateGraph(AgentState)
g.add_node("model", model)
g.add_node("tools", ToolNode([slow]))
g.add_edge(START, "model")
g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
g.add_edge("tools", "model")
app = g.compile(checkpointer=cp)
try:
    tt = os.environ.get("RT_TOOL_TIMEOUT", "0.3")
    cfg = {"thread_id": "t", "user_id": "u", **({} if tt == "none" else {"tool_timeout": float(tt)})}
    data = {} if os.environ.get("RT_ACTION") == "resume" else {"messages": [Message.text_message("go")]}
    app.invoke(data, cfg)
except BaseException as exc:  # noqa: BLE001
    print("RAISED", type(exc).__name__, flush=True)
if proxy is not None:
    proxy.freeze()
print("RETURNED", time.monotonic(), flush=True)
