"""A preempting turn that gives up or is cancelled does not cut the running turn short
(helper red-team, session 30).

A turn sent with ``on_busy="interrupt"`` asks the running turn to stop at its next safe point.
When it then gave up (its ``busy_timeout`` ran out: ``STORAGE_BUSY_003``) or its caller cancelled
it, the request stayed: the running turn stopped anyway (``interrupted_after``, ``preempted``)
with its final reply never made, and nobody took the thread. The request now expires with its
requester's wait, is withdrawn by a requester that gives up, and is not obeyed once its requester
in this process (or a process of this machine that is gone) has stopped asking.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import ThreadBusyError


def _held_agent(checkpointer: Any, entered: asyncio.Event, release: asyncio.Event) -> Any:
    async def model(state: AgentState) -> Message:
        entered.set()
        await release.wait()
        return Message.text_message("reply to " + state.context[-1].text(), role="assistant")

    async def polish(state: AgentState) -> Message:
        return Message.text_message("polished", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("polish", polish)  # a safe point between the two nodes
    g.add_edge(START, "model")
    g.add_edge("model", "polish")
    g.add_edge("polish", END)
    return g.compile(checkpointer=checkpointer)


async def _until(check: Any, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        assert time.monotonic() < deadline, "the condition never came true"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["gave_up", "cancelled"])
async def test_the_running_turn_completes_when_its_preempter_stopped_asking(
        checkpointer: Any, make_thread: Any, how: str) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    app = _held_agent(checkpointer, entered, release)
    cfg = {"thread_id": make_thread("preempted"), "user_id": "u"}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("A")]}, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 60)
    second_cfg = dict(cfg, on_busy="interrupt", busy_timeout=0.5 if how == "gave_up" else 60.0)
    second = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("P")]}, second_cfg))
    # The request is made (the running turn would obey it at its next safe point).
    await _until(lambda: checkpointer.ais_stop_requested(dict(cfg)))
    if how == "gave_up":
        with pytest.raises(ThreadBusyError) as e:
            await second
        assert e.value.error_code == "STORAGE_BUSY_003"
    else:
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
    release.set()
    out = await asyncio.wait_for(first, 60)
    assert out["messages"][-1].text() == "polished"
    state = await checkpointer.aget_state(dict(cfg))
    assert state.execution_meta.status.value == "completed"
    assert [m.text() for m in state.context] == ["A", "reply to A", "polished"]


@pytest.mark.asyncio
async def test_a_preempter_still_waiting_is_obeyed(checkpointer: Any, make_thread: Any) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    app = _held_agent(checkpointer, entered, release)
    cfg = {"thread_id": make_thread("obeyed"), "user_id": "u"}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("A")]}, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 60)
    second = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("P")]},
                                             dict(cfg, on_busy="interrupt", busy_timeout=60.0)))
    await _until(lambda: checkpointer.ais_stop_requested(dict(cfg)))
    release.set()
    await asyncio.wait_for(first, 60)
    await asyncio.wait_for(second, 60)
    texts = [m.text() for m in (await checkpointer.aget_state(dict(cfg))).context]
    # A stopped after its model node (its reply kept), and P's turn ran.
    assert texts[:3] == ["A", "reply to A", "P"], texts
