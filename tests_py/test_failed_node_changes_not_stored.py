"""A node that changed the state in place and then failed (raised, hit ``node_timeout``, was
stopped; or its AI ``before_invoke`` callback did and raised) runs again from its start on the
retry: what it changed before is not stored with the failure (helper red-team, session 35).

It was: a counter bumped twice, a note in the thread twice after ``ainvoke({})``. The pause at
``interrupt()`` already stored the state the node started from (session 25); a failure now does
the same. 10xGraph stores the changed state (docs/differences.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.utils import CallbackManager, InvocationType


class Counted(AgentState):
    counter: int = 0


def _bump(state: Counted) -> None:
    state.counter += 1
    state.context.append(Message.text_message(f"note {state.counter}", role="assistant"))


def _one_node(node: Any, checkpointer: Any, mgr: CallbackManager) -> Any:
    g = StateGraph(Counted)
    g.add_node("m", node)
    g.set_entry_point("m")
    g.add_edge("m", END)
    return g.compile(checkpointer=checkpointer, callback_manager=mgr)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["raise", "callback", "node_timeout", "stop"])
async def test_what_a_failed_node_changed_in_place_is_not_stored(checkpointer: Any, make_thread: Any, how: str) -> None:
    failing = True
    entered = asyncio.Event()

    def audit(context: Any, data: Any) -> Any:  # an AI before_invoke that records, then fails
        _bump(data["state"])
        if failing:
            raise RuntimeError("audit service down")
        return data

    async def node(state: Counted) -> Message:
        if how != "callback":
            _bump(state)
            entered.set()
            if failing:
                if how == "raise":
                    raise RuntimeError("model down")
                await asyncio.sleep(60)  # cut by node_timeout or stop()
        return Message.text_message("ok", role="assistant")

    mgr = CallbackManager()
    if how == "callback":
        mgr.register_before_invoke(InvocationType.AI, audit)
    app = _one_node(node, checkpointer, mgr)
    cfg = {"thread_id": make_thread(), "node_timeout": 0.5 if how == "node_timeout" else 60}
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg)))
    if how == "stop":
        await asyncio.wait_for(entered.wait(), 30)
        assert (await app.astop(dict(cfg)))["running"] is True
    with pytest.raises(Exception) if how != "stop" else contextlib.nullcontext():
        await asyncio.wait_for(run, 60)

    stored = await checkpointer.aget_state(dict(cfg))
    assert (stored.counter, [m.text() for m in stored.context]) == (0, ["hi"])
    assert stored.execution_meta.status == ("interrupted_after" if how == "stop" else "error")

    failing = False
    await app.ainvoke({}, dict(cfg))
    done = await checkpointer.aget_state(dict(cfg))
    assert (done.counter, [m.text() for m in done.context]) == (1, ["hi", "note 1", "ok"])


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["raise", "node_timeout"])
async def test_on_graph_error_sees_the_start_state_and_what_it_returns_is_stored(
    checkpointer: Any, make_thread: Any, how: str
) -> None:
    """The error hook sees the state the failed node started from, and a state it returns is what
    the failure stores, also when the engine commits a node_timeout before the node unwound."""
    from tenxgraph.utils import GraphLifecycleHook

    seen: list[int] = []

    class OnError(GraphLifecycleHook):
        async def on_graph_error(self, ctx, error, partial_state, messages, step, node_name):  # type: ignore[no-untyped-def]
            seen.append(partial_state.counter)
            partial_state.counter = 42
            return partial_state, "handled"

    async def node(state: Counted) -> Message:
        _bump(state)
        if how == "raise":
            raise RuntimeError("model down")
        await asyncio.sleep(60)
        return Message.text_message("never", role="assistant")

    mgr = CallbackManager()
    mgr.register_lifecycle_hook(OnError())
    app = _one_node(node, checkpointer, mgr)
    cfg = {"thread_id": make_thread(), "node_timeout": 0.5 if how == "node_timeout" else 60}
    with pytest.raises(Exception):
        await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg)), 60)
    stored = await checkpointer.aget_state(dict(cfg))
    assert seen == [0]
    assert (stored.counter, [m.text() for m in stored.context]) == (42, ["hi"])
