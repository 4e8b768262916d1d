"""State classes made per request do not stay alive for the process (soak red-team, session 35).

The caches keyed by a model class (the stored state's header, the required-null plan, the dump
walk's shapes in the Rust core) held every class ever used: a factory that defines a state class
per request kept each one, ~22 KB apiece, for good (10xGraph 0.10 keeps them too). Each cache is
now cleared when it holds ``CLASS_CACHE_SIZE`` classes, so at most that many stay alive through
them.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph._required_nulls import CLASS_CACHE_SIZE
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


def _graph_with_its_own_state_class() -> tuple[Any, type]:
    class RequestState(AgentState):
        tenant: str = "t"

    def model(state: RequestState) -> Message:
        return Message.text_message("hi", role="assistant")

    g = StateGraph(RequestState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=InMemoryCheckpointer()), RequestState


@pytest.mark.asyncio
async def test_state_classes_made_per_request_are_not_kept_past_the_cache_bound() -> None:
    made = 2 * CLASS_CACHE_SIZE + 50
    refs: list[weakref.ref[type]] = []
    for i in range(made):
        app, cls = _graph_with_its_own_state_class()
        refs.append(weakref.ref(cls))
        out = await app.ainvoke({"messages": [Message.text_message("hello")]}, {"thread_id": f"t{i}"})
        assert out["messages"][-1].text() == "hi"
        await app.aclose()
        del app, cls, out
    gc.collect()
    alive = sum(1 for r in refs if r() is not None)
    assert alive <= CLASS_CACHE_SIZE + 5, f"{alive} of {made} per-request state classes still alive"
