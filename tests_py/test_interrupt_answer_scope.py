"""A human's answer reaches only the question it was given for (helper red-team, session 29).

- Parallel tool calls whose ids made one interrupt scope: ``("c", "c", "c#1")`` gave the second
  and third call one scope, a call without an id took the scope of a call whose id was
  ``#<its index>``; the answer to the question shown (a $5 refund) was taken by a tool whose
  question was never shown (a $50,000 wire).
- An answer a node got and never spent (it raised, timed out or was stopped after interrupt()
  returned) was kept, and the same interrupt() of the thread's next turn returned it without
  asking (10xGraph 0.10 does the same).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.utils import interrupt, pending_interrupt
from tests_py.tool_graphs import call, tool_graph


def _no_id(c: dict[str, Any]) -> dict[str, Any]:
    del c["id"]
    return c


CALLS = {
    "repeated-id-next-to-its-suffix": [call("c", "lookup"), call("c", "refund", {"amount": 5}),
                                       call("c#1", "wire", {"amount": 50000})],
    "no-id-next-to-its-suffix": [call("#1", "wire", {"amount": 50000}), _no_id(call("x", "refund", {"amount": 5}))],
    "id-that-is-an-outcome-scope": [call("r", "refund", {"amount": 5}), call("r:outcome", "wire", {"amount": 50000})],
    "empty-id": [call("", "refund", {"amount": 5}), call("w", "wire", {"amount": 50000})],
}


@pytest.mark.asyncio
@pytest.mark.parametrize("calls", list(CALLS), ids=list(CALLS))
async def test_each_parallel_call_gets_only_the_answer_to_its_own_question(checkpointer, make_thread, calls) -> None:
    ran: list[tuple[str, Any]] = []

    async def lookup() -> str:
        return "looked up"

    async def refund(amount: int) -> str:
        ran.append(("refund", interrupt({"q": "refund", "amount": amount}, message=f"refund {amount}?")))
        return "refund done"

    async def wire(amount: int) -> str:
        ran.append(("wire", interrupt({"q": "wire", "amount": amount}, message=f"wire {amount}?")))
        return "wire done"

    app = tool_graph(AgentState, [lookup, refund, wire], [CALLS[calls]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("scope")}
    r = await app.ainvoke({"messages": [Message.text_message("go")]}, cfg, response_granularity="full")
    shown: list[str] = []
    for _ in range(4):
        p = pending_interrupt(r["state"])
        if p is None:
            break
        shown.append(p.value["q"])
        r = await app.ainvoke({"resume": f"yes to {p.value['q']}", "interrupt_id": p.id}, cfg,
                              response_granularity="full")
    assert r["state"].execution_meta.status.value == "completed"
    # Every answer a tool got is the one given to its own question, and it was shown.
    assert sorted(ran) == sorted((q, f"yes to {q}") for q in shown)
    assert sorted(shown) == ["refund", "wire"]


def _asking_graph(checkpointer: Any, how: str, answered: asyncio.Event, got: list[tuple[str, Any]]) -> Any:
    async def ask(state: AgentState) -> Message:
        text = [m for m in state.context if m.role == "user"][-1].text()
        answer = interrupt(f"approve {text}?")
        got.append((text, answer))
        if text == "turn1":
            answered.set()
            if how == "raise":
                raise RuntimeError("the downstream call failed")
            await asyncio.sleep(60)  # ended by node_timeout or stop()
        return Message.text_message(f"{text}: {answer}", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["raise", "timeout", "stop"])
async def test_an_answer_a_node_never_spent_is_not_given_to_the_next_turn(checkpointer, make_thread, how) -> None:
    answered, got = asyncio.Event(), []
    app = _asking_graph(checkpointer, how, answered, got)
    cfg = {"thread_id": make_thread("unspent")}
    await app.ainvoke({"messages": [Message.text_message("turn1")]}, dict(cfg))
    if how == "stop":
        run = asyncio.create_task(app.ainvoke({"resume": "APPROVED turn1"}, dict(cfg)))
        await asyncio.wait_for(answered.wait(), 60)
        await app.astop(dict(cfg))
        await asyncio.wait_for(run, 60)
    else:
        with pytest.raises(Exception) as raised:
            await app.ainvoke({"resume": "APPROVED turn1"}, {**cfg, "node_timeout": 1} if how == "timeout" else cfg)
        assert getattr(raised.value, "error_code", None) == ("NODE_TIMEOUT_001" if how == "timeout" else "NODE_001")
    assert got == [("turn1", "APPROVED turn1")]

    r = await app.ainvoke({"messages": [Message.text_message("turn2")]}, dict(cfg), response_granularity="full")
    pending = pending_interrupt(r["state"])
    assert pending is not None and pending.value == "approve turn2?", "turn2 was answered without asking"
    assert got == [("turn1", "APPROVED turn1")]
    r = await app.ainvoke({"resume": "APPROVED turn2"}, dict(cfg))
    assert got[-1] == ("turn2", "APPROVED turn2")
    assert r["messages"][-1].text() == "turn2: APPROVED turn2"


@pytest.mark.asyncio
async def test_a_failed_node_run_again_in_its_own_turn_keeps_the_answer_it_was_given(checkpointer, make_thread) -> None:
    """The same turn, continued with ``{}``: the question it re-asks is the one answered."""
    answered, got = asyncio.Event(), []
    fail = [True]

    async def ask(state: AgentState) -> Message:
        answer = interrupt("approve?")
        got.append(answer)
        if fail.pop() if fail else False:
            raise RuntimeError("the downstream call failed")
        return Message.text_message(f"done: {answer}", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("retry")}
    await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg))
    with pytest.raises(Exception):
        await app.ainvoke({"resume": "yes"}, dict(cfg))
    r = await app.ainvoke({}, dict(cfg))
    assert got == ["yes", "yes"] and not answered.is_set()
    assert r["messages"][-1].text() == "done: yes"
