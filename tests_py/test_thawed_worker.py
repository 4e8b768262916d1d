"""A worker frozen past its lease, thawed after another worker finished its turn (helper red-team,
session 32): it started the sibling calls of its tool node, which the new holder had already run
and recorded, before its first write was refused. Real processes, a real SIGSTOP / SIGCONT.

Worker A runs a node of five calls (three async, two sync) with ``lease_ttl=2`` and freezes itself
in the first line of the first call. Worker B resumes the thread with ``on_busy="wait"``, gets
the lease once it ran out, and finishes the turn. A is thawed: the call it was inside goes on (the
documented window a call in flight has, which its ``idempotency_key`` covers), but no call that
had not started may start, and A's run ends fenced.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

AGENT = '''
import asyncio, json, os, signal, sys, time
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer

EFFECTS = os.environ["EFFECTS"]


def effect(name):
    with open(EFFECTS, "a") as f:
        f.write(f"{os.getpid()} {name}\\n")
        f.flush()
        os.fsync(f.fileno())


async def first(idempotency_key: str) -> str:
    """The first call."""
    if os.environ.get("FREEZE") == "1":
        os.kill(os.getpid(), signal.SIGSTOP)
    await asyncio.sleep(0.05)
    effect("first")
    return "first done"


async def second(idempotency_key: str) -> str:
    """An async sibling."""
    effect("second")
    return "second done"


async def third(idempotency_key: str) -> str:
    """An async sibling."""
    effect("third")
    return "third done"


def fourth(idempotency_key: str) -> str:
    """A sync sibling."""
    effect("fourth")
    return "fourth done"


def fifth(idempotency_key: str) -> str:
    """A sync sibling."""
    effect("fifth")
    return "fifth done"


NAMES = ["first", "second", "third", "fourth", "fifth"]


def model(state: AgentState) -> Message:
    if state.context[-1].role == "tool":
        return Message.text_message("all done", role="assistant")
    calls = [{"id": f"c_{n}", "type": "function", "function": {"name": n, "arguments": "{}"}} for n in NAMES]
    return Message(role="assistant", content=[], tools_calls=calls)


dsn = os.environ.get("PG_DSN")
cp = PgCheckpointer(dsn, schema=os.environ["SCHEMA"]) if dsn else SqliteCheckpointer(os.environ["DB"])
g = StateGraph(AgentState)
g.add_node("model", model)
g.add_node("tools", ToolNode([first, second, third, fourth, fifth]))
g.add_edge(START, "model")
g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END)
g.add_edge("tools", "model")
app = g.compile(checkpointer=cp)
config = {"thread_id": "thawed", "lease_ttl": 2, "on_busy": "wait", "busy_timeout": 60}
data = {"messages": [Message.text_message("go")]} if sys.argv[1] == "start" else {}
try:
    out = app.invoke(data, config)
    print("RESULT", out["messages"][-1].text())
except Exception as e:
    print("ERROR", type(e).__name__, getattr(e, "error_code", None))
'''


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_thawed_worker_starts_no_call_of_a_node_another_worker_finished(tmp_path: Path, backend: str) -> None:
    dsn = os.environ.get("TENXGRAPH_TEST_PG_DSN")
    if backend == "postgres" and not dsn:
        pytest.skip("needs TENXGRAPH_TEST_PG_DSN")
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    effects = tmp_path / "effects.log"
    env = dict(os.environ, EFFECTS=str(effects), DB=str(tmp_path / "a.db"), SCHEMA=f"thaw_{os.getpid()}_{time.time_ns()}")
    env.pop("PG_DSN", None)
    if backend == "postgres":
        env["PG_DSN"] = dsn or ""
    a = subprocess.Popen([sys.executable, str(script), "start"], env=dict(env, FREEZE="1"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _stopped(a.pid):  # A froze itself inside its first call
            assert a.poll() is None and time.monotonic() < deadline, a.communicate()
            time.sleep(0.02)
        b = subprocess.run([sys.executable, str(script), "resume"], env=env, capture_output=True, text=True,
                           timeout=180)
        assert "RESULT all done" in b.stdout, (b.stdout, b.stderr[-3000:])
        os.kill(a.pid, signal.SIGCONT)
        a_out, a_err = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait()
    assert "ERROR" in a_out and "STORAGE_FENCED_001" in a_out, (a_out, a_err[-3000:])
    fired = [line.split() for line in effects.read_text().splitlines()]
    by_a = sorted(name for pid, name in fired if int(pid) == a.pid)
    by_b = sorted(name for pid, name in fired if int(pid) != a.pid)
    assert by_b == ["fifth", "first", "fourth", "second", "third"], fired
    # The call A was inside when it froze may finish (its idempotency_key covers it); no other.
    assert by_a in ([], ["first"]), fired
