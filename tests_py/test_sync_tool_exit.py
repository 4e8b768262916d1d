"""A process whose sync (`def`) tool is still running when the program ends.

No deadline can end a thread, so a sync tool cut off by `tool_timeout` runs on. At exit the
process waits for it, so a tool mid-effect finishes and its late result is recorded in the ledger
(a restart answers from there instead of running it again), but only for
`TENXGRAPH_SYNC_TOOL_EXIT_GRACE` seconds: a tool blocked for ever no longer keeps the process
from exiting (it did: the thread was not a daemon). Real child processes on SQLite.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CHILD = textwrap.dedent('''
    import json, logging, sys, time
    from pathlib import Path
    from tenxgraph import END, START, AgentState, Message, StateGraph
    from tenxgraph.core.graph.tool_node import ToolNode
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(message)s")
    db, effect, seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])

    def slow(x: int) -> str:
        """Takes its time (a C call no deadline interrupts)."""
        time.sleep(seconds)
        effect.write_text("done")
        return "finished late"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("calling", role="assistant", message_id="a-1")
            msg.tools_calls = [{"id": "call-1", "type": "function",
                                "function": {"name": "slow", "arguments": json.dumps({"x": 1})}}]
            return msg
        return Message.text_message("ok", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([slow]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=SqliteCheckpointer(db))
    r = app.invoke({"messages": [Message.text_message("go")]}, {"thread_id": "t", "user_id": "u", "tool_timeout": 0.5}, "full")
    print("RETURNED", r["state"].execution_meta.status.value, flush=True)
''')


def run_child(tmp_path: Path, seconds: float, grace: str | None) -> tuple[subprocess.Popen[str], float]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ}
    env.pop("TENXGRAPH_SYNC_TOOL_EXIT_GRACE", None)
    if grace is not None:
        env["TENXGRAPH_SYNC_TOOL_EXIT_GRACE"] = grace
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "cp.db"), str(tmp_path / "effect"), str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # The moment its main function returned: its first line of output.
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("RETURNED completed"), (line, proc.stderr.read() if proc.stderr else "")
    return proc, time.monotonic()


def ledger_results(db: Path) -> list[dict]:
    with sqlite3.connect(db) as conn:
        return [json.loads(r[0]) for r in conn.execute("SELECT result FROM tool_executions")]


def test_a_sync_tool_blocked_for_ever_does_not_keep_the_process_from_exiting(tmp_path: Path) -> None:
    proc, returned = run_child(tmp_path, 3600, "1")
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the process did not exit 30 s after its main function returned, with a 1 s exit grace")
    took = time.monotonic() - returned
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0, err
    assert took < 25, took
    assert "tenxgraph-tool-slow" in err and "abandoned" in err, err
    assert not (tmp_path / "effect").exists()


def test_a_sync_tool_that_finishes_within_the_grace_is_waited_for_and_recorded(tmp_path: Path) -> None:
    """The run stopped waiting after 0.5 s (the model was told the tool timed out); the tool
    finishes 3 s in, before the exit grace ends: the process waits, the effect happens once, and
    its late result is in the ledger, so nothing runs it again."""
    proc, _ = run_child(tmp_path, 3, "60")
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the process did not exit after its sync tool finished")
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0, err
    assert (tmp_path / "effect").read_text() == "done"
    kinds = [(r.get("__kind__"), r.get("value", {}).get("content", [{}])[0].get("output")) for r in ledger_results(tmp_path / "cp.db")]
    assert kinds == [("message", "finished late")], kinds
    assert "abandoned" not in err, err


def test_a_bad_exit_grace_warns_and_uses_the_default() -> None:
    from tenxgraph import _sync_calls

    for bad in ("soon", "-1", "nan", "inf"):
        os.environ["TENXGRAPH_SYNC_TOOL_EXIT_GRACE"] = bad
        try:
            assert _sync_calls.exit_grace() == _sync_calls.DEFAULT_EXIT_GRACE, bad
        finally:
            del os.environ["TENXGRAPH_SYNC_TOOL_EXIT_GRACE"]
    os.environ["TENXGRAPH_SYNC_TOOL_EXIT_GRACE"] = "0"
    try:
        assert _sync_calls.exit_grace() == 0.0
    finally:
        del os.environ["TENXGRAPH_SYNC_TOOL_EXIT_GRACE"]
