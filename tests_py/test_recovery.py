"""Automatic recovery (``app.arecover()``, ``compile(recover_on_start=...)``, ``tenxgraph
recover``): runs killed mid-tool-node with SIGKILL are finished by a recovering worker, each
thread by exactly one worker, tools whose ledger row committed never run again; paused,
finished and failed threads are left alone. Real processes, real SQLite and PostgreSQL; side
effects counted in a file outside the processes (``EffectCounter``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.cli import views
from tenxgraph.testing import CrashKit, EffectCounter
from tenxgraph.testing.crash import child_env
from tests_py.crash_agents.lease_agent import DONE, open_db

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "tests_py" / "crash_agents" / "recovery_agent.py"
TARGET = "tests_py.crash_agents.recovery_agent:build"
TOOLS = ("lookup_order", "charge_card", "send_receipt")
# Three runs killed inside the tool node at different points: after a result committed to the
# ledger, and after a tool returned but before its result was recorded.
KILLS = {
    "crash-0": "after_record:charge_card=kill",
    "crash-1": "after_tool:send_receipt=kill",
    "crash-2": "after_record:lookup_order=kill",
}


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return sqlite_db if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


def _order(thread: str) -> str:
    return thread.rsplit("-", 1)[-1]


def _kill_runs(crash_kit: CrashKit, db: str, kills: dict[str, str]) -> dict[str, set[str]]:
    """Kills one run per thread mid-tool-node; returns, per thread, the tools whose ledger row
    had committed when the process died."""
    committed: dict[str, set[str]] = {}
    for thread, failpoints in kills.items():
        res = crash_kit.run_until_crash(TARGET, thread, failpoints=failpoints, db=db,
                                        input=f"charge order {_order(thread)}")
        assert res.killed, (thread, res.returncode, res.stderr[-2000:])
    cp = open_db(db)
    for thread in kills:
        state = cp.get_state({"thread_id": thread})
        assert str(state.execution_meta.status) == "running", (thread, state.execution_meta)
        rows = asyncio.run(views.ledger_rows(cp, thread))
        committed[thread] = {r.tool for r in rows if r.status == "completed" and r.tool}
    return committed


def _effects_by_order(effects: EffectCounter) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for e in effects.all():
        per = out.setdefault(str(e.data["order_id"]), {})
        per[e.name] = per.get(e.name, 0) + 1
    return out


def _assert_finished_once(db: str, effects: EffectCounter, committed: dict[str, set[str]]) -> None:
    cp = open_db(db)
    counts = _effects_by_order(effects)
    for thread, done_before in committed.items():
        state = cp.get_state({"thread_id": thread})
        assert str(state.execution_meta.status) == "completed", (thread, state.execution_meta)
        assert state.context[-1].text() == DONE, thread
        rows = asyncio.run(views.ledger_rows(cp, thread))
        assert sorted(r.tool for r in rows if r.status == "completed") == sorted(TOOLS), (thread, rows)
        ran = counts[_order(thread)]
        for tool in TOOLS:
            if tool in done_before:
                assert ran.get(tool) == 1, (thread, tool, ran)  # recorded before the kill: never again
            else:
                assert 1 <= ran.get(tool, 0) <= 2, (thread, tool, ran)  # at least once


def _spawn_worker(db: str, barrier: Path, index: int, workers: int, effects: EffectCounter,
                  concurrency: int = 2, **env: str) -> subprocess.Popen[str]:
    full = child_env(env={"TENXGRAPH_EFFECTS": str(effects.path), **env})
    return subprocess.Popen([sys.executable, str(AGENT), "worker", db, str(barrier), str(index), str(workers),
                             str(concurrency)], env=full, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _report(p: subprocess.Popen[str], timeout: float = 180) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-4000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


# --------------------------------------------------------------------------- real processes


def _untouchable_threads(db: str) -> dict[str, tuple[str, int]]:
    """A completed, a paused (interrupt_before) and a failed thread in the same store, with
    their status and version: recovery must leave them exactly as they are."""
    from tests_py.crash_agents.recovery_agent import build

    cp = open_db(db)
    build(cp).invoke({"messages": [Message.text_message("charge order 90")]}, {"thread_id": "done-90"})
    build(cp, interrupt_before=["tools"]).invoke({"messages": [Message.text_message("charge order 91")]},
                                                  {"thread_id": "paused-91"})

    async def broken(state: AgentState) -> Message:
        raise RuntimeError("model down")

    g = StateGraph(AgentState)
    g.add_node("model", broken)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    with pytest.raises(Exception, match="model down"):
        g.compile(checkpointer=cp).invoke({"messages": [Message.text_message("x")]}, {"thread_id": "failed-92"})
    out = _versions(db, ["done-90", "paused-91", "failed-92"])
    assert [s for s, _ in out.values()] == ["completed", "interrupted_before", "error"], out
    return out


def _versions(db: str, threads: list[str]) -> dict[str, tuple[str, int]]:
    cp = open_db(db)
    out = {}
    for thread in threads:
        cfg: dict[str, Any] = {"thread_id": thread}
        state = cp.get_state(cfg)
        out[thread] = (str(state.execution_meta.status), int(cfg["_checkpoint_version"]))
    return out


def test_a_recovering_worker_finishes_three_killed_runs(crash_kit: CrashKit, db: str, effects: EffectCounter,
                                                        tmp_path: Path) -> None:
    """Three runs SIGKILLed mid-tool-node; a worker started with recover_on_start finishes all
    three; every tool whose ledger row committed ran exactly once; paused, completed and failed
    threads are untouched."""
    untouchable = _untouchable_threads(db)
    effects.clear()
    committed = _kill_runs(crash_kit, db, KILLS)
    assert committed["crash-0"] >= {"charge_card"} and committed["crash-2"] >= {"lookup_order"}, committed
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    out = _report(_spawn_worker(db, barrier, 0, 1, effects))
    report = out["report"]
    assert sorted(r["thread_id"] for r in report["resumed"]) == sorted(KILLS), report
    assert {r["status"] for r in report["resumed"]} == {"completed"}, report
    assert report["skipped"] == [] and report["failed"] == [], report
    _assert_finished_once(db, effects, committed)
    assert _versions(db, list(untouchable)) == untouchable
    assert not set(_effects_by_order(effects)) & {"90", "91", "92"}, effects.all()


def test_two_recovering_workers_resume_each_thread_exactly_once(crash_kit: CrashKit, db: str,
                                                                 effects: EffectCounter, tmp_path: Path) -> None:
    """Six killed runs; two worker processes start recovering at the same moment (file
    barrier), with model calls slowed so their passes overlap: the lease lets exactly one of
    them resume each thread; the other reports it skipped, and nothing runs twice."""
    kills = {f"crash-{i}": ("after_record:charge_card=kill" if i % 2 == 0 else "after_tool:send_receipt=kill")
             for i in range(6)}
    committed = _kill_runs(crash_kit, db, kills)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    workers = [_spawn_worker(db, barrier, i, 2, effects, RECOVERY_MODEL_SLEEP="0.5") for i in range(2)]
    reports = [_report(w)["report"] for w in workers]
    resumed = [r["thread_id"] for rep in reports for r in rep["resumed"]]
    assert sorted(resumed) == sorted(kills), reports  # each thread once, in total
    for rep in reports:
        assert rep["failed"] == [], rep
        mine = {r["thread_id"] for r in rep["resumed"]}
        skipped = {s["thread_id"] for s in rep["skipped"]}
        assert not mine & skipped and skipped <= set(kills), rep
        assert {s["reason"] for s in rep["skipped"]} <= {"busy", "not_running"}, rep
    # The passes overlapped (each resume takes >= 0.5 s, three rounds per worker): the workers
    # met on some thread, and the one that lost the lease reported it instead of running it.
    assert sum(len(rep["skipped"]) for rep in reports) >= 1, reports
    _assert_finished_once(db, effects, committed)
