"""Leases under a hostile schedule (session 7 red-team pass): the input taken with the lease in
one transaction (``put_input_leased``) by two workers at once in one process, and a frozen lease
holder (SIGSTOP) whose thread is taken over by a second process that is then SIGKILLed, a third
finishing the run, and the frozen one thawed last. Real processes, SQLite and PostgreSQL; side
effects counted outside the processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.testing import EffectCounter
from tenxgraph.testing.crash import child_env
from tests_py.crash_agents.lease_agent import DONE, open_db

AGENT = Path(__file__).resolve().parent / "crash_agents" / "lease_agent.py"
TOOLS = ("lookup_order", "charge_card", "send_receipt")


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return sqlite_db if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


def _spawn(args: list[str], effects: EffectCounter, failpoints: str | None = None, **env: str) -> subprocess.Popen[str]:
    full_env = child_env(failpoints=failpoints, env={"TENXGRAPH_EFFECTS": str(effects.path), **env})
    return subprocess.Popen([sys.executable, str(AGENT), *args], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)


def _result(p: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-4000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_a_frozen_holder_next_to_a_crashed_taker(db: str, effects: EffectCounter, tmp_path: Path) -> None:
    """A holds a 1 s lease and is frozen in its model node. B waits, takes the thread over and is
    SIGKILLed right after its charge is recorded. C waits out B's lease and finishes the run from
    B's ledger. A is thawed last: it is fenced (LeaseLostError), writes nothing, and no tool ran
    twice; every tool ran in B (the charge and lookup) or C, never in A."""
    marker = tmp_path / "a-in-model"
    tid = "t-frozen-crash"
    a = _spawn(["run", db, tid, json.dumps({"lease_ttl": 1}), "charge order 7"], effects,
               LEASE_MODEL_SLEEP="2", LEASE_MODEL_MARKER=str(marker))
    deadline = time.monotonic() + 60
    while not marker.exists():  # polled: A's start-up on a loaded machine
        assert a.poll() is None and time.monotonic() < deadline, a.communicate()[1] if a.poll() is not None else "timeout"
        time.sleep(0.01)
    os.kill(a.pid, signal.SIGSTOP)
    try:
        wait = json.dumps({"on_busy": "wait", "busy_timeout": 30, "lease_ttl": 1})
        b = _spawn(["run", db, tid, wait], effects, failpoints=f"after_record:charge_card=kill")
        b.communicate(timeout=120)
        assert b.returncode == -signal.SIGKILL, "B was to die right after its charge was recorded"
        assert effects.count("charge_card") == 1
        c = _spawn(["run", db, tid, wait], effects)
        c_out = _result(c)
        assert c_out["outcome"] == "completed" and c_out["messages"][-1] == DONE, c_out
        cp = open_db(db)
        before = cp.get_state({"thread_id": tid})
        meta_before = before.execution_meta.model_dump()
        n_messages = len(cp.list_messages({"thread_id": tid}))
    finally:
        os.kill(a.pid, signal.SIGCONT)
    a_out = _result(a)
    assert a_out["outcome"] == "LeaseLostError/STORAGE_FENCED_001", a_out
    after = cp.get_state({"thread_id": tid})
    assert after.execution_meta.model_dump() == meta_before
    assert len(cp.list_messages({"thread_id": tid})) == n_messages
    assert [m.role for m in after.context] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    assert effects.counts() == {t: 1 for t in TOOLS}, effects.counts()
    assert a.pid not in {e.pid for e in effects.all()}
    assert {e.pid for e in effects.all() if e.name == "charge_card"} == {b.pid}


@pytest.mark.asyncio
@pytest.mark.parametrize("on_busy", ["wait", "reject"])
async def test_two_turns_on_one_thread_at_once_in_one_process(checkpointer: Any, make_thread: Any,
                                                              on_busy: str) -> None:
    """Two ``ainvoke`` of one process send a turn to the same thread together; both load it free
    and race their leased input commits. wait: both turns are stored whole, one after the other;
    reject: one turn runs and the other gets ThreadBusyError with none of its messages stored.
    Neither hangs."""
    gate = asyncio.Event()
    inside: list[str] = []

    async def model(state: AgentState) -> Message:
        text = state.context[-1].text()
        inside.append(text)
        if len(inside) == 1:
            await asyncio.wait_for(gate.wait(), timeout=60)  # hold the first turn while the other arrives
        return Message.text_message(f"reply to {text}", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread()
    cfg = {"thread_id": tid, "on_busy": on_busy, "busy_timeout": 60}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("one")]}, dict(cfg)))
    for _ in range(6000):  # polled: the first turn is inside its node (its lease is taken)
        if inside:
            break
        await asyncio.sleep(0.01)
    assert inside == ["one"]
    second = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("two")]}, dict(cfg)))
    await asyncio.sleep(0)  # let the second start; the gate then opens whatever it did
    gate.set()
    results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), timeout=120)
    state = await checkpointer.aget_state({"thread_id": tid})
    texts = [m.text() for m in state.context]
    if on_busy == "wait":
        assert not any(isinstance(r, BaseException) for r in results), results
        assert texts == ["one", "reply to one", "two", "reply to two"]
    else:
        assert texts in (["one", "reply to one"], ["one", "reply to one", "two", "reply to two"]), texts
        if len(texts) == 2:
            assert type(results[1]).__name__ == "ThreadBusyError", results
    assert str(state.execution_meta.status).endswith("completed")
