"""Differences with 10xGraph 0.10.0 found by a seeded differential fuzzer (session 19): each case
is run on every backend, and where it matters the same script on the real 10xGraph through the
``oracle`` fixture (tests_py/oracle.py)."""

from __future__ import annotations

import pytest

from tenxgraph import Message

from .reply_graph import SOURCE, reply_graph


@pytest.mark.asyncio
async def test_a_new_message_after_a_pause_after_the_last_node_is_a_new_turn(checkpointer, make_thread) -> None:
    """Paused after the graph's last node (its next node is END), a new message used to be stored,
    run no node and complete the thread: the user was never answered. It is a new turn from the
    entry, as in 10xGraph, and pauses after the node again."""
    app = reply_graph(checkpointer, interrupt_after=["reply"])
    cfg = {"thread_id": make_thread("pause-end")}
    first = await app.ainvoke({"messages": [Message.text_message("first")]}, config=cfg)
    assert [m.text() for m in first["messages"]] == ["first", "reply to first"]
    second = await app.ainvoke({"messages": [Message.text_message("second")]}, config=cfg)
    assert [m.text() for m in second["messages"]] == ["second", "reply to second"]
    state = await checkpointer.aget_state(cfg)
    assert [m.text() for m in state.context] == ["first", "reply to first", "second", "reply to second"]
    assert state.execution_meta.status.value == "interrupted_after"
    # The reviewer's "go on" ends the turn there, running nothing again (10xGraph ran the node
    # again and paused after it again, for every "go on"), and answers with the turn as stored,
    # as `{}` on a finished thread does; a stream yields it too.
    done = await app.ainvoke({}, config=cfg)
    assert [m.text() for m in done["messages"]] == ["second", "reply to second"]
    state = await checkpointer.aget_state(cfg)
    assert [m.text() for m in state.context] == ["first", "reply to first", "second", "reply to second"]
    assert state.execution_meta.status.value == "completed"


@pytest.mark.asyncio
async def test_a_stream_told_to_go_on_after_the_last_node_yields_the_turn(checkpointer, make_thread) -> None:
    app = reply_graph(checkpointer, interrupt_after=["reply"])
    cfg = {"thread_id": make_thread("pause-end-stream")}
    await app.ainvoke({"messages": [Message.text_message("first")]}, config=cfg)
    texts = [c.message.text() async for c in app.astream({}, config=cfg) if c.message is not None]
    assert texts == ["reply to first"]
    state = await checkpointer.aget_state(cfg)
    assert state.execution_meta.status.value == "completed"
    assert [m.text() for m in state.context] == ["first", "reply to first"]


def test_a_new_message_after_a_pause_after_the_last_node_matches_10xgraph(oracle) -> None:
    script = SOURCE + """
import asyncio
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

cp = InMemoryCheckpointer()
app = reply_graph(cp, interrupt_after=["reply"])

async def main():
    cfg = {"thread_id": "t1"}
    await app.ainvoke({"messages": [Message.text_message("first")]}, config=cfg)
    r2 = await app.ainvoke({"messages": [Message.text_message("second")]}, config=cfg)
    st = await cp.aget_state(cfg)
    return {"r2": [m.text() for m in r2["messages"]], "context": [m.text() for m in st.context],
            "status": st.execution_meta.status.value}

emit(asyncio.run(main()))
"""
    theirs, ours = oracle.run_both(script)
    assert theirs["r2"] == ["second", "reply to second"], theirs
    assert ours == theirs
