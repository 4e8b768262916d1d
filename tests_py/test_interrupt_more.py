"""interrupt(): three parallel tools, a process killed while waiting, static pauses, bad input."""

from __future__ import annotations

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
from tenxgraph.core.exceptions import NodeError
from tenxgraph.utils import interrupt, pending_interrupt
from tests_py.tool_graphs import call, tool_graph, tool_texts

HITL = Path(__file__).parent / "crash_agents" / "hitl_agent.py"


def user(text: str) -> Message:
    return Message.text_message(text)


def counter_file(path: Path):
    def bump(name: str) -> None:
        with open(path, "a") as f:
            f.write(name + "\n")

    return bump


@pytest.mark.asyncio
async def test_three_parallel_tools_one_asks_twice(checkpointer, make_thread, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    bump = counter_file(log)

    async def lookup() -> str:
        bump("lookup")
        return "looked up"

    def notify() -> str:
        bump("notify")
        return "notified"

    async def refund(amount: float) -> str:
        bump("refund-start")
        first = interrupt({"amount": amount}, message="approve?")
        second = interrupt("which account?")
        bump("refund-done")
        return f"{first}/{second}"

    turn = [call("c1", "lookup"), call("c2", "notify"), call("c3", "refund", {"amount": 9.5})]
    app = tool_graph(AgentState, [lookup, notify, refund], [turn], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    r = await app.ainvoke({"messages": [user("go")]}, cfg, "full")
    assert pending_interrupt(r["state"]).key == "tool:c3:0"
    r = await app.ainvoke({"resume": "yes"}, cfg, "full")
    assert pending_interrupt(r["state"]).key == "tool:c3:1"
    r = await app.ainvoke({"resume": "savings"}, cfg, "full")
    calls = log.read_text().split()
    assert calls.count("lookup") == 1 and calls.count("notify") == 1, calls
    assert calls.count("refund-start") == 3 and calls.count("refund-done") == 1, calls
    assert tool_texts(r["messages"])["c3"] == "yes/savings"
    assert r["messages"][-1].text() == "done"


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "hitl.db") if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


def test_process_killed_while_waiting_at_an_interrupt_resumes_elsewhere(tmp_path: Path, db: str) -> None:
    effects = tmp_path / "effects.log"
    env = dict(os.environ, TENX_EFFECTS=str(effects))
    child = subprocess.Popen([sys.executable, str(HITL), "start", db, "t-hitl"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (effects.exists() and "paused:" in effects.read_text()):
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        child.kill()
        child.wait(timeout=10)
    bad = subprocess.run([sys.executable, str(HITL), '{"nope": 1}', db, "t-hitl"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "missing required field 'ok'" in bad.stderr
    ok = subprocess.run([sys.executable, str(HITL), '{"ok": true}', db, "t-hitl"], env=env,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])[-1] == "approved=True"
    log = effects.read_text().split()
    assert log.count("start:approve") == 2 and log.count("decided:True") == 1, log


def _abc(**compile_kw: Any):
    g = StateGraph()
    for name in ("a", "b", "c"):
        g.add_node(name, (lambda n: (lambda state: n))(name))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile(**compile_kw)


@pytest.mark.asyncio
async def test_static_pauses_resume_with_empty_input(checkpointer, make_thread) -> None:
    app = _abc(checkpointer=checkpointer, interrupt_before=["b"], interrupt_after=["c"])
    cfg = {"thread_id": make_thread()}
    r = await app.ainvoke({"messages": [user("x")]}, cfg, "full")
    meta = r["state"].execution_meta
    assert (meta.status, meta.current_node, meta.interrupt_reason) == ("interrupted_before", "b", "interrupt_before: b")
    assert [m.text() for m in r["messages"]] == ["x", "a"]
    r = await app.ainvoke({}, cfg, "full")
    meta = r["state"].execution_meta
    assert (meta.status, meta.interrupted_node) == ("interrupted_after", "c")
    assert [m.text() for m in r["messages"]][-2:] == ["b", "c"]
    r = await app.ainvoke({}, cfg, "full")
    assert r["state"].execution_meta.status == "completed"
    stored = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in stored.context] == ["x", "a", "b", "c"]


@pytest.mark.asyncio
async def test_interrupt_value_must_be_json(checkpointer, make_thread) -> None:
    class Opaque:
        pass

    async def ask(state: AgentState) -> str:
        return str(interrupt(Opaque()))

    g = StateGraph()
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    with pytest.raises(NodeError) as e:
        await app.ainvoke({"messages": [user("x")]}, cfg)
    assert isinstance(e.value.__cause__, TypeError) and "JSON-serialisable" in str(e.value.__cause__)
    state = await checkpointer.aget_state(dict(cfg))
    assert pending_interrupt(state) is None and state.execution_meta.status == "error"


@pytest.mark.asyncio
async def test_wrong_resume_shape_is_rejected_and_nothing_is_written(checkpointer, make_thread) -> None:
    async def ask(state: AgentState) -> str:
        answer = interrupt("ok?", response_schema={
            "type": "object", "required": ["approved"], "properties": {"approved": {"type": "boolean"}}})
        return f"approved={answer['approved']}"

    g = StateGraph()
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("x")]}, cfg)
    before = await checkpointer.aget_state(probe := dict(cfg))
    for bad, match in [("yes", "type 'object'"), ({}, "missing required field 'approved'"),
                       ({"approved": "yes"}, r"resume\.approved must be of type 'boolean'"), ({"approved": True, "x": object()}, "JSON-serialisable"),
                       # NaN and infinities: json.dumps takes them, JSON cannot hold them; until session 23 the
                       # refusal came from the state's commit, after the thread had gone to status error.
                       ({"approved": True, "x": float("nan")}, "JSON-serialisable"),
                       ({"approved": True, "x": [float("-inf")]}, "JSON-serialisable")]:
        with pytest.raises((ValueError, TypeError), match=match):
            await app.ainvoke({"resume": bad}, cfg)
    after = await checkpointer.aget_state(probe2 := dict(cfg))
    assert probe2["_checkpoint_version"] == probe["_checkpoint_version"], "nothing persisted"
    assert pending_interrupt(after).id == pending_interrupt(before).id
    r = await app.ainvoke({"resume": {"approved": True}}, cfg)
    assert r["messages"][-1].text() == "approved=True"


@pytest.mark.asyncio
async def test_a_new_message_at_a_pause_inside_a_tool_is_told_to_answer_the_question(checkpointer, make_thread) -> None:
    """As 10xGraph answers it, and as a pause in any other node is answered: ValueError "Thread is
    paused at interrupt ... Resume it with {'resume': value}", nothing written. It was
    ThreadBusyError "resume it with ainvoke({}, config)", whose advice led to that same ValueError
    (red-team, session 35)."""

    async def approve() -> str:
        return f"answer={interrupt({'q': 1}, message='ok?')}"

    app = tool_graph(AgentState, [approve], [[call("c0", "approve")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    r = await app.ainvoke({"messages": [user("go")]}, cfg, "full")
    paused = pending_interrupt(r["state"])
    before = await checkpointer.aget_state(probe := dict(cfg))
    with pytest.raises(ValueError, match=rf"paused at interrupt '{paused.id}' in node 'tools'\. Resume it with"):
        await app.ainvoke({"messages": [user("never mind")]}, cfg)
    after = await checkpointer.aget_state(probe2 := dict(cfg))
    assert probe2["_checkpoint_version"] == probe["_checkpoint_version"], "nothing persisted"
    assert [m.text() for m in after.context] == [m.text() for m in before.context]
    # With the answer, the messages are refused too, with what to do (nothing written): they
    # would land between the call and its result.
    with pytest.raises(ValueError, match=r"inside tool node 'tools': new messages cannot come with the answer"):
        await app.ainvoke({"resume": "yes", "messages": [user("and also")]}, cfg)
    after = await checkpointer.aget_state(probe3 := dict(cfg))
    assert probe3["_checkpoint_version"] == probe["_checkpoint_version"], "nothing persisted"
    r = await app.ainvoke({"resume": "yes"}, cfg)
    assert tool_texts(r["messages"])["c0"] == "answer=yes"
