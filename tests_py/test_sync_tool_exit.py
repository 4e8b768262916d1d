"""Sync (`def`) tool threads at interpreter exit, and a sync tool that exits.

No deadline can end a thread, so a sync tool cut off by `tool_timeout` runs on. At exit the
process waits for it, so a tool mid-effect finishes and its late result is recorded in the ledger
(a restart answers from there instead of running it again), but only for
`TENXGRAPH_SYNC_TOOL_EXIT_GRACE` seconds: a tool blocked for ever no longer keeps the process
from exiting (it did: the thread was not a daemon). Real child processes
(tests_py/redteam/sync_exit_child.py) on SQLite and on a Postgres whose connections go dark.

Promises defended: nothing hangs (a process whose late records cannot be written still exits
within the grace), no finished tool fires again (every late result is recorded at exit and a
resume answers from it), every bad input gets a model-readable tool error (a tool's sys.exit)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests_py.redteam.tool_history import call, turn
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tests_py.redteam.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests_py" / "redteam"


def spawn(tmp: Path, mode: str, db: str, n: int, seconds: float, grace: str) -> subprocess.Popen[str]:
    env = dict(os.environ, TENXGRAPH_SYNC_TOOL_EXIT_GRACE=grace, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(HERE / "sync_exit_child.py"), mode, db, str(tmp), str(n), str(seconds)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))


def ledger_rows(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        table = next(t for t in tables if "ledger" in t or "tool_exec" in t)
        return con.execute(f"select count(*) from {table}").fetchone()[0]
    finally:
        con.close()


def test_many_sync_tools_cut_off_are_all_recorded_at_exit(tmp_path: Path) -> None:
    """8 parallel sync calls cut off by tool_timeout, each 1.5 s: exit waits for them (one
    grace for all) and every late result is in the ledger."""
    db = tmp_path / "cp.db"
    p = spawn(tmp_path, "sqlite", str(db), 8, 1.5, "20")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    assert "RETURNED" in out, err[-2000:]
    assert len(list(tmp_path.glob("done-*"))) == 8, err[-2000:]
    assert err.count("sync_tool_abandoned") == 0 and "abandoned" not in err, err[-2000:]
    assert ledger_rows(db) >= 8, err[-2000:]


def test_a_late_record_on_a_frozen_postgres_does_not_hold_the_exit(tmp_path: Path, tenx_postgres) -> None:
    """Promise: nothing hangs. The tool finishes within the grace, but its late ledger write goes
    to a Postgres that stopped answering (all open connections blackholed): the process still
    exits within the grace (+ slack), naming what it abandons."""
    schema = f"rt_{uuid.uuid4().hex[:10]}"
    p = spawn(tmp_path, "pgfreeze", f"{tenx_postgres.dsn}|{schema}", 1, 0.8, "3")
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the process did not exit within 60 s: {err[-1500:]}")
    assert "RETURNED" in out, err[-2000:]
    assert p.returncode == 0, (p.returncode, err[-2000:])
    assert "abandoned" in err, err[-2000:]


SYS_EXIT_CODE = 3


def test_a_sync_tool_that_calls_sys_exit_gets_a_tool_error_not_a_wedged_thread(tmp_path: Path) -> None:
    """Promise: every bad input gets a model-readable tool error; no thread wedged. A sync tool
    wrapping a CLI (argparse / click standalone mode) calls sys.exit on the model's bad
    arguments, in the tool's own worker thread, where Python's SystemExit only ends that thread.
    tenxgraph re-raises it on the caller: invoke raises SystemExit (the process exits), the thread
    is left `running` at the tool node, `{}` exits again, a new turn is STORAGE_BUSY_001: for ever."""
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    def cli(argv: str) -> str:
        """Runs a CLI."""
        import argparse
        parser = argparse.ArgumentParser(prog="cli")
        parser.add_argument("--count", type=int, required=True)
        parser.parse_args(argv.split())  # argparse: sys.exit(2) on a missing required option
        return "ran"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            m = Message.text_message("c", role="assistant")
            m.tools_calls = [call("c1", "cli", argv="--bogus")]
            return m
        return Message.text_message("ok", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([cli]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    cp = SqliteCheckpointer(tmp_path / "cp.db")
    app = g.compile(checkpointer=cp)
    cfg = {"thread_id": "t", "user_id": "u"}
    try:
        app.invoke(turn("go"), cfg)
    except SystemExit as exc:
        state = asyncio.run(cp.aget_state(cfg))
        pytest.fail(f"invoke raised SystemExit({exc.code}); thread left {state.execution_meta.status.value} at "
                    f"{state.execution_meta.current_node}")
    state = asyncio.run(cp.aget_state(cfg))
    assert state.execution_meta.status.value == "completed"
    tool_msgs = [m for m in state.context if m.role == "tool"]
    assert len(tool_msgs) == 1 and "exit" in tool_msgs[0].text().lower(), tool_msgs


def test_ctrl_c_while_a_sync_tool_runs_records_it_at_exit_and_a_resume_does_not_fire_it_again(tmp_path: Path) -> None:
    """Promise: a tool that finished is never fired again. SIGINT (Ctrl-C; the usual way a
    worker is told to stop) while `invoke` waits for a sync tool: the run is cancelled, the
    process exits through atexit, which waits for the tool, records its late result; a `{}` in a
    fresh process answers it from the ledger."""
    db = tmp_path / "cp.db"
    env = dict(os.environ, TENXGRAPH_SYNC_TOOL_EXIT_GRACE="20", PYTHONPATH=str(ROOT), RT_TOOL_TIMEOUT="none")
    p = subprocess.Popen([sys.executable, str(HERE / "sync_exit_child.py"), "sqlite", str(db), str(tmp_path), "1", "1.5"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    wait_until("the tool started", lambda: list(tmp_path.glob("started-*")) or p.poll() is not None, timeout=60)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert len(list(tmp_path.glob("done-*"))) == 1, ("the tool did not finish at exit", err[-1500:])
    r = subprocess.run([sys.executable, str(HERE / "sync_exit_child.py"), "sqlite", str(db), str(tmp_path), "1", "0.1"],
                       env=dict(env, RT_ACTION="resume"), capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert "RETURNED" in r.stdout, r.stderr[-1500:]
    done = list(tmp_path.glob("done-*"))
    assert len(done) == 1, ("the finished tool fired again on resume", [d.name for d in done], err[-800:])


def test_a_sync_tool_blocked_for_ever_does_not_keep_the_process_from_exiting(tmp_path: Path) -> None:
    """A sync tool in time.sleep(3600) (a C call no deadline interrupts), cut off by tool_timeout:
    invoke returns, and the process exits after the 1 s grace, naming the thread it abandons (it
    waited for ever: the tool's thread was not a daemon)."""
    p = spawn(tmp_path, "sqlite", str(tmp_path / "cp.db"), 1, 3600, "1")
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail("the process did not exit 30 s after its main function returned, with a 1 s exit grace")
    assert "RETURNED" in out and "RAISED" not in out, (out, err[-2000:])
    assert p.returncode == 0, err[-2000:]
    assert "tenxgraph-tool-slow" in err and "abandoned" in err, err[-2000:]
    assert not list(tmp_path.glob("done-*"))


def test_a_sync_tool_that_finishes_within_the_grace_is_waited_for_and_recorded(tmp_path: Path) -> None:
    """The run stops waiting after 0.3 s (the model is told the tool timed out); the tool finishes
    2 s in, within the exit grace: the process waits, the effect happens once, and its late result
    is the call's ledger row, so nothing runs it again."""
    db = tmp_path / "cp.db"
    p = spawn(tmp_path, "sqlite", str(db), 1, 2, "60")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "RETURNED" in out, err[-2000:]
    assert len(list(tmp_path.glob("done-*"))) == 1
    with sqlite3.connect(db) as con:
        rows = [json.loads(r[0]) for r in con.execute("SELECT result FROM tool_executions")]
    assert [(r.get("__kind__"), r["value"]["content"][0]["output"]) for r in rows] == [("message", "finished 0")], rows
    assert "abandoned" not in err, err[-2000:]


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
