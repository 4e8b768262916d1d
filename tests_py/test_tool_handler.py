"""The replay-safe tool handler inside a run: ledger keys, replay, failures, errors, deadlines."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph import metrics
from tenxgraph.core.exceptions import NodeError, NodeTimeoutError
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tests_py.tool_graphs import call, seen_cancelled, tool_graph, tool_texts




def user(text: str) -> Message:
    return Message.text_message(text)


@pytest.mark.asyncio
async def test_parallel_calls_run_once_and_are_recorded(checkpointer, make_thread) -> None:
    counts: dict[str, int] = {}

    async def a(x: int) -> str:
        counts["a"] = counts.get("a", 0) + 1
        await asyncio.sleep(0.05)
        return f"a{x}"

    def b(y: str) -> str:  # sync: runs in a thread
        counts["b"] = counts.get("b", 0) + 1
        return f"b{y}"

    app = tool_graph(AgentState, [a, b], [[call("c1", "a", {"x": 1}), call("c2", "b", {"y": "z"})]],
                     checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    t0 = time.perf_counter()
    r = await app.ainvoke({"messages": [user("go")]}, cfg)
    assert tool_texts(r["messages"]) == {"c1": "a1", "c2": "bz"}
    assert counts == {"a": 1, "b": 1}
    assert r["messages"][-1].text() == "done"
    state = await checkpointer.aget_state(cfg)
    origin = next(m for m in state.context if m.tools_calls).message_id
    rec = await checkpointer.aget_tool_result(cfg, f"{origin}:c1")
    assert rec["__kind__"] == "message" and rec["value"]["content"][0]["output"] == "a1"
    assert time.perf_counter() - t0 < 5


@pytest.mark.asyncio
async def test_a_replayed_tool_node_answers_from_the_ledger(checkpointer, make_thread) -> None:
    """A node replayed after a crash finds its calls recorded and does not run them."""
    counts = {"charge": 0}

    async def charge(amount: int) -> str:
        counts["charge"] += 1
        return f"charged {amount}"

    app = tool_graph(AgentState, [charge], [[call("call_1", "charge", {"amount": 5})]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("pay")]}, cfg)
    assert counts["charge"] == 1
    # Re-run the tools node as a replay would: put the thread back at "tools" with the same
    # assistant message last (what the durable state holds when a crash hits mid-node).
    state = await checkpointer.aget_state(cfg)
    ask = next(m for m in state.context if m.tools_calls)
    state.context = state.context[: state.context.index(ask) + 1]
    await checkpointer.aput_state(cfg, state)
    before = metrics.snapshot()["tenxgraph.tool.replayed"]
    r = await app.ainvoke({"state": {"current_node": "tools"}}, cfg)
    assert counts["charge"] == 1, "a recorded call must not run again"
    assert tool_texts(r["messages"]) == {"call_1": "charged 5"}
    assert metrics.snapshot()["tenxgraph.tool.replayed"] == before + 1


@pytest.mark.asyncio
async def test_reused_call_id_in_a_later_turn_still_runs(checkpointer, make_thread) -> None:
    """Turn 1 charges as call_1; turn 9 refunds, also as call_1: the refund must run."""
    calls: list[str] = []

    async def charge(order_id: str) -> str:
        calls.append("charge")
        return f"charged {order_id}"

    async def refund(order_id: str) -> str:
        calls.append("refund")
        return f"refunded {order_id}"

    turns = [[call("call_1", "charge", {"order_id": "4821"})]] + [[]] * 7 + [[call("call_1", "refund", {"order_id": "4821"})]]
    app = tool_graph(AgentState, [charge, refund], turns, checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    for i in range(9):
        r = await app.ainvoke({"messages": [user(f"turn {i + 1}")]}, cfg)
    assert calls == ["charge", "refund"]
    assert tool_texts(r["messages"]) == {"call_1": "refunded 4821"}


@pytest.mark.asyncio
async def test_calls_without_a_message_id_or_call_id_run_unrecorded(checkpointer, make_thread) -> None:
    counts = {"n": 0}

    async def t() -> str:
        counts["n"] += 1
        return "ok"

    app = tool_graph(AgentState, [t], [[{"type": "function", "function": {"name": "t", "arguments": "{}"}}]],
                     checkpointer=checkpointer)
    r = await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread()})
    assert counts["n"] == 1
    assert tool_texts(r["messages"]) == {"": "ok"}


@pytest.mark.asyncio
async def test_bad_calls_become_tool_errors_and_the_node_completes(checkpointer, make_thread) -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<Opaque thing>"

    async def boom() -> str:
        raise RuntimeError("card declined")

    async def weird() -> Any:
        return Opaque()

    async def ok(n: int) -> str:
        return f"ok {n}"

    turn = [
        call("c1", "ok", raw_args="{not json"),
        call("c2", "nope", {}),
        call("c3", "boom", {}),
        call("c4", "weird", {}),
        call("c5", "ok", {"n": 2}),
    ]
    app = tool_graph(AgentState, [boom, weird, ok], [turn], checkpointer=checkpointer)
    r = await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread()})
    out = tool_texts(r["messages"])
    assert out["c1"].startswith("Invalid tool arguments (not valid JSON):")
    assert out["c2"] == "Tool 'nope' not found."
    assert "card declined" in out["c3"]
    assert out["c4"] == "<Opaque thing>"
    assert out["c5"] == "ok 2"
    assert r["messages"][-1].text() == "done"  # the model saw the errors and answered


@pytest.mark.asyncio
async def test_malformed_arguments_are_not_recorded(tmp_path: Path, make_thread) -> None:
    cp = SqliteCheckpointer(tmp_path / "x.db")

    async def ok(n: int) -> str:
        return "ok"

    app = tool_graph(AgentState, [ok], [[call("c1", "ok", raw_args="[[")]], checkpointer=cp)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("x")]}, cfg)
    with sqlite3.connect(tmp_path / "x.db") as c:
        assert c.execute("SELECT count(*) FROM tool_executions WHERE json_extract(result, '$.__kind__') IS NOT 'started'").fetchone()[0] == 0


def counting_app(db: Path, **compile_kw: Any) -> tuple[Any, dict[str, int]]:
    """A SQLite graph whose one tool call ("c1", tool "t") counts its runs in the returned dict."""
    counts = {"n": 0}

    async def t() -> str:
        counts["n"] += 1
        return "ran"

    cp = SqliteCheckpointer(db)
    cp.setup()  # the file the tests alter: a checkpointer opens it on first use
    return tool_graph(AgentState, [t], [[call("c1", "t", {})]], checkpointer=cp, **compile_kw), counts


@pytest.mark.asyncio
async def test_ledger_read_failure_runs_the_tool_and_says_so(tmp_path: Path, caplog, make_thread) -> None:
    db = tmp_path / "broken.db"
    # Paused before the tools: the resumed run loads the tool-calling message, so it looks its
    # calls up (a message this run's own model just made needs no lookup: the test below).
    app, counts = counting_app(db, interrupt_before=["tools"])
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("x")]}, dict(cfg))
    assert counts["n"] == 0
    with sqlite3.connect(db) as c:  # a real failure of the real store
        c.execute("DROP TABLE tool_executions")
    caplog.set_level(logging.WARNING)
    r = await app.ainvoke({}, dict(cfg))
    assert counts["n"] == 1
    assert tool_texts(r["messages"]) == {"c1": "ran"}
    text = caplog.text
    assert "ledger lookup failed" in text and "idempotent tools will run" in text
    assert "COMPLETED but could not be recorded" in text  # the write fails too: no table


@pytest.mark.asyncio
async def test_calls_of_a_message_this_run_made_are_not_looked_up(tmp_path: Path, caplog, make_thread) -> None:
    """Nothing can be recorded under a message the run's own model step just added (ids new to
    the thread, committed before the tools start): the tool node skips the lookup. With the
    ledger table gone, only the write fails."""
    db = tmp_path / "fresh.db"
    app, counts = counting_app(db)
    with sqlite3.connect(db) as c:
        c.execute("DROP TABLE tool_executions")
    caplog.set_level(logging.WARNING)
    r = await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread()})
    assert counts["n"] == 1 and tool_texts(r["messages"]) == {"c1": "ran"}
    assert "ledger lookup failed" not in caplog.text
    assert "COMPLETED but could not be recorded" in caplog.text


@pytest.mark.asyncio
async def test_ledger_write_failure_logs_and_the_run_goes_on(tmp_path: Path, caplog, make_thread) -> None:
    db = tmp_path / "nowrite.db"
    cp = SqliteCheckpointer(db)
    await cp.asetup()  # the file the trigger goes in: a checkpointer opens it on first use

    async def charge() -> str:
        return "charged"

    app = tool_graph(AgentState, [charge], [[call("c1", "charge", {})]], checkpointer=cp)
    with sqlite3.connect(db) as c:
        c.execute("CREATE TRIGGER no_ledger BEFORE INSERT ON tool_executions BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    caplog.set_level(logging.WARNING)
    before = metrics.snapshot()["tenxgraph.tool.record_failures"]
    r = await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread()})
    assert tool_texts(r["messages"]) == {"c1": "charged"}
    assert r["messages"][-1].text() == "done"
    errors = [rec for rec in caplog.records if "COMPLETED but could not be recorded" in rec.getMessage()]
    assert errors and errors[0].levelno == logging.ERROR
    assert "disk full" in errors[0].error  # details are LogRecord fields; the message is constant
    assert metrics.snapshot()["tenxgraph.tool.record_failures"] == before + 1
    assert "ledger lookup failed" not in caplog.text


@pytest.mark.asyncio
async def test_tool_timeout_cancels_the_tool(checkpointer, make_thread) -> None:
    seen: list[str] = []

    async def stuck() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    async def quick() -> str:
        return "quick"

    app = tool_graph(AgentState, [stuck, quick], [[call("c1", "stuck", {}), call("c2", "quick", {})]],
                     checkpointer=checkpointer)
    t0 = time.perf_counter()
    r = await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread(), "tool_timeout": 0.2})
    assert time.perf_counter() - t0 < 5
    out = tool_texts(r["messages"])
    assert "NODE_TIMEOUT_002" in out["c1"] and "timeout" in out["c1"]
    assert out["c2"] == "quick"
    await seen_cancelled(seen)  # the timed-out tool must see CancelledError


@pytest.mark.asyncio
async def test_node_timeout_raises_and_cancels(checkpointer, make_thread) -> None:
    seen: list[str] = []

    async def stuck() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    app = tool_graph(AgentState, [stuck], [[call("c1", "stuck", {})]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread(), "node_timeout": 0.2, "tool_timeout": None}
    with pytest.raises(NodeTimeoutError) as e:
        await app.ainvoke({"messages": [user("x")]}, cfg)
    assert e.value.error_code == "NODE_TIMEOUT_001"
    assert e.value.context["node_name"] == "tools"
    await seen_cancelled(seen)
    state = await checkpointer.aget_state(cfg)
    assert state.execution_meta.status == "error" and state.execution_meta.current_node == "tools"


@pytest.mark.asyncio
async def test_astop_ends_a_node_that_sleeps_forever_in_under_a_second(checkpointer, make_thread) -> None:
    started = asyncio.Event()
    seen: list[str] = []

    async def forever() -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    app = tool_graph(AgentState, [forever], [[call("c1", "forever", {})]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread(), "user_id": "u1"}
    run = asyncio.create_task(app.ainvoke({"messages": [user("x")]}, cfg, "full"))
    await asyncio.wait_for(started.wait(), 10)
    t0 = time.perf_counter()
    assert await app.astop(cfg) == {"ok": True, "running": True}
    r = await asyncio.wait_for(run, 5)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"stop took {elapsed:.3f}s"
    assert seen == ["cancelled"]
    st = r["state"].execution_meta
    assert st.interrupt_reason == "stop_requested" and st.current_node == "tools"
    assert await app.astop(cfg) == {"ok": True, "running": False, "reason": "not-running"}
    assert await app.astop({"thread_id": make_thread()}) == {"ok": False, "running": False, "reason": "no-state"}


@pytest.mark.asyncio
async def test_stop_is_scoped_to_thread_and_user(checkpointer, make_thread) -> None:
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(0.6)
        return "finished"

    app = tool_graph(AgentState, [slow], [[call("c1", "slow", {})]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread(), "user_id": "owner"}
    run = asyncio.create_task(app.ainvoke({"messages": [user("x")]}, cfg))
    await started.wait()
    await app._checkpointer.arequest_stop({"thread_id": cfg["thread_id"], "user_id": "someone-else"})
    r = await run
    assert tool_texts(r["messages"]) == {"c1": "finished"}


@pytest.mark.asyncio
async def test_idempotency_key_is_stable_per_call_and_hidden_from_the_model(checkpointer, make_thread) -> None:
    keys: list[str] = []

    async def pay(amount: int, idempotency_key: str) -> str:
        keys.append(idempotency_key)
        if len(keys) == 1:
            await asyncio.sleep(30)  # first attempt hangs: the node times out, nothing is recorded
        return "paid"

    app = tool_graph(AgentState, [pay], [[call("call_1", "pay", {"amount": 3})]], checkpointer=checkpointer)
    schema = app._nodes["tools"].func.get_local_tool()[0]["function"]["parameters"]
    assert "idempotency_key" not in schema["properties"]
    cfg = {"thread_id": make_thread(), "tool_timeout": 0.2}
    r = await app.ainvoke({"messages": [user("x")]}, cfg)
    assert "NODE_TIMEOUT_002" in tool_texts(r["messages"])["call_1"]
    # Run the same call again (same assistant message): the retried attempt gets the same key.
    state = await checkpointer.aget_state(cfg)
    ask = next(m for m in state.context if m.tools_calls)
    state.context = state.context[: state.context.index(ask) + 1]
    await checkpointer.aput_state(cfg, state)
    r = await app.ainvoke({"state": {"current_node": "tools"}}, cfg)
    assert tool_texts(r["messages"])["call_1"] == "paid"
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0].startswith("tenx-")
    # Another thread, same call id: a different key.
    await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread(), "tool_timeout": 5})
    assert keys[2] != keys[0]


@pytest.mark.asyncio
async def test_tool_node_without_tool_calls_is_a_node_error(checkpointer, make_thread) -> None:
    from tenxgraph import END, START, StateGraph
    from tenxgraph.core.graph.tool_node import ToolNode

    async def t() -> str:
        return "x"

    g = StateGraph()
    g.add_node("tools", ToolNode([t]))
    g.add_edge(START, "tools")
    g.add_edge("tools", END)
    app = g.compile(checkpointer=checkpointer)
    with pytest.raises(NodeError) as e:
        await app.ainvoke({"messages": [user("no calls here")]}, {"thread_id": make_thread()})
    assert e.value.error_code == "NODE_002"


@pytest.mark.asyncio
async def test_metrics_count_calls_errors_and_timeouts(checkpointer, make_thread) -> None:
    async def bad() -> str:
        raise ValueError("nope")

    async def slow() -> str:
        await asyncio.sleep(5)
        return "x"

    app = tool_graph(AgentState, [bad, slow], [[call("c1", "bad", {}), call("c2", "slow", {})]], checkpointer=checkpointer)
    before = metrics.snapshot()
    await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread(), "tool_timeout": 0.1})
    after = metrics.snapshot()
    assert after["tenxgraph.tool.calls"] - before["tenxgraph.tool.calls"] == 2
    assert after["tenxgraph.tool.errors"] - before["tenxgraph.tool.errors"] == 1
    assert after["tenxgraph.tool.timeouts"] - before["tenxgraph.tool.timeouts"] == 1
    assert after["tenxgraph.node.executions"] - before["tenxgraph.node.executions"] == 3
    assert after["tenxgraph.tool.duration_seconds_sum"] > before["tenxgraph.tool.duration_seconds_sum"]
