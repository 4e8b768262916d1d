"""Lifecycle hooks are waited for as a node is (session 36): the run renews its lease and answers
``stop()`` while they run.

Awaited bare, a hook slower than ``lease_ttl`` (a webhook in ``on_state_update``) let another
worker take the thread meanwhile, and the run's finished node was fenced out with
``LeaseLostError``; a hook that hung outlived ``stop()`` until ``node_timeout`` (900 s by default).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tenxgraph.core.exceptions import GraphRecursionError, ThreadBusyError
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END, CallbackManager, GraphLifecycleHook

from .conftest import make_checkpointer

pytestmark = pytest.mark.asyncio


class Holds(GraphLifecycleHook):
    """Holds the run in one hook (``point``, for node ``node``) until released, once."""

    def __init__(self, point: str, node: str | None = None) -> None:
        self.point, self.node = point, node
        self.entered, self.release = asyncio.Event(), asyncio.Event()
        self.cancelled = False

    async def _hold(self, node: str | None) -> None:
        if self.entered.is_set() or (self.node is not None and node != self.node):
            return
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def on_state_update(self, ctx, node_name, old_state, new_state, step):  # type: ignore[no-untyped-def]
        if self.point == "on_state_update":
            await self._hold(node_name)
        return new_state

    async def on_graph_start(self, ctx, state):  # type: ignore[no-untyped-def]
        if self.point == "on_graph_start":
            await self._hold(None)
        return state

    async def on_graph_end(self, ctx, final_state, messages, total_steps):  # type: ignore[no-untyped-def]
        if self.point == "on_graph_end":
            await self._hold(None)
        return final_state


def two_nodes(hook: Holds, cp, runs: list[str]):  # type: ignore[no-untyped-def]
    mgr = CallbackManager()
    mgr.register_lifecycle_hook(hook)
    g = StateGraph(AgentState)

    def model(state: AgentState) -> Message:
        runs.append("model")
        return Message.text_message("from model", role="assistant")

    def second(state: AgentState) -> Message:
        runs.append("second")
        return Message.text_message("from second", role="assistant")

    g.add_node("model", model)
    g.add_node("second", second)
    g.set_entry_point("model")
    g.add_edge("model", "second")
    g.add_edge("second", END)
    return g.compile(checkpointer=cp, callback_manager=mgr)


@pytest.mark.parametrize("kind", ["memory", "postgres", "postgres+redis"])
async def test_a_hook_slower_than_the_lease_keeps_the_thread(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, make_thread
) -> None:
    """The hook runs three lease lifetimes; a second caller meanwhile finds the thread busy (it
    took the lapsed lease before), and the run ends with its nodes stored."""
    cp = make_checkpointer(kind, request, tmp_path)
    hook, runs = Holds("on_state_update", "model"), []
    app = two_nodes(hook, cp, runs)
    cfg = {"thread_id": make_thread("slow-hook"), "lease_ttl": 1.0, "on_busy": "reject"}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg)))
    await asyncio.wait_for(hook.entered.wait(), 60)
    # Past the lease's lifetime with no node running: what is under test is that the run renews
    # it meanwhile (renewals every ttl/3), so no event can stand in for the wait.
    await asyncio.sleep(3.0)
    with pytest.raises(ThreadBusyError):
        await app.ainvoke({"messages": [Message.text_message("me too")]}, dict(cfg))
    hook.release.set()
    out = await asyncio.wait_for(first, 60)
    assert [m.text() for m in out["messages"]] == ["hi", "from model", "from second"]
    assert runs == ["model", "second"]
    state = await cp.aget_state(dict(cfg))
    assert str(state.execution_meta.status).endswith("completed")


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres+redis"])
async def test_stop_ends_a_hook_that_hangs_between_nodes(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, make_thread
) -> None:
    """``stop()`` while ``on_state_update`` hangs after ``model``: the hook is cancelled, the
    model's step is stored, the run stops before ``second``; a resume runs ``second`` only."""
    cp = make_checkpointer(kind, request, tmp_path)
    hook, runs = Holds("on_state_update", "model"), []
    app = two_nodes(hook, cp, runs)
    cfg = {"thread_id": make_thread("hung-hook"), "node_timeout": 600}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg)))
    await asyncio.wait_for(hook.entered.wait(), 60)
    assert (await app.astop(dict(cfg)))["running"] is True
    out = await asyncio.wait_for(first, 60)  # before: node_timeout (600 s here)
    assert hook.cancelled
    assert [m.text() for m in out["messages"]] == ["hi", "from model"]
    state = await cp.aget_state(dict(cfg))
    assert state.execution_meta.interrupt_reason == "stop_requested"
    assert state.execution_meta.current_node == "second"
    assert not await cp.ais_stop_requested(dict(cfg))
    hook.release.set()
    again = await asyncio.wait_for(app.ainvoke({}, dict(cfg)), 60)
    assert runs == ["model", "second"]
    assert [m.text() for m in again["messages"]][-1] == "from second"


@pytest.mark.parametrize("kind", ["memory", "postgres"])
async def test_stop_during_the_end_hook_ends_the_run_and_not_the_next_turn(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, make_thread
) -> None:
    """``stop()`` while ``on_graph_end`` hangs: the run ends completed at once (nothing was left
    to stop), and the request is answered: the thread's next turn runs to its end."""
    cp = make_checkpointer(kind, request, tmp_path)
    hook, runs = Holds("on_graph_end"), []
    app = two_nodes(hook, cp, runs)
    cfg = {"thread_id": make_thread("hung-end"), "node_timeout": 600}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg)))
    await asyncio.wait_for(hook.entered.wait(), 60)
    assert (await app.astop(dict(cfg)))["running"] is True
    await asyncio.wait_for(first, 60)
    assert hook.cancelled
    state = await cp.aget_state(dict(cfg))
    assert str(state.execution_meta.status).endswith("completed")
    assert not await cp.ais_stop_requested(dict(cfg))
    out = await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("again")]}, dict(cfg)), 60)
    assert [m.text() for m in out["messages"]][-1] == "from second"
    assert runs == ["model", "second", "model", "second"]


@pytest.mark.parametrize("kind", ["memory", "postgres"])
async def test_a_start_hook_slower_than_the_lease_keeps_the_thread(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, make_thread
) -> None:
    """A retry (``ainvoke({})`` takes the lease before anything else) whose ``on_graph_start``
    runs three lease lifetimes: a second caller meanwhile finds the thread busy (it took the
    lapsed lease before, and the retry's input commit was fenced out)."""
    cp = make_checkpointer(kind, request, tmp_path)
    hook, runs = Holds("nowhere"), []
    app = two_nodes(hook, cp, runs)
    cfg = {"thread_id": make_thread("slow-start"), "lease_ttl": 1.0, "on_busy": "reject"}
    with pytest.raises(GraphRecursionError):  # fails before "second"
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg, recursion_limit=1))
    hook.point = "on_graph_start"
    retry = asyncio.create_task(app.ainvoke({}, dict(cfg)))
    await asyncio.wait_for(hook.entered.wait(), 60)
    await asyncio.sleep(3.0)  # past the lease's lifetime: the run must renew it meanwhile
    with pytest.raises(ThreadBusyError):
        await app.ainvoke({"messages": [Message.text_message("me too")]}, dict(cfg))
    hook.release.set()
    out = await asyncio.wait_for(retry, 60)
    assert out["messages"][-1].text() == "from second"
