"""interrupt() in nodes and tools: pause, resume with an answer, misuse errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils import GraphInterrupt, Interrupt, interrupt, pending_interrupt
from tests_py.tool_graphs import call, tool_graph, tool_texts


class Approval(AgentState):
    decision: str = ""


def user(text: str) -> Message:
    return Message.text_message(text)


def one_node_graph(fn: Any):
    g = StateGraph(Approval)
    g.add_node("ask", fn)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


@pytest.mark.asyncio
async def test_node_pauses_and_resumes_with_the_answer(checkpointer, make_thread) -> None:
    runs = {"before": 0, "after": 0}

    async def ask(state: Approval) -> str:
        runs["before"] += 1  # runs again on resume: side effects belong after interrupt()
        answer = interrupt({"amount": 42}, message="Refund $42?")
        runs["after"] += 1
        state.decision = str(answer)
        return f"decision: {answer}"

    app = one_node_graph(ask).compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    r = await app.ainvoke({"messages": [user("refund please")]}, cfg, "full")
    pending = pending_interrupt(r["state"])
    assert isinstance(pending, Interrupt)
    assert (pending.value, pending.message, pending.node, pending.key) == ({"amount": 42}, "Refund $42?", "ask", "node:ask:0")
    assert r["state"].execution_meta.status == "interrupted_before"
    assert runs == {"before": 1, "after": 0}
    stored = await checkpointer.aget_state(cfg)
    assert pending_interrupt(stored).id == pending.id  # the pause is durable

    r = await app.ainvoke({"resume": "approved"}, cfg, "full")
    assert runs == {"before": 2, "after": 1}
    assert r["state"].decision == "approved"
    assert r["state"].execution_meta.status == "completed"
    assert pending_interrupt(r["state"]) is None
    assert "interrupt_resume" not in r["state"].execution_meta.internal_data
    assert [m.text() for m in r["messages"]][-1] == "decision: approved"


@pytest.mark.asyncio
async def test_two_interrupts_in_one_node_are_answered_in_order(checkpointer, make_thread) -> None:
    def ask(state: Approval) -> str:  # sync node: runs in a thread, the scope follows it
        first = interrupt("first?")
        second = interrupt("second?")
        return f"{first}+{second}"

    app = one_node_graph(ask).compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    r = await app.ainvoke({"messages": [user("go")]}, cfg, "full")
    assert pending_interrupt(r["state"]).value == "first?"
    r = await app.ainvoke({"resume": "A"}, cfg, "full")
    assert pending_interrupt(r["state"]).value == "second?"
    assert pending_interrupt(r["state"]).key == "node:ask:1"
    r = await app.ainvoke({"resume": "B"}, cfg, "full")
    assert r["messages"][-1].text() == "A+B"


@pytest.mark.asyncio
async def test_except_exception_does_not_swallow_the_pause(checkpointer, make_thread) -> None:
    assert not issubclass(GraphInterrupt, Exception)

    async def careless(state: Approval) -> str:
        try:
            return str(interrupt("ok?"))
        except Exception:  # noqa: BLE001 - the point of the test
            return "swallowed"

    app = one_node_graph(careless).compile(checkpointer=checkpointer)
    r = await app.ainvoke({"messages": [user("go")]}, {"thread_id": make_thread()}, "full")
    assert pending_interrupt(r["state"]) is not None


@pytest.mark.asyncio
async def test_resume_misuse_is_rejected_and_changes_nothing(checkpointer, make_thread) -> None:
    async def ask(state: Approval) -> str:
        return str(interrupt("?"))

    app = one_node_graph(ask).compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("go")]}, cfg)
    before = await checkpointer.aget_state(dict(cfg))
    with pytest.raises(ValueError, match=r"Thread is paused at interrupt 'int_[0-9a-f]+' in node 'ask'"):
        await app.ainvoke({"messages": [user("ignored")]}, cfg)
    after = await checkpointer.aget_state(dict(cfg))
    assert len(after.context) == len(before.context)

    done = {"thread_id": make_thread()}
    app2 = one_node_graph(lambda s: "plain").compile(checkpointer=checkpointer)
    await app2.ainvoke({"messages": [user("x")]}, done)
    with pytest.raises(ValueError, match="Nothing to resume"):
        await app2.ainvoke({"resume": 1}, done)


def test_interrupt_outside_a_node_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="while a graph node or tool is running"):
        interrupt("nobody is listening")


@pytest.mark.asyncio
async def test_parallel_tool_pause_replays_finished_siblings(checkpointer, make_thread) -> None:
    counts = {"lookup": 0, "refund_start": 0, "refund_done": 0}

    async def lookup(order_id: str) -> str:
        counts["lookup"] += 1
        return f"order {order_id}"

    async def refund(order_id: str, amount: float) -> str:
        counts["refund_start"] += 1
        decision = interrupt({"order_id": order_id, "amount": amount}, message=f"Refund ${amount:.2f}?")
        if not decision or not decision.get("approved"):
            return "Refund declined"
        counts["refund_done"] += 1
        return f"refunded {amount}"

    turn = [call("c1", "lookup", {"order_id": "7"}), call("c2", "refund", {"order_id": "7", "amount": 5.0})]
    app = tool_graph(AgentState, [lookup, refund], [turn], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    r = await app.ainvoke({"messages": [user("refund")]}, cfg, "full")
    pending = pending_interrupt(r["state"])
    assert pending.tool_call_id == "c2" and pending.key == "tool:c2:0" and pending.node == "tools"
    assert counts == {"lookup": 1, "refund_start": 1, "refund_done": 0}
    r = await app.ainvoke({"resume": {"approved": True}}, cfg, "full")
    assert counts == {"lookup": 1, "refund_start": 2, "refund_done": 1}, "the finished sibling is not run again"
    assert tool_texts(r["messages"]) == {"c1": "order 7", "c2": "refunded 5.0"}
    assert r["messages"][-1].text() == "done"


@pytest.mark.asyncio
async def test_a_paused_thread_resumes_from_a_new_process_object(tmp_path: Path, make_thread) -> None:
    async def ask(state: Approval) -> str:
        return f"got {interrupt('?')}"

    db = tmp_path / "hitl.db"
    cfg = {"thread_id": make_thread()}
    await one_node_graph(ask).compile(checkpointer=SqliteCheckpointer(db)).ainvoke({"messages": [user("x")]}, cfg)
    fresh = one_node_graph(ask).compile(checkpointer=SqliteCheckpointer(db))
    r = await fresh.ainvoke({"resume": "later"}, cfg)
    assert r["messages"][-1].text() == "got later"


@pytest.mark.asyncio
async def test_stop_while_waiting_is_not_needed_for_a_paused_thread(checkpointer, make_thread) -> None:
    async def ask(state: Approval) -> str:
        return str(interrupt("?"))

    app = one_node_graph(ask).compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("x")]}, cfg)
    assert await app.astop(cfg) == {"ok": True, "running": False, "reason": "not-running"}
    await asyncio.sleep(0)
