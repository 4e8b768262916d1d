"""What a long-lived process must get right when its objects are done with: a checkpointer used
after ``arelease()`` (or after ``aclose()`` of another graph compiled with it) fails for good, not
with an error a caller is told to retry; a closed graph's publisher is freed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenxgraph.core.exceptions import StorageError, TransientStorageError
from tests_py.conftest import make_checkpointer


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_released_checkpointer_fails_for_good_not_transiently(kind: str, request: pytest.FixtureRequest,
                                                                      tmp_path: Path) -> None:
    """Postgres raised TransientStorageError "the database is unreachable" after arelease: the
    docs say retry it, and no retry could ever pass (a retry loop spun for ever)."""
    cp = make_checkpointer(kind, request, tmp_path)
    cfg = {"thread_id": "released"}
    await cp.aget_state(cfg)
    await cp.arelease()
    for call in (lambda: cp.aget_state(cfg), lambda: cp.alist_threads(cfg)):
        with pytest.raises(StorageError) as err:
            await call()
        assert not isinstance(err.value, TransientStorageError), repr(err.value)
        assert err.value.error_code == "STORAGE_001", repr(err.value)
        if kind == "postgres":
            assert "closed" in str(err.value), str(err.value)


@pytest.mark.asyncio
async def test_a_graph_per_request_frees_a_publisher_that_takes_no_attribute_at_close() -> None:
    """A publisher that refuses attributes (``__slots__``, not a BasePublisher) has its outbox kept
    beside it by the runtime; that entry held the publisher for the life of the process, one per
    graph built (a graph per request): 200 graphs kept 200 publishers."""
    import gc

    from tenxgraph import END, START, AgentState, Message, StateGraph
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    class SlottedPublisher:
        __slots__ = ("config", "published")

        def __init__(self) -> None:
            self.config: dict = {}
            self.published = 0

        async def publish(self, event) -> None:
            self.published += 1

        async def close(self) -> None:
            pass

        def sync_close(self) -> None:
            pass

    async def reply(state: AgentState) -> Message:
        return Message.text_message("ok", role="assistant")

    for i in range(200):
        g = StateGraph(AgentState, publisher=SlottedPublisher())
        g.add_node("reply", reply)
        g.add_edge(START, "reply")
        g.add_edge("reply", END)
        app = g.compile(checkpointer=InMemoryCheckpointer())
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": f"pub-{i}"})
        await app.aclose()
    del g, app
    gc.collect()
    alive = sum(1 for o in gc.get_objects() if type(o) is SlottedPublisher)
    # The injection container keeps the last graph compiled bound, as 10xGraph's does: one at most.
    assert alive <= 1, alive
