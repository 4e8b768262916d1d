"""``stop()`` stops the run it saw, never the thread's next one (red-team, session 35).

``astop`` reads the thread (running), then writes the stop request. A request that lands after
that run has finished and the user's next turn has started used to stop the next turn, mid-tool.
The request now names the lease token of the run ``astop`` saw (read before the state), and a run
holding another token does not obey it.

The delay between the read and the write (a slow network, a GC pause) is modelled by holding the
checkpointer's ``arequest_stop`` (what an application may override) until the next turn is inside
its node. SQLite, Postgres, Postgres+Redis (the request lives in Redis there).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer


@pytest.fixture(params=["sqlite", "postgres", "postgres+redis"])
def cp(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        return SqliteCheckpointer(str(tmp_path / "stop.db"))
    redis = request.getfixturevalue("tenx_redis").url if request.param == "postgres+redis" else None
    return PgCheckpointer(request.getfixturevalue("tenx_postgres").dsn, redis_url=redis,
                          schema=f"t_{uuid.uuid4().hex[:16]}")


def _graph(cp: Any, entered: list[asyncio.Event], release: list[asyncio.Event]) -> Any:
    async def work(state: AgentState) -> Message:
        turn = sum(1 for m in state.context if m.role == "user") - 1
        entered[turn].set()
        await release[turn].wait()
        return Message.text_message(f"turn {turn} done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=cp)


def _turn(app: Any, cfg: dict[str, Any], i: int) -> Any:
    """User turn ``i`` of the thread, as a task (its full response)."""
    return asyncio.create_task(app.ainvoke({"messages": [Message.text_message(f"turn {i}")]}, dict(cfg),
                                           response_granularity="full"))


class _Loop(AgentState):
    n: int = 0


def _looping(cp: Any, entered: asyncio.Event, hold: asyncio.Event | None = None) -> Any:
    """A turn of steps that goes on (each step a safe point, 50 ms) until a user message
    "urgent" is the last one; ``hold``, when given, keeps the first step running until set."""

    async def step(state: _Loop) -> Message:
        state.n += 1
        entered.set()
        if hold is not None:
            await hold.wait()
        await asyncio.sleep(0.05)
        return Message.text_message(f"step {state.n}", role="assistant")

    def again(state: _Loop) -> str:
        urgent = [m for m in state.context if m.role == "user"][-1].text() == "urgent"
        return END if urgent or state.n >= 3000 else "step"

    g = StateGraph(_Loop)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", again, {"step": "step", END: END})
    return g.compile(checkpointer=cp)


@pytest.mark.asyncio
async def test_a_stop_that_lands_after_its_run_ended_does_not_stop_the_next_turn(cp: Any) -> None:
    entered = [asyncio.Event() for _ in range(3)]
    release = [asyncio.Event() for _ in range(3)]
    app = _graph(cp, entered, release)
    cfg = {"thread_id": "t-stop", "user_id": "alice"}

    def turn(i: int) -> Any:
        return _turn(app, cfg, i)

    write_held, go = asyncio.Event(), asyncio.Event()
    real = cp.arequest_stop

    async def held(config: dict[str, Any]) -> bool:
        write_held.set()
        await go.wait()
        return await real(config)

    cp.arequest_stop = held
    run_a = turn(0)
    await asyncio.wait_for(entered[0].wait(), 30)
    stopping = asyncio.create_task(app.astop(dict(cfg)))
    await asyncio.wait_for(write_held.wait(), 30)  # stop() has read run A running
    release[0].set()
    a = await asyncio.wait_for(run_a, 30)
    assert a["state"].execution_meta.status == "completed"

    run_b = turn(1)
    await asyncio.wait_for(entered[1].wait(), 30)
    go.set()  # the stop aimed at run A lands while run B is inside its node
    assert await asyncio.wait_for(stopping, 30) == {"ok": True, "running": True}
    # Run B's process was signalled with the request: a run that obeyed it would end within a
    # poll (about a second). The wait only gives a wrong run the time to stop; it cannot fail a
    # right one.
    done, _ = await asyncio.wait({run_b}, timeout=3.0)
    assert not done, run_b.result()["state"].execution_meta
    # Seen by run B, the stale request is cleared: it stood for its hour in the way of a
    # preemption (written only where no request is pending) and made ais_stop_requested say yes.
    assert await cp.ais_stop_requested(dict(cfg)) is False
    release[1].set()
    b = await asyncio.wait_for(run_b, 30)
    meta = b["state"].execution_meta
    assert (meta.status, meta.interrupt_reason) == ("completed", None), meta
    assert b["messages"][-1].text() == "turn 1 done"

    # A stop of the run that is running now still stops it.
    cp.arequest_stop = real
    run_c = turn(2)
    await asyncio.wait_for(entered[2].wait(), 30)
    assert await app.astop(dict(cfg)) == {"ok": True, "running": True}
    c = await asyncio.wait_for(run_c, 30)
    assert c["state"].execution_meta.interrupt_reason == "stop_requested"
    await cp.arelease()


@pytest.mark.asyncio
async def test_a_stop_that_found_no_holder_does_not_stop_a_turn_that_starts_meanwhile(cp: Any) -> None:
    """(session 36) ``stop()`` read the lease when no run held it (the last turn had ended), and
    wrote a request naming nobody, which every run obeyed: a turn starting between that read and
    the state read (which then said running) was stopped mid-node. The request names the lease's
    last token now, which every later run holds a greater one than."""
    entered = [asyncio.Event() for _ in range(2)]
    release = [asyncio.Event() for _ in range(2)]
    app = _graph(cp, entered, release)
    cfg = {"thread_id": "t-no-holder", "user_id": "alice"}

    def turn(i: int) -> Any:
        return _turn(app, cfg, i)

    release[0].set()
    await asyncio.wait_for(turn(0), 30)
    real, started = cp.aget_state, []

    async def held(config: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if not started:  # stop()'s state read, after its lease read: the next turn starts here
            started.append(turn(1))
            await asyncio.wait_for(entered[1].wait(), 30)
        return await real(config, *args, **kwargs)

    cp.aget_state = held
    assert await app.astop(dict(cfg)) == {"ok": True, "running": True}
    cp.aget_state = real
    # A run that obeyed the request would end within a poll (about a second); the wait only gives
    # a wrong run the time to stop, it cannot fail a right one.
    done, _ = await asyncio.wait({started[0]}, timeout=3.0)
    assert not done, started[0].result()["state"].execution_meta
    release[1].set()
    b = await asyncio.wait_for(started[0], 30)
    assert (b["state"].execution_meta.status, b["messages"][-1].text()) == ("completed", "turn 1 done")
    await cp.arelease()


@pytest.mark.asyncio
async def test_a_preemption_asked_while_a_stale_stop_is_pending_is_asked_again(cp: Any) -> None:
    """(session 36) A preemption (``on_busy="interrupt"``) is written only where no request is
    pending; one asked while a stale stop (aimed at an earlier run, from another process: no
    signal here) was pending was never asked again, and the caller waited out ``busy_timeout``
    although the running turn cleared the stale request at its next poll. It asks on each wait
    until written now."""
    from tenxgraph import _core

    entered = asyncio.Event()
    app = _looping(cp, entered)
    cfg = {"thread_id": "t-preempt-stale", "user_id": "alice", "recursion_limit": 10000}
    long = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("long")]}, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 30)
    await cp.aput_cache_value("stop_request", _core.stop_key("t-preempt-stale", "alice"),
                              {"stop": True, "token": 10**12})
    out = await asyncio.wait_for(
        app.ainvoke({"messages": [Message.text_message("urgent")]}, dict(cfg, on_busy="interrupt", busy_timeout=60)), 90)
    assert out["messages"][-1].text().startswith("step")
    assert [m.text() for m in out["messages"] if m.role == "user"][-1] == "urgent"
    interrupted = await asyncio.wait_for(long, 30)
    assert interrupted["messages"][-1].role == "assistant"
    await cp.arelease()


@pytest.mark.asyncio
async def test_a_preemption_whose_requester_gave_up_does_not_keep_the_next_one_out(cp: Any) -> None:
    """(second red-team, session 36) A preempter cancelled while waiting leaves its request; the
    running turn finds it void (its requester is gone) and does not obey it, but left it stored:
    preemptions are written only where nothing is pending, so the next preempter waited out
    ``busy_timeout``. The void request is cleared now."""
    entered, hold = asyncio.Event(), asyncio.Event()
    app = _looping(cp, entered, hold)
    cfg = {"thread_id": "t-void-preempt", "user_id": "alice", "recursion_limit": 10000}
    long = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("long")]}, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 30)
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("first")]},
                                            dict(cfg, on_busy="interrupt", busy_timeout=600)))
    for _ in range(600):  # until its request is stored (the running node holds meanwhile)
        if await cp.ais_stop_requested(dict(cfg)):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the first preemption was never written")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    hold.set()
    out = await asyncio.wait_for(
        app.ainvoke({"messages": [Message.text_message("urgent")]}, dict(cfg, on_busy="interrupt", busy_timeout=60)), 90)
    assert [m.text() for m in out["messages"] if m.role == "user"][-1] == "urgent"
    await asyncio.wait_for(long, 30)
    await cp.arelease()
