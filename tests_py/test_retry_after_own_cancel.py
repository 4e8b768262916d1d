"""A caller that cancels its own run and at once sends the same turn again (a client's timeout
and retry; ``task.cancel()`` then ``ainvoke`` with no await between). ``cancel()`` only asks:
the cancelled task unwinds at its next step of the loop, and the retry went first, finding that
run still holding the thread: ``STORAGE_BUSY_002`` naming the caller's own cancelled run, 15
tries in 20 on the memory store (red-team, session 41), though a caller's own retry is promised
a wait for a run it dropped. The retry now waits for it, then finishes the turn once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import ThreadBusyError

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


def _graph(checkpointer: Any, entered: asyncio.Event, calls: list[int]) -> Any:
    async def model(state: AgentState) -> Message:
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            await asyncio.Event().wait()  # the first call holds the thread until it is cancelled
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("on_busy", ["reject", "wait"])
async def test_the_same_turn_right_after_cancelling_its_run_is_not_refused(
    checkpointer: Any, make_thread: Any, on_busy: str
) -> None:
    entered = asyncio.Event()
    calls: list[int] = []
    app = _graph(checkpointer, entered, calls)
    cfg = {"thread_id": make_thread(), "idempotent_turns": True, "on_busy": on_busy, "busy_timeout": 30}
    turn = {"messages": [Message.text_message("pay", role="user", message_id="turn-1")]}
    first = asyncio.ensure_future(app.ainvoke(turn, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 30)
    first.cancel()
    out = await app.ainvoke(turn, dict(cfg))  # no await between the cancel and the retry
    assert [m.text() for m in out["messages"]][-2:] == ["pay", "done"]
    assert first.cancelled()
    state = await checkpointer.aget_state({"thread_id": cfg["thread_id"]})
    assert [m.text() for m in state.context] == ["pay", "done"]
    assert len(calls) == 2


async def test_a_live_run_whose_task_once_swallowed_a_cancel_is_not_waited_for(checkpointer: Any, make_thread: Any) -> None:
    """The wait is for runs asked to cancel while they ran: a worker task that swallowed a
    cancel before it started its run stays "cancelling" for good, and ``on_busy="reject"``
    against that live run waited the whole ``busy_timeout`` (red-team, session 41)."""
    entered = asyncio.Event()
    calls: list[int] = []
    app = _graph(checkpointer, entered, calls)
    tid = make_thread()

    async def worker() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # asked to stop once, it goes on serving
        await app.ainvoke({"messages": [Message.text_message("w", role="user")]}, {"thread_id": tid})

    w = asyncio.ensure_future(worker())
    await asyncio.sleep(0)
    w.cancel()
    await asyncio.wait_for(entered.wait(), 30)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(ThreadBusyError) as busy:
        await app.ainvoke({"messages": [Message.text_message("r", role="user")]},
                          {"thread_id": tid, "on_busy": "reject", "busy_timeout": 20})
    assert busy.value.error_code == "STORAGE_BUSY_002"
    assert loop.time() - t0 < 10, "the reject waited for a run nobody cancelled"
    w.cancel()
    await asyncio.gather(w, return_exceptions=True)
