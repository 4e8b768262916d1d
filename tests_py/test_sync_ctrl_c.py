"""Ctrl-C reaches `invoke()` called inside a running event loop (helper red-team, session 29: the
worker-thread path waited in its pool's exit until the run ended by itself, so a hung tool held
the Ctrl-C for its whole tool_timeout, and the run was never cancelled)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = r'''
import asyncio, json, signal, sys, time
# Ctrl-C as at a terminal: a child inherits an ignored SIGINT from a test worker that ignores it
# (some tests of the suite install handlers), and Python then never raises KeyboardInterrupt.
signal.signal(signal.SIGINT, signal.default_int_handler)
from tenxgraph import END, START, AgentState, Message, StateGraph, ToolNode
from tenxgraph.storage.checkpointer import SqliteCheckpointer

started = sys.argv[1]

async def slow() -> str:
    """Hangs."""
    open(started, "w").write("started")
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        print("tool cancelled", flush=True)
        raise
    return "never"

async def model(state: AgentState) -> Message:
    if state.context[-1].role == "user":
        m = Message.text_message("calling", role="assistant")
        m.tools_calls = [{"id": "c0", "type": "function", "function": {"name": "slow", "arguments": "{}"}}]
        return m
    return Message.text_message("done", role="assistant")

g = StateGraph(AgentState)
g.add_node("model", model)
g.add_node("tools", ToolNode([slow]))
g.add_edge(START, "model")
g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
g.add_edge("tools", "model")
app = g.compile(checkpointer=SqliteCheckpointer(sys.argv[2]))

async def main() -> None:
    app.invoke({"messages": [Message.text_message("go")]}, {"thread_id": "t"})  # inside a running loop

t0 = time.monotonic()
try:
    asyncio.run(main())
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - t0:.1f}s", flush=True)
'''


def test_ctrl_c_cancels_an_invoke_made_inside_a_running_loop(tmp_path: Path) -> None:
    started = tmp_path / "started"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(started), str(tmp_path / "cp.db")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGINT)  # one Ctrl-C
        out, err = child.communicate(timeout=60)  # before: the tool's whole 120 s
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert "tool cancelled" in out, (out, err)
    assert "interrupted after" in out, (out, err)
