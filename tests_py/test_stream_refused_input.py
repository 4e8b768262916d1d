"""``astream`` of an input refused before its run starts yields nothing and raises, as 10xGraph
0.10 does (helper compatibility pass, session 33). Ours first yielded an ERROR chunk, as if a run
had failed, and for a new message to a thread paused at ``interrupt()`` also a MESSAGE chunk for
that message, which was never stored: a UI showed it as accepted."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.state.stream_chunks import StreamEvent
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils import interrupt


def graph(cp: InMemoryCheckpointer) -> Any:
    def ask(state: AgentState) -> Message:
        if "pause" in state.context[-1].text():
            interrupt({"q": "ok?"})
        return Message.text_message("done", role="assistant")

    def fail(state: AgentState) -> Message:
        if "fail" in [m for m in state.context if m.role == "user"][-1].text():
            raise RuntimeError("node failed")
        return Message.text_message("fine", role="assistant")

    g = StateGraph()
    g.add_node("ask", ask)
    g.add_node("fail", fail)
    g.add_edge(START, "ask")
    g.add_edge("ask", "fail")
    g.add_edge("fail", END)
    return g.compile(checkpointer=cp)


async def collect(app: Any, inp: dict[str, Any], cfg: dict[str, Any]) -> tuple[list[Any], BaseException | None]:
    chunks: list[Any] = []
    try:
        async for c in app.astream(inp, cfg):
            chunks.append(c)
    except Exception as exc:  # noqa: BLE001 - the test looks at it
        return chunks, exc
    return chunks, None


def hi(text: str) -> dict[str, Any]:
    return {"messages": [Message.text_message(text)]}


@pytest.mark.asyncio
async def test_a_refused_input_streams_nothing() -> None:
    cp = InMemoryCheckpointer()
    app = graph(cp)
    await app.ainvoke(hi("first"), {"thread_id": "done"})
    await app.ainvoke(hi("pause here"), {"thread_id": "paused"})
    refused = [
        ({"resume": "x"}, {"thread_id": "done"}),  # nothing to resume
        ({}, {"thread_id": "fresh"}),  # a new thread without messages
        (hi("a new message"), {"thread_id": "paused"}),  # paused at interrupt()
    ]
    for inp, cfg in refused:
        before = await cp.aget_state(cfg)
        chunks, exc = await collect(app, inp, cfg)
        assert isinstance(exc, ValueError), (cfg, exc)
        assert chunks == [], (cfg, [(c.event, c.message and c.message.text()) for c in chunks])
        after = await cp.aget_state(cfg)
        assert (before is None) == (after is None)
        if before is not None:
            assert [m.text() for m in after.context] == [m.text() for m in before.context]


@pytest.mark.asyncio
async def test_an_accepted_input_streams_first_and_a_failed_run_ends_with_its_error_chunk() -> None:
    app = graph(InMemoryCheckpointer())
    chunks, exc = await collect(app, hi("go"), {"thread_id": "ok"})
    assert exc is None
    texts = [c.message.text() for c in chunks if c.event == StreamEvent.MESSAGE]
    assert texts == ["go", "done", "fine"]
    chunks, exc = await collect(app, hi("fail now"), {"thread_id": "bad"})
    assert exc is not None
    assert [c.message.text() for c in chunks if c.event == StreamEvent.MESSAGE][:2] == ["fail now", "done"]
    assert chunks[-1].event == StreamEvent.ERROR
