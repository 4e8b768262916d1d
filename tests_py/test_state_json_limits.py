"""What a state's JSON cannot keep is refused by name, not changed (helper red-team, session 29).

The engine parses a state at each commit; its JSON numbers keep i64 and u64 exactly and made any
other int a float: a resume value of 2**70 + 1 (an account number in smallest units) reached the
node's next run, in another process, as 1.1805916207174113e+21; a node's own such int was stored
the same way. A resume value nested 5,000 deep was a bare RecursionError, a lone surrogate a
"state is not valid JSON: unexpected end of hex escape".
"""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import NodeError
from tenxgraph.utils import interrupt, pending_interrupt


class Holding(AgentState):
    held: Any = None


def _asking(checkpointer: Any) -> Any:
    async def ask(state: Holding) -> Message:
        account = interrupt("account?")
        confirmed = interrupt(f"send to {account}?")
        return Message.text_message(f"{account!r} {confirmed}", role="assistant")

    g = StateGraph(Holding)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=checkpointer)


def _deep(n: int) -> Any:
    v: Any = "x"
    for _ in range(n):
        v = [v]
    return v


BAD_ANSWERS = {
    "int-past-64-bits": (2**70 + 1, "an integer past 64 bits"),
    "negative-int-past-64-bits": (-(2**64), "an integer past 64 bits"),
    "int-past-64-bits-nested": ({"account": [2**64]}, "an integer past 64 bits"),
    "lone-surrogate": ("\ud800", "a lone surrogate"),
    # Python 3.11 and 3.12 hit their recursion limit first ("nested too deep"); 3.13's json module
    # goes deeper, and the store's own depth rule answers.
    "nested-5000-deep": (_deep(5000), "nested too deep|nesting deeper than the 123 levels"),
    # Past the store's 127 levels where the answer is kept (under four levels of the state):
    # the commit named "the state", and 500 deep was a bare RecursionError from the answer's copy
    # (session 37).
    "nested-124-deep": (_deep(124), "nesting deeper than the 123 levels"),
    "nested-500-deep": (_deep(500), "nesting deeper than the 123 levels"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", list(BAD_ANSWERS), ids=list(BAD_ANSWERS))
async def test_a_resume_value_the_state_cannot_keep_is_refused_and_the_question_stays(checkpointer, make_thread,
                                                                                      bad: str) -> None:
    app = _asking(checkpointer)
    cfg = {"thread_id": make_thread("answer")}
    await app.ainvoke({"messages": [Message.text_message("go")]}, cfg)
    value, said = BAD_ANSWERS[bad]
    with pytest.raises(ValueError, match=said):
        await app.ainvoke({"resume": value}, cfg)
    stored = await checkpointer.aget_state(cfg)
    assert pending_interrupt(stored).value == "account?"
    r = await app.ainvoke({"resume": str(2**70 + 1)}, cfg, response_granularity="full")
    assert pending_interrupt(r["state"]).value == f"send to {2**70 + 1}?"


@pytest.mark.asyncio
async def test_an_answer_nested_as_deep_as_the_store_keeps_is_kept(checkpointer, make_thread) -> None:
    async def keep(state: Holding) -> Holding:
        state.held = interrupt("tree?")
        return state

    g = StateGraph(Holding)
    g.add_node("keep", keep)
    g.add_edge(START, "keep")
    g.add_edge("keep", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("deepest")}
    await app.ainvoke({"messages": [Message.text_message("go")]}, cfg)
    await app.ainvoke({"resume": _deep(123)}, cfg)
    assert (await checkpointer.aget_state(cfg)).held == _deep(123)


@pytest.mark.asyncio
async def test_the_largest_64_bit_ints_are_kept_exactly_as_answers(checkpointer, make_thread) -> None:
    app = _asking(checkpointer)
    cfg = {"thread_id": make_thread("edges")}
    await app.ainvoke({"messages": [Message.text_message("go")]}, cfg)
    await app.ainvoke({"resume": 2**64 - 1}, cfg)
    r = await app.ainvoke({"resume": -(2**63)}, cfg)
    assert r["messages"][-1].text() == f"{2**64 - 1!r} {-(2**63)}"


@pytest.mark.asyncio
async def test_a_node_that_puts_an_int_past_64_bits_in_the_state_fails_its_step(checkpointer, make_thread) -> None:
    async def keep(state: Holding) -> Message:
        state.held = {"account": 2**70 + 1}
        return Message.text_message("kept", role="assistant")

    g = StateGraph(Holding)
    g.add_node("keep", keep)
    g.add_edge(START, "keep")
    g.add_edge("keep", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("node-int")}
    with pytest.raises((NodeError, ValueError), match="held.account is an integer past 64 bits"):
        await app.ainvoke({"messages": [Message.text_message("go")]}, cfg)
    stored = await checkpointer.aget_state(cfg)
    assert stored.held is None  # not a float
    assert [m.text() for m in stored.context] == ["go"]
