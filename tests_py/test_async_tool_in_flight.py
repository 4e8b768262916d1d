"""An async tool that ignores its cancellation and finishes anyway is not started a second time
by a resume that comes while it still runs (helper red-team, session 29: node_timeout or stop(),
then `ainvoke({})` at once, charged twice with the same idempotency key in 4 of 4 rounds on every
backend; sync tools were already waited for, tenxgraph._sync_calls)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph, ToolNode


def _graph(checkpointer: Any, charge: Any) -> Any:
    async def model(state: AgentState) -> Message:
        last = state.context[-1]
        if last.role == "user":
            msg = Message.text_message("calling", role="assistant", message_id=f"a-{last.message_id}")
            msg.tools_calls = [{"id": "c0", "type": "function",
                                "function": {"name": "charge", "arguments": json.dumps({"amount": 5})}}]
            return msg
        return Message.text_message(f"done: {last.text()}", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([charge]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


async def _until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
@pytest.mark.parametrize("cut", ["node_timeout", "stop"])
async def test_a_resume_waits_for_the_async_call_still_running_and_takes_its_result(checkpointer, make_thread, caplog,
                                                                                   cut: str) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    charges: list[str] = []

    async def charge(amount: int, idempotency_key: str) -> str:
        """Charges a card; a request in flight is finished even when the caller gives up."""
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            await release.wait()  # the request is already out: finish it
        charges.append(idempotency_key)
        return f"charged {amount}"

    app = _graph(checkpointer, charge)
    cfg = {"thread_id": make_thread(f"inflight-{cut}")}
    turn = {"messages": [Message.text_message("pay", message_id=f"u-{cfg['thread_id']}")]}
    caplog.set_level(logging.INFO, logger="tenxgraph")
    if cut == "node_timeout":
        with pytest.raises(Exception) as cut_off:
            await app.ainvoke(turn, {**cfg, "node_timeout": 0.5})
        assert getattr(cut_off.value, "error_code", None) == "NODE_TIMEOUT_001"
    else:
        first = asyncio.create_task(app.ainvoke(turn, cfg))
        await asyncio.wait_for(started.wait(), 60)
        await app.astop(cfg)
        await asyncio.wait_for(first, 60)
    assert started.is_set() and charges == []  # the first copy still runs

    resume = asyncio.create_task(app.ainvoke({}, cfg))
    await _until(lambda: any(getattr(r, "event", None) == "async_tool_joined" for r in caplog.records)
                 or resume.done(), "the resume to reach the call")
    assert not resume.done(), resume.result() if not resume.exception() else resume.exception()
    release.set()
    result = await asyncio.wait_for(resume, 60)
    assert len(charges) == 1, charges
    assert result["messages"][-1].text() == "done: charged 5"
    again = await app.ainvoke({}, cfg)  # finished: answered from the store, nothing runs
    assert again["messages"][-1].text() == "done: charged 5" and len(charges) == 1
