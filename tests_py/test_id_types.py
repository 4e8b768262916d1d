"""Ids that are neither a str nor an int (helper red-team, session 31): a list, a dict, bytes, a
float or an object as ``thread_id`` (or ``user_id``) was stored as its ``str()``: a list id and
its text read one thread, and an object whose text holds its address got a new thread at every
run. Now ``InvalidConfigError`` ``STORAGE_CONFIG_002`` on the run and on the checkpointer, with
nothing written; a str, an int and a ``uuid.UUID`` are ids as before."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import InvalidConfigError

from .tool_graphs import one_reply_graph


class _Obj:
    pass


BAD = [["a", "b"], {"k": 1}, b"abc", 1.5, _Obj()]


@pytest.mark.asyncio
@pytest.mark.parametrize("field", ["thread_id", "user_id"])
@pytest.mark.parametrize("bad", BAD, ids=["list", "dict", "bytes", "float", "object"])
async def test_an_id_of_another_type_is_refused_and_nothing_is_written(field: str, bad: Any, checkpointer: Any,
                                                                       make_thread: Any) -> None:
    app = one_reply_graph(checkpointer)
    cfg = {"thread_id": make_thread("typed"), field: bad}
    with pytest.raises(InvalidConfigError) as err:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    assert err.value.error_code == "STORAGE_CONFIG_002" and field in str(err.value)
    with pytest.raises(InvalidConfigError):
        await checkpointer.aget_state(dict(cfg))
    assert await checkpointer.alist_threads({}) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("good", [7, uuid.UUID(int=7), "t"], ids=["int", "uuid", "str"])
async def test_str_int_and_uuid_ids_still_name_their_thread(good: Any, checkpointer: Any) -> None:
    app = one_reply_graph(checkpointer)
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": good})
    state = await checkpointer.aget_state({"thread_id": str(good)})
    assert state is not None and state.context[-1].text() == "ok"
