"""A run's lease and its input in one commit (issue 16 item 3): the run loads the thread without
the lease, then takes the lease and writes its input in one transaction. A thread that became busy
or moved in between is refused with nothing written, and the run starts again the usual way
(lease first, under its ``on_busy`` policy). The in-between is reached deterministically through
an ``on_graph_start`` hook, which runs after the load and before the input commit."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import ThreadBusyError
from tenxgraph.testing import CrashKit
from tenxgraph.utils import CallbackManager, GraphLifecycleHook
from tests_py.crash_agents.lease_agent import open_db

TARGET = "tests_py.kit_agents.support:build"


def _texts(state: Any) -> list[str]:
    return [m.text() for m in state.context]


def _reply(state: AgentState) -> Message:
    return Message.text_message(f"reply to {state.context[-1].text()}", role="assistant")


class _InBetween(GraphLifecycleHook):
    """Runs ``action`` once, at the first start of a run whose input is ``trigger``."""

    def __init__(self, trigger: str) -> None:
        self.trigger = trigger
        self.action: Any = None
        self.starts: list[str] = []

    async def on_graph_start(self, ctx: Any, state: Any) -> Any:
        text = state.context[-1].text() if state.context else ""
        self.starts.append(text)
        if text == self.trigger and self.action is not None:
            action, self.action = self.action, None
            await action()
        return state


def _app(checkpointer: Any, hook: _InBetween) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", _reply)
    g.add_edge("model", END)
    g.set_entry_point("model")
    mgr = CallbackManager()
    mgr.register_lifecycle_hook(hook)
    return g.compile(checkpointer=checkpointer, callback_manager=mgr)


def _turn(text: str) -> dict[str, Any]:
    return {"messages": [Message.text_message(text, role="user")]}


@pytest.mark.asyncio
async def test_a_thread_moved_between_the_load_and_the_input_commit_is_refused_and_the_turn_runs_after(
    checkpointer: Any, make_thread: Any
) -> None:
    """Another writer commits a whole turn after this run loaded the thread: this run's input is
    not written against the old version; it loads again and its turn follows the other one. Before
    the change the run held the lease while loading, so the other turn was refused instead."""
    hook = _InBetween("mine")
    app = _app(checkpointer, hook)
    tid = make_thread()
    cfg = {"thread_id": tid}
    await app.ainvoke(_turn("first"), cfg)

    async def other_turn() -> None:
        await app.ainvoke(_turn("other"), {"thread_id": tid, "run_id": "other-run"})

    hook.action = other_turn
    await app.ainvoke(_turn("mine"), {"thread_id": tid, "run_id": "my-run"})
    state = await checkpointer.aget_state(cfg)
    assert _texts(state) == ["first", "reply to first", "other", "reply to other", "mine", "reply to mine"]
    # The refused start's hook ran; the start under the lease does not run it again.
    assert hook.starts == ["first", "mine", "other"]
    lease = await checkpointer.aget_lease(cfg)
    assert lease is not None and lease["released"]


@pytest.mark.asyncio
@pytest.mark.parametrize("on_busy", ["reject", "wait"])
async def test_a_thread_taken_between_the_load_and_the_input_commit_is_refused_before_anything_is_written(
    checkpointer: Any, make_thread: Any, on_busy: str
) -> None:
    """Another run takes the lease after this run loaded the thread (it holds it at its
    ``after_lease`` delay). The input commit is refused with nothing written; then ``reject``
    raises ThreadBusyError (no row of this run's input is ever stored) and ``wait`` runs the turn
    once the other run is done, after it."""
    hook = _InBetween("mine")
    app = _app(checkpointer, hook)
    tid = make_thread()
    cfg = {"thread_id": tid}
    holder: list[asyncio.Task[Any]] = []

    async def take_the_lease() -> None:
        holder.append(asyncio.create_task(app.ainvoke(
            _turn("holder"), {"thread_id": tid, "run_id": "holder-run", "failpoints": f"after_lease:{tid}=delay(1500)"})))
        for _ in range(3000):  # polled, generous: the other run's lease is committed
            lease = await checkpointer.aget_lease(cfg)
            if lease is not None and not lease["released"] and lease["holder"] == "holder-run":
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the holder never took its lease")

    hook.action = take_the_lease
    run_cfg = {"thread_id": tid, "run_id": "my-run", "on_busy": on_busy, "busy_timeout": 60}
    if on_busy == "reject":
        with pytest.raises(ThreadBusyError):
            await app.ainvoke(_turn("mine"), run_cfg)
        # While the holder is still before its load: nothing of this run is stored.
        assert await checkpointer.aget_state(cfg) is None
        await holder[0]
        assert _texts(await checkpointer.aget_state(cfg)) == ["holder", "reply to holder"]
    else:
        await app.ainvoke(_turn("mine"), run_cfg)
        await holder[0]
        assert _texts(await checkpointer.aget_state(cfg)) == ["holder", "reply to holder", "mine", "reply to mine"]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return sqlite_db if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


@pytest.mark.asyncio
async def test_a_kill_between_the_load_and_the_input_commit_leaves_nothing_behind(crash_kit: CrashKit, db: str) -> None:
    """SIGKILL after the optimistic load, before the transaction: no lease row and no state is
    left (before the change the lease was committed first, so the crash left a lease behind), and
    the next run of the thread goes ahead at once and runs every tool once."""
    tid = f"kill-{os.getpid()}"
    crashed = crash_kit.run_until_crash(TARGET, tid, failpoints=f"before_input_tx:{tid}=kill", db=db,
                                        input="charge order 4821")
    assert crashed.killed
    cp = open_db(db)
    try:
        assert await cp.aget_lease({"thread_id": tid}) is None
        assert await cp.aget_state({"thread_id": tid}) is None
    finally:
        await cp.arelease()
    assert crash_kit.effects is not None and crash_kit.effects.all() == []
    done = crash_kit.resume(TARGET, tid, db=db, input="charge order 4821")
    assert done.status == "completed"
    crash_kit.effects.assert_exactly_once("lookup_order", "charge_card", "send_receipt")
