"""An async tool that ignores its cancellation and finishes anyway is not started a second time
by a resume that comes while it still runs (helper red-team, session 29: node_timeout or stop(),
then `ainvoke({})` at once, charged twice with the same idempotency key in 4 of 4 rounds on every
backend; sync tools were already waited for, tenxgraph._sync_calls)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from tenxgraph import Message
from tests_py.one_tool_graph import one_tool_graph
from tests_py.tool_graphs import tool_texts


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

    app = one_tool_graph(checkpointer, charge, "charge", {"amount": 5})
    cfg = {"thread_id": make_thread(f"inflight-{cut}")}
    turn = {"messages": [Message.text_message("pay", message_id=f"u-{cfg['thread_id']}")]}
    caplog.set_level(logging.INFO, logger="tenxgraph")
    if cut == "node_timeout":
        with pytest.raises(Exception) as cut_off:
            # Long enough for the tool to start on a loaded machine; the tool waits for
            # `release`, so the timeout always fires first.
            await app.ainvoke(turn, {**cfg, "node_timeout": 3})
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
    assert tool_texts(result["messages"]) == {"call-0-charge": "charged 5"}
    assert result["messages"][-1].text() == "done"
    state = await checkpointer.aget_state(cfg)
    assert tool_texts(state.context) == {"call-0-charge": "charged 5"}  # answered once
