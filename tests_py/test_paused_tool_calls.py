"""A tool call paused at interrupt() is a pause, not a crash: its ledger row says "paused", and the
resume runs it again with no unknown-outcome path, for every side-effect class, alone or among
parallel siblings, on invoke and on streaming. A crash while the resumed call runs is still a crash."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.utils.interrupt import interrupt, pending_interrupt
from tenxgraph.utils.tool_decorator import tool
from tests_py.tool_graphs import call, tool_graph, tool_texts

CLASSES = ["at_most_once", "idempotent", "pure"]


def user(text: str) -> Message:
    return Message.text_message(text)


async def drive(app: Any, data: dict[str, Any], cfg: dict[str, Any], path: str) -> None:
    if path == "invoke":
        await app.ainvoke(data, dict(cfg))
    else:
        async for _ in app.astream(data, dict(cfg)):
            pass


def approval_tool(effects: str, charges: list[int]) -> Any:
    @tool(side_effects=effects, on_unknown="interrupt" if effects == "at_most_once" else "error")
    async def charge(amount: int) -> str:
        decision = interrupt({"amount": amount}, message=f"Charge {amount}?")
        if not (isinstance(decision, dict) and decision.get("approved")):
            return "declined"
        charges.append(amount)  # the side effect, after the interrupt as documented
        return f"charged {amount}"

    return charge


async def ledger_key(cp: Any, cfg: dict[str, Any], call_id: str) -> str:
    state = await cp.aget_state(cfg)
    [asked] = [m for m in state.context if m.tools_calls]
    return f"{asked.message_id}:{call_id}"  # 10xGraph's form; the checkpointer finds today's key


def unknown_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "tool_outcome_unknown"]


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["invoke", "stream"])
@pytest.mark.parametrize("effects", CLASSES)
async def test_an_approved_tool_runs_once_after_the_approval(checkpointer, make_thread, effects, path, caplog) -> None:
    charges: list[int] = []
    app = tool_graph(AgentState, [approval_tool(effects, charges)], [[call("c1", "charge", {"amount": 129})]],
                     checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    caplog.set_level(logging.INFO, logger="tenxgraph")
    await drive(app, {"messages": [user("pay")]}, cfg, path)
    state = await checkpointer.aget_state(cfg)
    assert pending_interrupt(state) is not None and pending_interrupt(state).tool_call_id == "c1"
    key = await ledger_key(checkpointer, cfg, "c1")
    assert await checkpointer.aget_tool_status(cfg, key) == (None if effects == "pure" else "paused")

    await drive(app, {"resume": {"approved": True}}, cfg, path)
    state = await checkpointer.aget_state(cfg)
    assert str(state.execution_meta.status) == "completed", state.execution_meta
    assert charges == [129]
    assert tool_texts(state.context) == {"c1": "charged 129"}
    assert unknown_lines(caplog) == [], "a pause was read as a crash"
    assert await checkpointer.aget_tool_status(cfg, key) == (None if effects == "pure" else "completed")


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["invoke", "stream"])
async def test_a_paused_call_among_parallel_siblings_resumes_without_a_second_question(checkpointer, make_thread, path,
                                                                                      caplog) -> None:
    charges: list[int] = []
    runs: dict[str, int] = {}

    @tool(side_effects="at_most_once")
    async def lookup() -> str:
        runs["lookup"] = runs.get("lookup", 0) + 1
        return "order 4821"

    @tool(side_effects="idempotent")
    async def notify() -> str:
        runs["notify"] = runs.get("notify", 0) + 1
        return "notified"

    turn = [call("c1", "lookup"), call("c2", "charge", {"amount": 5}), call("c3", "notify")]
    app = tool_graph(AgentState, [lookup, approval_tool("at_most_once", charges), notify], [turn],
                     checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    caplog.set_level(logging.INFO, logger="tenxgraph")
    await drive(app, {"messages": [user("pay")]}, cfg, path)
    state = await checkpointer.aget_state(cfg)
    assert pending_interrupt(state).reason != "tool_outcome_unknown"
    assert await checkpointer.aget_tool_status(cfg, await ledger_key(checkpointer, cfg, "c2")) == "paused"

    await drive(app, {"resume": {"approved": True}}, cfg, path)
    state = await checkpointer.aget_state(cfg)
    assert str(state.execution_meta.status) == "completed", pending_interrupt(state)
    assert charges == [5] and runs == {"lookup": 1, "notify": 1}
    assert tool_texts(state.context) == {"c1": "order 4821", "c2": "charged 5", "c3": "notified"}
    assert unknown_lines(caplog) == []


@pytest.mark.asyncio
async def test_a_declined_then_repeated_question_is_still_a_pause(checkpointer, make_thread) -> None:
    """A tool that asks twice pauses twice; each pause is marked, neither is an unknown outcome."""
    charges: list[int] = []

    @tool(side_effects="at_most_once")
    async def charge(amount: int) -> str:
        first = interrupt("approve?")
        second = interrupt("which card?")
        charges.append(amount)
        return f"{first}/{second}"

    app = tool_graph(AgentState, [charge], [[call("c1", "charge", {"amount": 7})]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("pay")]}, dict(cfg))
    key = await ledger_key(checkpointer, cfg, "c1")
    await app.ainvoke({"resume": "yes"}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert pending_interrupt(state).key == "tool:c1:1"
    assert await checkpointer.aget_tool_status(cfg, key) == "paused"
    await app.ainvoke({"resume": "visa"}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert charges == [7] and tool_texts(state.context) == {"c1": "yes/visa"}


@pytest.mark.asyncio
async def test_a_crash_while_the_resumed_call_runs_is_an_unknown_outcome(checkpointer, make_thread) -> None:
    """The resume marks the row started again before running the call: a crash after the charge
    must not read as another pause (that would charge twice)."""
    from tenxgraph.core.exceptions import FailpointError

    charges: list[int] = []
    app = tool_graph(AgentState, [approval_tool("at_most_once", charges)], [[call("c1", "charge", {"amount": 3})]],
                     checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("pay")]}, dict(cfg))
    key = await ledger_key(checkpointer, cfg, "c1")
    with pytest.raises(FailpointError):
        await app.ainvoke({"resume": {"approved": True}}, dict(cfg, failpoints="after_tool:charge=raise"))
    assert charges == [3]
    assert await checkpointer.aget_tool_status(cfg, key) == "started"
    await app.ainvoke({}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert charges == [3], "the resumed charge ran twice"
    question = pending_interrupt(state)
    assert question is not None and question.reason == "tool_outcome_unknown"
    assert json.dumps(question.value)  # the human is asked about the crashed call
