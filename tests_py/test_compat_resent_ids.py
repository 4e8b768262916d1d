"""A turn whose input message ids the thread already holds: a frontend that sends the whole
history each turn with placeholder ids (10xGraph's own example: ``id="0"``), or a turn sent again
under the id of an earlier one. 10xGraph adds the last user message under a new id so the user is
answered. Until session 24 the input was dropped and the run went on: the model answered its own
last reply, and a new text under an old id was lost while the response showed it as sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.utils.interrupt import interrupt

from .reply_graph import SOURCE, reply_graph


def _texts(messages: list[Message]) -> list[str]:
    return [m.text() for m in messages]


@pytest.mark.asyncio
async def test_a_user_message_sent_again_under_its_id_is_answered_as_a_new_turn(checkpointer: Any, make_thread: Any) -> None:
    app = reply_graph(checkpointer)
    cfg = {"thread_id": make_thread("resent")}
    await app.ainvoke({"messages": [Message.text_message("hello", message_id="m1")]}, config=cfg)
    again = await app.ainvoke({"messages": [Message.text_message("other", message_id="m1")]}, config=cfg)
    assert _texts(again["messages"]) == ["other", "reply to other"]
    new_id = again["messages"][0].message_id
    assert new_id not in ("m1", "", None)
    state = await checkpointer.aget_state(cfg)
    assert [(m.message_id, m.text()) for m in state.context][2] == (new_id, "other")
    assert _texts(state.context) == ["hello", "reply to hello", "other", "reply to other"]
    assert len({m.message_id for m in state.context}) == 4


@pytest.mark.asyncio
async def test_a_frontend_sending_the_whole_history_with_placeholder_ids(checkpointer: Any, make_thread: Any) -> None:
    app = reply_graph(checkpointer)
    cfg = {"thread_id": make_thread("placeholder")}
    history: list[Message] = []
    for text in ("one", "two", "three"):
        history.append(Message.text_message(text, message_id="0"))
        out = await app.ainvoke({"messages": [m.model_copy() for m in history]}, config=cfg)
        assert _texts(out["messages"]) == [text, f"reply to {text}"]
        history.append(Message.text_message(f"reply to {text}", role="assistant", message_id="0"))
    state = await checkpointer.aget_state(cfg)
    assert _texts(state.context) == ["one", "reply to one", "two", "reply to two", "three", "reply to three"]


@pytest.mark.asyncio
async def test_a_message_sent_again_at_a_pending_question_is_not_added(checkpointer: Any, make_thread: Any) -> None:
    """Paused at an ``interrupt()`` the turn is not over: the resend is refused as any new
    message there is (10xGraph's ValueError and text), and nothing is added under a new id."""

    def ask(state: AgentState) -> Message:
        answer = interrupt("ok?")
        return Message.text_message(f"answered {answer}", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("ask", ask)
    g.set_entry_point("ask")
    g.add_edge("ask", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("asked")}
    await app.ainvoke({"messages": [Message.text_message("hi", message_id="m1")]}, config=cfg)
    with pytest.raises(ValueError, match="paused at interrupt"):
        await app.ainvoke({"messages": [Message.text_message("hi", message_id="m1")]}, config=cfg)
    state = await checkpointer.aget_state(cfg)
    assert state.execution_meta.status.value == "interrupted_before"
    assert [(m.message_id, m.text()) for m in state.context] == [("m1", "hi")]


@pytest.mark.asyncio
async def test_two_new_input_messages_under_one_id_are_both_stored(checkpointer: Any, make_thread: Any) -> None:
    """The later one gets a new id (10xGraph stores both under the one id; the merge here kept
    the first, the model answered it, and the response showed the second)."""
    app = reply_graph(checkpointer)
    cfg = {"thread_id": make_thread("twins")}
    for first, second, twin_id in (("a", "b", "x"), ("c", "d", "y")):
        out = await app.ainvoke({"messages": [Message.text_message(first, message_id=twin_id),
                                              Message.text_message(second, message_id=twin_id)]}, config=cfg)
        assert _texts(out["messages"]) == [second, f"reply to {second}"]
    state = await checkpointer.aget_state(cfg)
    assert _texts(state.context) == ["a", "b", "reply to b", "c", "d", "reply to d"]
    assert len({m.message_id for m in state.context}) == 6
    assert state.context[0].message_id == "x"
    listed = await checkpointer.alist_messages(cfg)
    assert _texts(listed) == _texts(state.context)


@pytest.mark.asyncio
async def test_a_lone_delta_user_message_is_answered(checkpointer: Any, make_thread: Any) -> None:
    """A ``delta`` message is left out of the merge; sent alone it was lost, and the model
    answered its own reply. 10xGraph adds it (under a new id) and answers it."""
    app = reply_graph(checkpointer)
    for text, mid in (("again", "m1"), ("fresh", "m2")):
        tid = make_thread(f"delta-{mid}")
        cfg = {"thread_id": tid}
        await app.ainvoke({"messages": [Message.text_message("hello", message_id=f"{tid}-m1")]}, config=cfg)
        sent = Message.text_message(text, message_id=f"{tid}-{mid}")
        sent.delta = True
        out = await app.ainvoke({"messages": [sent]}, config=cfg)
        assert _texts(out["messages"]) == [text, f"reply to {text}"]
        after = await app.ainvoke({"messages": [Message.text_message("later", message_id=f"{tid}-m9")]}, config=cfg)
        assert _texts(after["messages"]) == ["later", "reply to later"]
        state = await checkpointer.aget_state(cfg)
        assert _texts(state.context) == ["hello", "reply to hello", text, f"reply to {text}", "later", "reply to later"]


@pytest.mark.asyncio
async def test_the_response_shows_the_user_message_the_thread_kept(checkpointer: Any, make_thread: Any) -> None:
    """With an input message under a stored id (not kept), the response showed it though the
    thread never stored it; 10xGraph's response starts with the context's last user message once
    the input is merged."""
    app = reply_graph(checkpointer)
    cases = (([("new", "m2", "user"), ("edited", "m1", "user")], ("new", "m2")),
             ([("a-new", "a9", "assistant"), ("edited", "m1", "user")], ("hello", "m1")))
    for n, (sent, first) in enumerate(cases):
        tid = make_thread(f"kept-{n}")
        cfg = {"thread_id": tid}  # message ids are one namespace per Postgres database: per thread here
        await app.ainvoke({"messages": [Message.text_message("hello", message_id=f"{tid}-m1")]}, config=cfg)
        out = await app.ainvoke({"messages": [Message.text_message(t, role=r, message_id=f"{tid}-{i}")
                                              for t, i, r in sent]}, config=cfg)
        assert (out["messages"][0].text(), out["messages"][0].message_id) == (first[0], f"{tid}-{first[1]}")
        state = await checkpointer.aget_state(cfg)
        assert "edited" not in _texts(state.context)


def test_resent_and_placeholder_ids_match_10xgraph(oracle: Any) -> None:
    script = SOURCE + """
import asyncio
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

cp = InMemoryCheckpointer()
app = reply_graph(cp)

def shape(messages):
    return [(m.role, m.text(), m.message_id in ("m1", "0")) for m in messages]

async def main():
    out = {}
    cfg = {"thread_id": "resent"}
    await app.ainvoke({"messages": [Message.text_message("hello", message_id="m1")]}, config=cfg)
    r = await app.ainvoke({"messages": [Message.text_message("hello", message_id="m1")]}, config=cfg)
    out["same_text"] = shape(r["messages"])
    r = await app.ainvoke({"messages": [Message.text_message("other", message_id="m1")]}, config=cfg)
    out["new_text"] = shape(r["messages"])
    out["context"] = shape((await cp.aget_state(cfg)).context)
    cfg = {"thread_id": "placeholder"}
    history = []
    for text in ("one", "two", "three"):
        history.append(Message.text_message(text, message_id="0"))
        r = await app.ainvoke({"messages": list(history)}, config=cfg)
        out["turn " + text] = shape(r["messages"])
        history.append(Message.text_message("reply to " + text, role="assistant", message_id="0"))
    out["placeholder context"] = [(m.role, m.text()) for m in (await cp.aget_state(cfg)).context]
    cfg = {"thread_id": "twins"}
    r = await app.ainvoke({"messages": [Message.text_message("a", message_id="x"),
                                        Message.text_message("b", message_id="x")]}, config=cfg)
    out["twins"] = [m.text() for m in r["messages"]]
    out["twins context"] = [m.text() for m in (await cp.aget_state(cfg)).context]
    cfg = {"thread_id": "delta"}
    await app.ainvoke({"messages": [Message.text_message("hello", message_id="m1")]}, config=cfg)
    lone = Message.text_message("again", message_id="m1")
    lone.delta = True
    out["lone delta"] = shape((await app.ainvoke({"messages": [lone]}, config=cfg))["messages"])
    cfg = {"thread_id": "kept"}
    await app.ainvoke({"messages": [Message.text_message("hello", message_id="m1")]}, config=cfg)
    r = await app.ainvoke({"messages": [Message.text_message("new", message_id="m2"),
                                        Message.text_message("edited", message_id="m1")]}, config=cfg)
    out["kept"] = [(m.text(), m.message_id) for m in r["messages"][:1]]
    return out

emit(asyncio.run(main()))
"""
    theirs, ours = oracle.run_both(script)
    assert theirs["new_text"] == [["user", "other", False], ["assistant", "reply to other", False]], theirs
    assert ours == theirs


@pytest.mark.asyncio
async def test_a_turn_sent_again_after_its_run_was_cut_off_finishes_it(checkpointer: Any, make_thread: Any) -> None:
    """A client's retry after a crash or a cancel (its turn's run cut off at the tool node): every
    input message is stored, so it is that turn's ``{}`` and the turn is finished. It was refused
    with ``STORAGE_BUSY_001`` (10xGraph appends the message after the unanswered tool calls). A
    new message there is still refused."""
    from tenxgraph.core.exceptions import ThreadBusyError

    from .tool_graphs import call, tool_graph, tool_texts

    runs: dict[str, int] = {}
    entered = asyncio.Event()

    async def pay(idempotency_key: str) -> str:
        runs["pay"] = runs.get("pay", 0) + 1
        if runs["pay"] == 1:
            entered.set()
            await asyncio.sleep(3600)
        return "paid"

    app = tool_graph(AgentState, [pay], [[call("c1", "pay")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("cut-off")}
    task = asyncio.ensure_future(app.ainvoke({"messages": [Message.text_message("go", message_id="m1")]}, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await checkpointer.aget_state(cfg)).execution_meta.status.value == "running"
    for other in (Message.text_message("something else", message_id="m2"),
                  Message.text_message("actually, cancel that", message_id="m1")):  # a changed text
        with pytest.raises(ThreadBusyError) as refused:
            await app.ainvoke({"messages": [other]}, dict(cfg))
        assert refused.value.error_code == "STORAGE_BUSY_001"
    done = await asyncio.wait_for(
        app.ainvoke({"messages": [Message.text_message("go", message_id="m1")]}, dict(cfg)), 60)
    assert [m.role for m in done["messages"]] == ["user", "tool", "assistant"]
    assert done["messages"][0].message_id == "m1" and tool_texts(done["messages"]) == {"c1": "paid"}
    state = await checkpointer.aget_state(cfg)
    assert state.execution_meta.status.value == "completed"
    assert [(m.role, m.text()) for m in state.context if m.role == "user"] == [("user", "go")]
    assert [m.role for m in state.context] == ["user", "assistant", "tool", "assistant"]
