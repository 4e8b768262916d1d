"""What a thread paused for the client's tools takes (helper red-team, session 30).

At a remote-tool pause a user message, a bare ``{}``, or results for other ids went on past the
tool node with the client's call unanswered (10xGraph 0.10 takes them too): every provider
refuses such a history from then on. A client's retry of its results after the thread moved on
answered the call a second time and had the model answer twice. Each is now ``ThreadBusyError``
STORAGE_BUSY_001 with nothing written; the client's results, alone or followed by more messages,
still resume.
"""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import ThreadBusyError
from tenxgraph.core.state.message_block import ToolResultBlock

from .kit_agents.remote import build


def _result(call_id: str, output: str = "CLIP") -> Message:
    return Message.tool_message([ToolResultBlock(call_id=call_id, output=output, status="completed")])


async def _paused(checkpointer: Any, make_thread: Any) -> tuple[Any, dict[str, Any]]:
    app = build(checkpointer)
    cfg = {"thread_id": make_thread("remote"), "user_id": "u1"}
    await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    state = await checkpointer.aget_state(dict(cfg))
    assert state.execution_meta.interrupt_reason == "remote_tool_call"
    return app, cfg


async def _snapshot(checkpointer: Any, cfg: dict[str, Any]) -> tuple[Any, ...]:
    c = dict(cfg)
    state = await checkpointer.aget_state(c)
    return (c["_checkpoint_version"], state.execution_meta.status, state.execution_meta.interrupt_reason,
            [m.message_id for m in state.context])


@pytest.mark.asyncio
@pytest.mark.parametrize("sent", ["user_message", "bare", "other_id", "local_call_id", "state_only"])
async def test_input_that_is_not_the_clients_results_is_refused_with_nothing_written(
        checkpointer: Any, make_thread: Any, sent: str) -> None:
    app, cfg = await _paused(checkpointer, make_thread)
    before = await _snapshot(checkpointer, cfg)
    data: dict[str, Any] = {
        "user_message": {"messages": [Message.text_message("hello?")]},
        "bare": {},
        "other_id": {"messages": [_result("zzz")]},
        # c1 is the local call, answered by the tool node already; c2 is still the client's.
        "local_call_id": {"messages": [_result("c1", "FAKE"), _result("c2")]},
        "state_only": {"state": {"context_summary": "x"}},
    }[sent]
    with pytest.raises(ThreadBusyError) as e:
        await app.ainvoke(data, dict(cfg))
    assert e.value.error_code == "STORAGE_BUSY_001"
    assert "'c2'" in str(e.value)
    assert await _snapshot(checkpointer, cfg) == before
    # The client's results still resume it.
    out = await app.ainvoke({"messages": [_result("c2")]}, dict(cfg))
    assert out["messages"][-1].text() == "done: 3 | CLIP"


@pytest.mark.asyncio
async def test_results_sent_again_after_the_thread_moved_on_are_refused(checkpointer: Any, make_thread: Any) -> None:
    app, cfg = await _paused(checkpointer, make_thread)
    await app.ainvoke({"messages": [_result("c2")]}, dict(cfg))
    before = await _snapshot(checkpointer, cfg)
    with pytest.raises(ThreadBusyError) as e:
        await app.ainvoke({"messages": [_result("c2", "AGAIN")]}, dict(cfg))
    assert e.value.error_code == "STORAGE_BUSY_001" and "already" in str(e.value)
    assert await _snapshot(checkpointer, cfg) == before


@pytest.mark.asyncio
async def test_the_clients_results_followed_by_a_new_message_are_taken(checkpointer: Any, make_thread: Any) -> None:
    app, cfg = await _paused(checkpointer, make_thread)
    await app.ainvoke({"messages": [_result("c2"), Message.text_message("and more")]}, dict(cfg))
    state = await checkpointer.aget_state(dict(cfg))
    roles = [m.role for m in state.context]
    # The results answer the waiting call, then the new message is a turn of its own (the kit's
    # model asks for the tools again).
    assert roles[:5] == ["user", "assistant", "tool", "tool", "user"], roles


@pytest.mark.asyncio
@pytest.mark.parametrize("reused", ["user", "assistant", "local_result"])
async def test_a_result_under_an_id_the_thread_holds_is_stored_under_a_new_id(
        checkpointer: Any, make_thread: Any, reused: str) -> None:
    """The merge dropped a sent message whose id the thread held already: the client's result
    vanished and the run went on with the call unanswered (helper red-team, session 34; 10xGraph
    0.10 drops it too). A client that names its results the same way each time hit it on its
    second remote call."""
    app, cfg = await _paused(checkpointer, make_thread)
    state = await checkpointer.aget_state(dict(cfg))
    taken = {"user": state.context[0], "assistant": state.context[1], "local_result": state.context[2]}[reused]
    answer = _result("c2").model_copy(update={"message_id": taken.message_id})
    out = await app.ainvoke({"messages": [answer]}, dict(cfg))
    assert out["messages"][-1].text() == "done: 3 | CLIP"
    state = await checkpointer.aget_state(dict(cfg))
    results = [b.call_id for m in state.context if m.role == "tool" for b in m.content
               if isinstance(b, ToolResultBlock)]
    assert results == ["c1", "c2"], results
    ids = [m.message_id for m in state.context]
    assert len(ids) == len(set(ids))


@pytest.mark.asyncio
@pytest.mark.parametrize("shape", ["two_messages", "two_blocks"])
async def test_two_results_for_one_call_in_one_request_are_refused(
        checkpointer: Any, make_thread: Any, shape: str) -> None:
    """Both were stored: the call answered twice (a second answer in a later request was refused
    already)."""
    app, cfg = await _paused(checkpointer, make_thread)
    before = await _snapshot(checkpointer, cfg)
    if shape == "two_messages":
        sent = [_result("c2", "A"), _result("c2", "B")]
    else:
        sent = [Message.tool_message([ToolResultBlock(call_id="c2", output="A", status="completed"),
                                      ToolResultBlock(call_id="c2", output="B", status="completed")])]
    with pytest.raises(ThreadBusyError) as e:
        await app.ainvoke({"messages": sent}, dict(cfg))
    assert e.value.error_code == "STORAGE_BUSY_001" and "'c2'" in str(e.value)
    assert await _snapshot(checkpointer, cfg) == before


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["another_thread", "deleted_thread", "new_thread"])
async def test_results_for_a_call_the_thread_never_made_are_refused(
        checkpointer: Any, make_thread: Any, where: str) -> None:
    """(session 36) A thread not paused took them as a new turn (10xGraph does): a tool message
    answering no call, which every provider refuses on each later turn. Sent to the wrong
    thread, after the paused thread was deleted, or to a new thread: refused, nothing written."""
    app, cfg = await _paused(checkpointer, make_thread)
    target = {"thread_id": make_thread("other"), "user_id": "u1"}
    if where == "another_thread":
        await app.ainvoke({"messages": [_result("c2")]}, dict(cfg))  # finished: zz9 is no call of its
        target = cfg
    elif where == "deleted_thread":
        await checkpointer.aclean_thread(dict(cfg))
        target = cfg
    before = await checkpointer.aget_state(dict(target))
    with pytest.raises(ThreadBusyError) as e:
        await app.ainvoke({"messages": [_result("zz9")]}, dict(target))
    assert e.value.error_code == "STORAGE_BUSY_001" and "never asked" in str(e.value) and "'zz9'" in str(e.value)
    after = await checkpointer.aget_state(dict(target))
    assert (None if after is None else [m.message_id for m in after.context]) == (
        None if before is None else [m.message_id for m in before.context])


@pytest.mark.asyncio
async def test_input_is_judged_on_the_thread_as_stored_not_on_a_kept_copy(checkpointer: Any, make_thread: Any) -> None:
    """(session 36) A graph keeps the state of its last commit to start the next turn without a
    read; input it refused was refused on that copy. Another worker answered the pause since
    (another graph here: its own copy): this graph's new message was refused with
    ``ThreadBusyError`` naming a pause that was no longer there. Judged on a read now."""
    app, cfg = await _paused(checkpointer, make_thread)
    other = build(checkpointer)
    await other.ainvoke({"messages": [_result("c2")]}, dict(cfg))
    out = await app.ainvoke({"messages": [Message.text_message("and now?")]}, dict(cfg))
    assert [m.role for m in out["messages"]][:1] == ["user"]
    state = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in state.context if m.role == "user"] == ["hi", "and now?"]
