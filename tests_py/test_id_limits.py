"""Thread, user and message ids: at most 255 characters and no NUL, on every backend.

PostgreSQL holds ids in 10xGraph's ``VARCHAR(255)`` columns and stores no U+0000 in text; such an
id used to fail inside a statement as ``STORAGE_001`` with the server's own words, while SQLite and
memory took it. Pinned here: every backend refuses it the same way, ``InvalidConfigError``
``STORAGE_CONFIG_002`` naming the field, before anything is read or written; 255 characters (also
multi-byte ones) work everywhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import InvalidConfigError
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.utils.thread_info import ThreadInfo

LONG = "t" * 256
WITH_NUL = "thread\x00one"


def msg(mid: str, text: str = "hi", role: str = "user") -> Message:
    return Message(message_id=mid, role=role, content=[TextBlock(text=text)])


def echo_app(cp: Any, reply_id: str | None = None):
    def model(state: AgentState) -> list[Message]:
        return [msg(reply_id or f"r-{len(state.context)}-{state.context[-1].message_id[:40]}", "reply", "assistant")]

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=cp)


def assert_refused(e: pytest.ExceptionInfo[InvalidConfigError], field: str, call: str = "") -> None:
    assert e.value.error_code == "STORAGE_CONFIG_002", call
    assert e.value.context["field"] == field, call
    assert "STORAGE_001" not in str(e.value), call


async def nothing_stored(cp: Any, user: str = "u1") -> None:
    assert await cp.alist_threads({"user_id": user}) == []


@pytest.mark.parametrize("bad", [LONG, WITH_NUL], ids=["256-chars", "nul"])
@pytest.mark.asyncio
async def test_bad_thread_id_is_refused_on_every_entry_point(checkpointer: Any, make_thread: Any, bad: str) -> None:
    cfg = {"thread_id": bad, "user_id": "u1"}
    calls = {
        "ainvoke": lambda: echo_app(checkpointer).ainvoke({"messages": [msg(make_thread("m"))]}, dict(cfg)),
        "aput_messages": lambda: checkpointer.aput_messages(dict(cfg), [msg(make_thread("m"))]),
        "aput_thread": lambda: checkpointer.aput_thread(dict(cfg), ThreadInfo(thread_id=bad, thread_name="x")),
        "aget_state": lambda: checkpointer.aget_state(dict(cfg)),
        "aget_thread": lambda: checkpointer.aget_thread(dict(cfg)),
        "alist_messages": lambda: checkpointer.alist_messages(dict(cfg)),
        "astop": lambda: echo_app(checkpointer).astop(dict(cfg)),
        "arequest_stop": lambda: checkpointer.arequest_stop(dict(cfg)),
        "ais_stop_requested": lambda: checkpointer.ais_stop_requested(dict(cfg)),
        "aclear_stop_request": lambda: checkpointer.aclear_stop_request(dict(cfg)),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidConfigError) as e:
            await call()
        assert_refused(e, "thread_id", name)
    await nothing_stored(checkpointer)
    # Redis is shared by every test of the session (and by parallel workers): only a key of this
    # id would be this test's.
    assert [k for k in await checkpointer.alist_cache_keys("stop_request") if k.startswith(bad[:200])] == []
    await checkpointer.arelease()


@pytest.mark.parametrize("bad", ["u" * 256, "user\x00"], ids=["256-chars", "nul"])
@pytest.mark.asyncio
async def test_bad_user_id_is_refused_and_nothing_is_written(checkpointer: Any, make_thread: Any, bad: str) -> None:
    thread = make_thread()
    cfg = {"thread_id": thread, "user_id": bad}
    with pytest.raises(InvalidConfigError) as e:
        await echo_app(checkpointer).ainvoke({"messages": [msg(make_thread("m"))]}, dict(cfg))
    assert_refused(e, "user_id")
    with pytest.raises(InvalidConfigError) as e:
        await checkpointer.aput_messages(dict(cfg), [msg(make_thread("m"))])
    assert_refused(e, "user_id")
    assert await checkpointer.alist_threads({}) == []
    await checkpointer.arelease()


@pytest.mark.parametrize("bad", ["m" * 256, "m\x00"], ids=["256-chars", "nul"])
@pytest.mark.asyncio
async def test_bad_message_id_is_refused_and_nothing_is_written(checkpointer: Any, make_thread: Any, bad: str) -> None:
    thread = make_thread()
    cfg = {"thread_id": thread, "user_id": "u1"}
    with pytest.raises(InvalidConfigError) as e:
        await checkpointer.aput_messages(dict(cfg), [msg(make_thread("ok")), msg(bad)])
    assert_refused(e, "message_id")
    with pytest.raises(InvalidConfigError) as e:
        await echo_app(checkpointer).ainvoke({"messages": [msg(bad)]}, dict(cfg))
    assert_refused(e, "message_id")
    await nothing_stored(checkpointer)
    assert await checkpointer.alist_messages(dict(cfg)) == []
    await checkpointer.arelease()


@pytest.mark.asyncio
async def test_a_node_reply_with_a_bad_message_id_fails_its_step_and_keeps_the_input(
    checkpointer: Any, make_thread: Any
) -> None:
    thread = make_thread()
    cfg = {"thread_id": thread, "user_id": "u1"}
    first = make_thread("m")
    with pytest.raises(InvalidConfigError) as e:
        await echo_app(checkpointer, reply_id="r" * 300).ainvoke({"messages": [msg(first)]}, dict(cfg))
    assert_refused(e, "message_id")
    # The input step had committed; the node's step wrote nothing.
    assert [m.message_id for m in await checkpointer.alist_messages(dict(cfg))] == [first]
    await checkpointer.arelease()


@pytest.mark.asyncio
async def test_ids_of_255_characters_work_on_every_backend(checkpointer: Any, make_thread: Any) -> None:
    # 255 characters of two bytes each: the limit counts characters, as VARCHAR(255) does.
    thread = (make_thread() + "é" * 255)[:255]
    user = "ü" * 255
    mid = (make_thread("m") + "x" * 255)[:255]
    cfg = {"thread_id": thread, "user_id": user}
    result = await echo_app(checkpointer, reply_id=(make_thread("r") + "y" * 255)[:255]).ainvoke(
        {"messages": [msg(mid)]}, dict(cfg))
    assert [m.text() for m in result["messages"]] == ["hi", "reply"]
    state = await checkpointer.aget_state(dict(cfg))
    assert [m.message_id for m in state.context][0] == mid
    info = await checkpointer.aget_thread(dict(cfg))
    assert info is not None and info.thread_id == thread and info.user_id == user
    await checkpointer.arelease()
