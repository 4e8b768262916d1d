"""Red team (session 9): thread names and thread metadata that one backend took and another
refused. PostgreSQL raised ``STORAGE_001`` with its own words for a name over 255 characters
(10xGraph's ``VARCHAR(255)`` column) and for a U+0000 in the name or the metadata, which SQLite
and memory stored, so ``aput_thread`` code that worked on one backend failed on another. Now,
on every backend: a name over 255 characters is ``InvalidConfigError`` ``STORAGE_CONFIG_002``
(``field`` ``thread_name``) before anything is written; a U+0000 is stored as every other text
is on PostgreSQL (U+FFFD there, with the ``nul_replaced`` warning), and the call succeeds."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph.core.exceptions import InvalidConfigError
from tenxgraph.utils.thread_info import ThreadInfo


@pytest.mark.asyncio
async def test_a_name_over_255_characters_is_refused_everywhere_and_nothing_is_written(
    checkpointer: Any, make_thread: Any
) -> None:
    cp = checkpointer
    new, named = make_thread("long-name-new"), make_thread("long-name-old")
    await cp.aput_thread({"thread_id": named}, ThreadInfo(thread_id=named, thread_name="before", metadata={"a": 1}))
    for tid in (new, named):
        with pytest.raises(InvalidConfigError) as info:
            await cp.aput_thread({"thread_id": tid}, ThreadInfo(thread_id=tid, thread_name="é" * 256, metadata={"b": 2}))
        assert info.value.error_code == "STORAGE_CONFIG_002" and info.value.context["field"] == "thread_name"
    assert await cp.aget_thread({"thread_id": new}) is None
    old = await cp.aget_thread({"thread_id": named})
    assert (old.thread_name, old.metadata) == ("before", {"a": 1})
    # 255 characters (510 bytes) fit on every backend.
    await cp.aput_thread({"thread_id": new}, ThreadInfo(thread_id=new, thread_name="é" * 255))
    assert (await cp.aget_thread({"thread_id": new})).thread_name == "é" * 255


@pytest.mark.asyncio
async def test_a_nul_in_a_name_or_in_metadata_is_stored_on_every_backend(checkpointer: Any, make_thread: Any) -> None:
    cp = checkpointer
    tid = make_thread("nul-name")
    await cp.aput_thread({"thread_id": tid}, ThreadInfo(thread_id=tid, thread_name="a\x00b", metadata={"k": "c\x00d"}))
    got = await cp.aget_thread({"thread_id": tid})
    # PostgreSQL stores no U+0000: U+FFFD there, as for states, messages and ledger rows.
    assert got.thread_name in ("a\x00b", "a\ufffdb")
    assert got.metadata.get("k") in ("c\x00d", "c\ufffdd")
