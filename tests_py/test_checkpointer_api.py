"""The checkpointer API (spec §6.1-6.3) on every backend, with the guarantees of the contract:
versioned writes, messages deduplicated by id, a durable tool ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.exceptions import InvalidConfigError, StaleStateError, StorageError
from tenxgraph.storage.checkpointer import (
    STOP_REQUEST_NAMESPACE,
    BaseCheckpointer,
    InMemoryCheckpointer,
    SqliteCheckpointer,
)
from tenxgraph.utils.thread_info import ThreadInfo


class NoteState(AgentState):
    note: str = ""
    items: list[int] = []


class OtherState(AgentState):
    other: int = 0


def msg(text: str, role: str = "assistant", mid: str | None = None) -> Message:
    return Message.text_message(text, role=role, message_id=mid)  # type: ignore[arg-type]


def texts(messages: list[Message]) -> list[str]:
    return [m.text() for m in messages]


@pytest.fixture
def cp(checkpointer: BaseCheckpointer) -> BaseCheckpointer:
    checkpointer.bind_state_type(NoteState)
    return checkpointer


# -- state ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_put_get_state_round_trip_subclass(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    state = NoteState(note="hello", items=[1, 2], context=[msg("q", "user", "m1"), msg("a", mid="m2")])
    state.execution_meta.step = 4
    state.execution_meta.current_node = "worker"
    state.context_summary = "summary"
    returned = await cp.aput_state(cfg, state)
    assert returned is state

    got = await cp.aget_state({"thread_id": cfg["thread_id"]})
    assert type(got) is NoteState
    assert got is not state
    assert got.note == "hello" and got.items == [1, 2]
    assert got.context_summary == "summary"
    assert got.execution_meta.step == 4
    assert got.execution_meta.current_node == "worker"
    assert [m.message_id for m in got.context] == ["m1", "m2"]
    assert texts(got.context) == ["q", "a"]
    assert got.model_dump(mode="json") == state.model_dump(mode="json")


@pytest.mark.asyncio
async def test_get_state_unknown_thread_is_none(cp, make_thread) -> None:
    assert await cp.aget_state({"thread_id": make_thread()}) is None


@pytest.mark.asyncio
async def test_state_is_a_copy_not_a_live_reference(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    state = NoteState(note="before")
    await cp.aput_state(cfg, state)
    state.note = "mutated after put"
    got = await cp.aget_state(cfg)
    assert got.note == "before"
    got.note = "mutated after get"
    assert (await cp.aget_state(cfg)).note == "before"


@pytest.mark.asyncio
async def test_clear_state(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    await cp.aput_state(cfg, NoteState(note="x"))
    assert await cp.aget_state(cfg) is not None
    await cp.aclear_state(cfg)
    assert await cp.aget_state(cfg) is None


@pytest.mark.asyncio
async def test_state_cache_round_trip(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    await cp.aput_state_cache(cfg, NoteState(note="cached"))
    got = await cp.aget_state_cache(cfg)
    assert type(got) is NoteState and got.note == "cached"


@pytest.mark.asyncio
async def test_state_requires_thread_id(cp) -> None:
    with pytest.raises(ValueError):
        await cp.aget_state({})
    with pytest.raises(TypeError):
        await cp.aget_state("thread")


# -- versioned writes ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_versioned_write_conflict(cp, make_thread) -> None:
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="v1", context=[msg("hi", "user", "u1")]))

    cfg1 = {"thread_id": tid}
    cfg2 = {"thread_id": tid}
    s1 = await cp.aget_state(cfg1)
    s2 = await cp.aget_state(cfg2)
    assert "_checkpoint_version" in cfg1
    assert cfg1["_checkpoint_version"] == cfg2["_checkpoint_version"]
    start = cfg1["_checkpoint_version"]

    s1.note = "writer one"
    s1.context.append(msg("from one", mid="one"))
    await cp.aput_state(cfg1, s1)
    assert cfg1["_checkpoint_version"] > start

    s2.note = "writer two"
    s2.items = [2]
    s2.context.append(msg("from two", mid="two"))
    with pytest.raises(StaleStateError) as ei:
        await cp.aput_state(cfg2, s2)
    err = ei.value
    assert isinstance(err, StorageError)
    assert err.error_code == "STORAGE_CONFLICT_001"
    assert err.context["expected_version"] == start
    assert err.context["current_version"] == cfg1["_checkpoint_version"]
    assert cfg2["_checkpoint_version"] == start  # the failed write did not advance it

    # nothing of the losing write was persisted, not even its new message
    got = await cp.aget_state({"thread_id": tid})
    assert got.note == "writer one"
    assert got.items == []
    assert texts(got.context) == ["hi", "from one"]
    listed = await cp.alist_messages({"thread_id": tid})
    assert [m.message_id for m in listed] == ["u1", "one"]
    with pytest.raises(IndexError):
        await cp.aget_message({"thread_id": tid}, "two")


@pytest.mark.asyncio
async def test_versioned_checkpoint_conflict_with_messages(cp, make_thread) -> None:
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base"))
    cfg1, cfg2 = {"thread_id": tid}, {"thread_id": tid}
    s1 = await cp.aget_state(cfg1)
    s2 = await cp.aget_state(cfg2)
    await cp.aput_checkpoint(cfg1, s1, [msg("extra one", mid="x1")])
    with pytest.raises(StaleStateError):
        await cp.aput_checkpoint(cfg2, s2, [msg("extra two", mid="x2")])
    listed = await cp.alist_messages({"thread_id": tid})
    assert [m.message_id for m in listed] == ["x1"]


@pytest.mark.asyncio
async def test_rereading_after_conflict_allows_write(cp, make_thread) -> None:
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base"))
    cfg1, cfg2 = {"thread_id": tid}, {"thread_id": tid}
    s1, s2 = await cp.aget_state(cfg1), await cp.aget_state(cfg2)
    await cp.aput_state(cfg1, s1)
    with pytest.raises(StaleStateError):
        await cp.aput_state(cfg2, s2)
    fresh = await cp.aget_state(cfg2)
    fresh.note = "after reread"
    await cp.aput_state(cfg2, fresh)
    assert (await cp.aget_state({"thread_id": tid})).note == "after reread"


@pytest.mark.asyncio
@pytest.mark.parametrize("change", ["aput_messages", "adelete_message"])
async def test_versioned_write_after_messages_changed_since_the_read_is_stale(cp, make_thread, change) -> None:
    """A message written or deleted outside a run makes no new version; a versioned aput_state
    replaces the thread's messages with its context, and dropped (or brought back) that message
    with no error (session 40). Now it is StaleStateError and nothing of it is written."""
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base", context=[msg("hi", "user", "u1"),
                                                                            msg("old", mid="o1")]))
    cfg = {"thread_id": tid}
    read = await cp.aget_state(cfg)
    other = {"thread_id": tid}
    if change == "aput_messages":
        await cp.aput_messages(other, [msg("added by another caller", "user", "late")])
        expected = ["u1", "o1", "late"]
    else:
        await cp.adelete_message(other, "o1")
        expected = ["u1"]
    read.note = "edited"
    read.context.append(msg("edit", mid="e1"))
    with pytest.raises(StaleStateError) as ei:
        await cp.aput_state(cfg, read)
    assert ei.value.error_code == "STORAGE_CONFLICT_001"
    assert ei.value.context["expected_version"] == ei.value.context["current_version"] == cfg["_checkpoint_version"]
    assert ei.value.context["messages_changed"] is True
    got = await cp.aget_state({"thread_id": tid})
    assert got.note == "base" and [m.message_id for m in got.context] == expected
    # Read again, the write goes through and keeps the other caller's change; the config now
    # holds the row it wrote, so a second write with it needs no read.
    again = await cp.aget_state(cfg)
    again.context.append(msg("edit", mid="e1"))
    await cp.aput_state(cfg, again)
    again.note = "edited twice"
    await cp.aput_state(cfg, again)
    got = await cp.aget_state({"thread_id": tid})
    assert got.note == "edited twice" and [m.message_id for m in got.context] == [*expected, "e1"]


@pytest.mark.asyncio
async def test_a_state_read_from_the_cache_is_refused_after_messages_changed_too(cp, make_thread) -> None:
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base", context=[msg("hi", "user", "u1")]))
    cfg = {"thread_id": tid}
    await cp.aput_state_cache(cfg, await cp.aget_state(cfg))
    cached_cfg = {"thread_id": tid}
    cached = await cp.aget_state_cache(cached_cfg)
    assert cached is not None and cached_cfg["_checkpoint_version"] == cfg["_checkpoint_version"]
    await cp.aput_messages({"thread_id": tid}, [msg("late", "user", "late")])
    with pytest.raises(StaleStateError):
        await cp.aput_state(cached_cfg, cached)
    assert [m.message_id for m in await cp.alist_messages({"thread_id": tid})] == ["u1", "late"]
    # The entry no longer describes the thread's messages: it is not served (it was, without
    # "late"); the state read again is, and a write from it goes through.
    fresh_cfg = {"thread_id": tid}
    fresh = await cp.aget_state_cache(fresh_cfg)
    assert [m.message_id for m in fresh.context] == ["u1", "late"]
    assert [m.message_id for m in (await cp.aget_state_cache({"thread_id": tid})).context] == ["u1", "late"]
    fresh.note = "from the cache"
    await cp.aput_state(fresh_cfg, fresh)
    assert (await cp.aget_state({"thread_id": tid})).note == "from the cache"


@pytest.mark.asyncio
@pytest.mark.parametrize("change", ["aput_messages", "adelete_message"])
async def test_one_caller_keeping_its_state_and_messages_in_step_is_not_stale(cp, make_thread, change) -> None:
    """10xGraph's way of keeping a state and its message log in step: append to the context,
    ``aput_messages`` (or drop it and ``adelete_message``) with the same config, then
    ``aput_state``. The caller's own message write does not make its read stale (it did after
    the first fix of this session, every time: red-team, session 40); another caller's write
    between the read and it still does."""
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base", context=[msg("hi", "user", "u1"),
                                                                            msg("old", mid="o1")]))
    cfg = {"thread_id": tid}
    state = await cp.aget_state(cfg)
    if change == "aput_messages":
        mine = msg("mine", mid="m1")
        state.context.append(mine)
        await cp.aput_messages(cfg, [mine])
        await cp.aput_messages(cfg, [])  # writes nothing, changes nothing
        expected = ["u1", "o1", "m1"]
    else:
        state.context = state.context[:1]
        await cp.adelete_message(cfg, "o1")
        expected = ["u1"]
    state.note = "in step"
    await cp.aput_state(cfg, state)
    got = await cp.aget_state({"thread_id": tid})
    assert got.note == "in step" and [m.message_id for m in got.context] == expected

    # Another caller between the read and the caller's own message write: stale, nothing lost.
    state = await cp.aget_state(cfg)
    await cp.aput_messages({"thread_id": tid}, [msg("another", "user", "a1")])
    mine = msg("mine again", mid="m2")
    state.context.append(mine)
    await cp.aput_messages(cfg, [mine])
    with pytest.raises(StaleStateError):
        await cp.aput_state(cfg, state)
    assert [m.message_id for m in await cp.alist_messages({"thread_id": tid})] == [*expected, "a1", "m2"]


@pytest.mark.asyncio
async def test_a_message_sent_again_by_its_caller_before_its_versioned_write_is_not_stale(cp, make_thread) -> None:
    """A handler that delivers a message again (a redelivery, a retry after a crash between its
    ``aput_messages`` and ``aput_state``) builds it anew: same id and text, a new timestamp. Its
    state holds the first copy; the stored copy differs only in the time. Each attempt was
    refused ``STORAGE_CONFLICT_001`` with no other writer about, a fresh read included (red-team,
    session 41); 10xGraph writes it."""
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base", context=[msg("hi", "user", "u1")]))

    async def deliver(note: str) -> None:
        cfg = {"thread_id": tid}
        state = await cp.aget_state(cfg)
        incoming = msg("payment received", "user", "evt-7")
        if all(m.message_id != "evt-7" for m in state.context):
            state.context.append(incoming)
        await cp.aput_messages(cfg, [incoming])
        state.note = note
        await cp.aput_state(cfg, state)

    await deliver("first")
    await deliver("again")
    got = await cp.aget_state({"thread_id": tid})
    assert got.note == "again" and [m.message_id for m in got.context] == ["u1", "evt-7"]
    # A copy that differs in anything but the time is still the caller's own edit to keep.
    cfg = {"thread_id": tid}
    state = await cp.aget_state(cfg)
    await cp.aput_messages(cfg, [msg("[REDACTED]", "user", "evt-7")])
    with pytest.raises(StaleStateError):
        await cp.aput_state(cfg, state)
    assert [m.text() for m in await cp.alist_messages({"thread_id": tid})] == ["hi", "[REDACTED]"]


@pytest.mark.asyncio
@pytest.mark.parametrize("change", ["log-only", "redact", "delete", "cache"])
async def test_a_callers_own_message_write_its_state_does_not_hold_is_stale(cp, make_thread, change) -> None:
    """The caller's own message write keeps its read current only for a state that holds what
    the write changed: a state read before it would drop the message, undo a redaction or bring
    a deleted message back (red-team, session 40: all four were written)."""
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base", context=[msg("hi", "user", "u1"),
                                                                            msg("secret", mid="s1")]))
    cfg = {"thread_id": tid}
    state = await cp.aget_state(cfg)
    if change == "log-only":
        await cp.aput_messages(cfg, [msg("logged", mid="l1")])
        expected = ["hi", "secret", "logged"]
    elif change == "redact":
        await cp.aput_messages(cfg, [msg("[REDACTED]", mid="s1")])
        expected = ["hi", "[REDACTED]"]
    elif change == "delete":
        await cp.adelete_message(cfg, "s1")
        expected = ["hi"]
    else:
        await cp.aput_messages(cfg, [msg("logged", mid="l1")])
        await cp.aput_state_cache(cfg, state)
        cfg = {"thread_id": tid}
        state = await cp.aget_state_cache(cfg)
        expected = ["hi", "secret", "logged"]
    state.note = "edited"
    if change == "cache":
        # The entry did not hold the caller's write: it was read again, and holds it now.
        await cp.aput_state(cfg, state)
    else:
        with pytest.raises(StaleStateError):
            await cp.aput_state(cfg, state)
    assert texts(await cp.alist_messages({"thread_id": tid})) == expected


@pytest.mark.asyncio
async def test_a_cached_state_with_no_mark_is_read_again(cp, make_thread) -> None:
    """An entry cached under a version set by hand (or by an earlier build) names no read: served
    on its version, a write from it dropped a message written since (red-team, session 40)."""
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base", context=[msg("hi", "user", "u1")]))
    probe: dict[str, Any] = {"thread_id": tid}
    state = await cp.aget_state(probe)
    await cp.aput_state_cache({"thread_id": tid, "_checkpoint_version": probe["_checkpoint_version"]}, state)
    await cp.aput_messages({"thread_id": tid}, [msg("late", "user", "late")])
    cfg = {"thread_id": tid}
    cached = await cp.aget_state_cache(cfg)
    assert [m.message_id for m in cached.context] == ["u1", "late"]
    cached.note = "edited"
    await cp.aput_state(cfg, cached)
    got = await cp.aget_state({"thread_id": tid})
    assert got.note == "edited" and [m.message_id for m in got.context] == ["u1", "late"]


@pytest.mark.asyncio
async def test_a_version_set_by_hand_is_checked_alone(cp, make_thread) -> None:
    """A config naming a version but no read (10xGraph's key set by hand) is checked on the
    version alone, as before: its writer takes the messages as it gives them."""
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base", context=[msg("hi", "user", "u1")]))
    probe: dict[str, Any] = {"thread_id": tid}
    await cp.aget_state(probe)
    version = probe["_checkpoint_version"]
    await cp.aput_messages({"thread_id": tid}, [msg("late", "user", "late")])
    cfg = {"thread_id": tid, "_checkpoint_version": version}
    await cp.aput_state(cfg, NoteState(note="by hand", context=[msg("hi", "user", "u1")]))
    got = await cp.aget_state({"thread_id": tid})
    assert got.note == "by hand" and [m.message_id for m in got.context] == ["u1"]


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", [5, "x", ["1/"], "abc/def", "--5/x", "\u00b2/x", "9" * 5000 + "/x",
                                 "1/\ud800", "1/a\x00b", "1/" + "a" * 201, "1/a b"])
async def test_a_mark_not_set_by_a_read_is_a_config_error_and_writes_nothing(cp, make_thread, bad) -> None:
    """A lone surrogate or a NUL in the mark reached the core: a bare UnicodeEncodeError (every
    backend), STORAGE_001 from PostgreSQL for a message write, a bare ValueError from
    ``aput_state_cache`` (red-team, session 41). A message write never needed the read: it goes
    on without it."""
    tid = make_thread()
    await cp.aput_state({"thread_id": tid}, NoteState(note="base"))
    cfg = {"thread_id": tid}
    await cp.aget_state(cfg)
    cfg["_checkpoint_mark"] = bad
    for write in (lambda: cp.aput_state(cfg, NoteState(note="never")),
                  lambda: cp.aput_state_cache(cfg, NoteState(note="never"))):
        with pytest.raises(InvalidConfigError) as ei:
            await write()
        assert ei.value.error_code == "STORAGE_CONFIG_002" and ei.value.context["field"] == "_checkpoint_mark"
    assert (await cp.aget_state({"thread_id": tid})).note == "base"
    await cp.aput_messages(cfg, [msg("still written", mid="w1")])
    await cp.adelete_message(cfg, "w1")
    assert await cp.alist_messages({"thread_id": tid}) == []


# -- messages ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_put_messages_dedupes_by_id(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    await cp.aput_messages(cfg, [msg("one", mid="a"), msg("two", mid="b")])
    await cp.aput_messages(cfg, [msg("two again", mid="b"), msg("three", mid="c")])
    listed = await cp.alist_messages(cfg)
    assert [m.message_id for m in listed] == ["a", "b", "c"]
    # the later write of "b" replaced its content in place (upsert)
    assert texts(listed) == ["one", "two again", "three"]


@pytest.mark.asyncio
async def test_get_message_and_index_error(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    original = msg("findme", mid="m-42")
    await cp.aput_messages(cfg, [original])
    got = await cp.aget_message(cfg, "m-42")
    assert isinstance(got, Message)
    assert got.message_id == "m-42"
    assert got.text() == "findme"
    assert got.role == "assistant"
    with pytest.raises(IndexError):
        await cp.aget_message(cfg, "nope")
    with pytest.raises(IndexError):
        await cp.aget_message({"thread_id": make_thread()}, "m-42")  # scoped to its thread


@pytest.mark.asyncio
async def test_list_messages_search_offset_limit(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    words = ["apple pie", "banana", "apple juice", "cherry", "green apple"]
    await cp.aput_messages(cfg, [msg(w, mid=f"id{i}") for i, w in enumerate(words)])
    assert texts(await cp.alist_messages(cfg)) == words
    assert texts(await cp.alist_messages(cfg, search="apple")) == ["apple pie", "apple juice", "green apple"]
    assert texts(await cp.alist_messages(cfg, search="zzz")) == []
    assert texts(await cp.alist_messages(cfg, offset=1, limit=2)) == ["banana", "apple juice"]
    assert texts(await cp.alist_messages(cfg, offset=3)) == ["cherry", "green apple"]
    assert texts(await cp.alist_messages(cfg, limit=1)) == ["apple pie"]
    assert texts(await cp.alist_messages(cfg, search="apple", offset=1, limit=1)) == ["apple juice"]
    assert await cp.alist_messages({"thread_id": make_thread()}) == []


@pytest.mark.asyncio
async def test_delete_message(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    await cp.aput_messages(cfg, [msg("keep", mid="k"), msg("drop", mid="d")])
    await cp.adelete_message(cfg, "d")
    assert [m.message_id for m in await cp.alist_messages(cfg)] == ["k"]
    with pytest.raises(IndexError):
        await cp.aget_message(cfg, "d")
    with pytest.raises(IndexError):
        await cp.adelete_message(cfg, "d")


@pytest.mark.asyncio
async def test_put_messages_rejects_non_messages(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    with pytest.raises(TypeError):
        await cp.aput_messages(cfg, [{"role": "user"}])
    assert await cp.alist_messages(cfg) == []


# -- threads -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_threads_api(cp, make_thread) -> None:
    t1, t2 = make_thread("alpha"), make_thread("beta")
    await cp.aput_thread({"thread_id": t1}, ThreadInfo(thread_id=t1, thread_name="Alpha chat", metadata={"k": 1}))
    await cp.aput_thread({"thread_id": t2}, ThreadInfo(thread_id=t2, thread_name="Beta chat"))

    info = await cp.aget_thread({"thread_id": t1})
    assert isinstance(info, ThreadInfo)
    assert info.thread_id == t1
    assert info.thread_name == "Alpha chat"
    assert info.metadata == {"k": 1}
    assert info.user_id == "anonymous"
    assert await cp.aget_thread({"thread_id": make_thread("none")}) is None

    # an update replaces name and metadata
    await cp.aput_thread({"thread_id": t1}, ThreadInfo(thread_id=t1, thread_name="Renamed", metadata={"k": 2}))
    info = await cp.aget_thread({"thread_id": t1})
    assert (info.thread_name, info.metadata) == ("Renamed", {"k": 2})

    listed = await cp.alist_threads({})
    ids = {t.thread_id for t in listed}
    assert {t1, t2} <= ids
    assert {t.thread_id for t in await cp.alist_threads({}, search="Beta")} == {t2}
    assert len(await cp.alist_threads({}, limit=1)) == 1


@pytest.mark.asyncio
async def test_put_thread_mismatched_id_is_value_error(cp, make_thread) -> None:
    tid = make_thread()
    with pytest.raises(ValueError):
        await cp.aput_thread({"thread_id": tid}, ThreadInfo(thread_id="other"))
    assert await cp.aget_thread({"thread_id": tid}) is None


@pytest.mark.asyncio
async def test_clean_thread_removes_state_messages_and_ledger(cp, make_thread) -> None:
    tid, other = make_thread(), make_thread()
    cfg = {"thread_id": tid}
    await cp.aput_thread(cfg, ThreadInfo(thread_id=tid, thread_name="to clean"))
    await cp.aput_state(cfg, NoteState(note="x", context=[msg("m", mid="m1")]))
    await cp.aput_tool_result(cfg, "m1:call_1", {"out": 1})
    await cp.aput_state({"thread_id": other}, NoteState(note="other"))
    await cp.aput_tool_result({"thread_id": other}, "m1:call_1", {"out": 2})

    await cp.aclean_thread(cfg)
    assert await cp.aget_state(cfg) is None
    assert await cp.aget_thread(cfg) is None
    assert await cp.alist_messages(cfg) == []
    assert await cp.aget_tool_result(cfg, "m1:call_1") is None
    assert tid not in {t.thread_id for t in await cp.alist_threads({})}
    # other threads are untouched
    assert (await cp.aget_state({"thread_id": other})).note == "other"
    assert await cp.aget_tool_result({"thread_id": other}, "m1:call_1") == {"out": 2}
    # after cleaning, the ledger records afresh
    await cp.aput_tool_result(cfg, "m1:call_1", {"out": 3})
    assert await cp.aget_tool_result(cfg, "m1:call_1") == {"out": 3}


# -- generic cache and stop requests -------------------------------------------------------


@pytest.mark.asyncio
async def test_cache_values_and_ttl(cp) -> None:
    ns = "test-ns"
    assert await cp.aget_cache_value(ns, "missing") is None
    await cp.aput_cache_value(ns, "forever", {"a": [1, 2]})
    await cp.aput_cache_value(ns, "short", "v", ttl_seconds=1)
    await cp.aput_cache_value("other-ns", "short", "elsewhere")
    assert await cp.aget_cache_value(ns, "forever") == {"a": [1, 2]}
    assert await cp.aget_cache_value(ns, "short") == "v"
    assert sorted(await cp.alist_cache_keys(ns)) == ["forever", "short"]
    assert await cp.alist_cache_keys(ns, prefix="for") == ["forever"]

    await asyncio.sleep(1.2)
    assert await cp.aget_cache_value(ns, "short") is None
    assert await cp.alist_cache_keys(ns) == ["forever"]
    assert await cp.aget_cache_value(ns, "forever") == {"a": [1, 2]}
    assert await cp.aget_cache_value("other-ns", "short") == "elsewhere"

    await cp.aclear_cache_value(ns, "forever")
    assert await cp.aget_cache_value(ns, "forever") is None


@pytest.mark.asyncio
async def test_stop_request_scoped_per_thread_and_user(cp, make_thread) -> None:
    t1, t2 = make_thread(), make_thread()
    a = {"thread_id": t1}  # user "anonymous"
    b = {"thread_id": t1, "user_id": "bob"}
    c = {"thread_id": t2}
    assert await cp.ais_stop_requested(a) is False
    await cp.arequest_stop(a)
    assert await cp.ais_stop_requested(a) is True
    assert await cp.ais_stop_requested({"thread_id": t1, "user_id": "anonymous"}) is True
    assert await cp.ais_stop_requested(b) is False
    assert await cp.ais_stop_requested(c) is False
    # it lives in the generic cache under thread:user
    assert await cp.aget_cache_value(STOP_REQUEST_NAMESPACE, f"{t1}:anonymous")
    await cp.arequest_stop(b)
    await cp.aclear_stop_request(a)
    assert await cp.ais_stop_requested(a) is False
    assert await cp.ais_stop_requested(b) is True


# -- tool ledger ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_tool_ledger_first_write_wins_and_thread_scope(cp, make_thread) -> None:
    t1, t2 = make_thread(), make_thread()
    key = "msg-1:call_1"
    assert await cp.aget_tool_result({"thread_id": t1}, key) is None
    first = {"__kind__": "message", "content": "first", "n": [1, 2]}
    await cp.aput_tool_result({"thread_id": t1}, key, first)
    await cp.aput_tool_result({"thread_id": t1}, key, {"__kind__": "message", "content": "second"})
    assert await cp.aget_tool_result({"thread_id": t1}, key) == first
    assert await cp.aget_tool_result({"thread_id": t1}, "msg-1:call_2") is None
    # another thread has its own ledger
    assert await cp.aget_tool_result({"thread_id": t2}, key) is None
    await cp.aput_tool_result({"thread_id": t2}, key, {"content": "t2"})
    assert await cp.aget_tool_result({"thread_id": t2}, key) == {"content": "t2"}
    assert await cp.aget_tool_result({"thread_id": t1}, key) == first


# -- sync wrappers -------------------------------------------------------------------------


def test_sync_wrappers(cp, make_thread) -> None:
    tid = make_thread()
    cfg = {"thread_id": tid}
    assert cp.get_state(cfg) is None
    cp.put_state(cfg, NoteState(note="sync", context=[msg("m", mid="s1")]))
    got = cp.get_state(cfg)
    assert type(got) is NoteState and got.note == "sync"
    cp.put_messages(cfg, [msg("more", mid="s2")])
    assert [m.message_id for m in cp.list_messages(cfg)] == ["s1", "s2"]
    assert cp.get_message(cfg, "s2").text() == "more"
    cp.put_tool_result(cfg, "s1:c", {"r": 1})
    assert cp.get_tool_result(cfg, "s1:c") == {"r": 1}
    cp.request_stop(cfg)
    assert cp.is_stop_requested(cfg) is True
    cp.clear_stop_request(cfg)
    assert cp.is_stop_requested(cfg) is False
    cp.clean_thread(cfg)
    assert cp.get_state(cfg) is None
    with pytest.raises(AttributeError):
        cp.no_such_method  # noqa: B018


@pytest.mark.asyncio
async def test_sync_wrapper_inside_running_loop(cp, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    cp.put_state(cfg, NoteState(note="in loop"))
    assert (await cp.aget_state(cfg)).note == "in loop"
    assert cp.get_state(cfg).note == "in loop"


# -- construction and state typing ---------------------------------------------------------


def test_sqlite_synchronous_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SqliteCheckpointer(tmp_path / "x.db", synchronous="bogus")
    assert SqliteCheckpointer(tmp_path / "n.db", synchronous="normal").db_path == str(tmp_path / "n.db")
    assert SqliteCheckpointer(tmp_path / "f.db", synchronous="full").db_path == str(tmp_path / "f.db")


@pytest.mark.parametrize("bad", [12, object(), b"x.db", ["x.db"]], ids=["int", "object", "bytes", "list"])
def test_sqlite_path_that_is_not_a_path_is_a_type_error(tmp_path: Path, bad: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """str() of anything named a file: a factory that wanted a path, handed a checkpointer by
    ``tenxgraph recover``, opened "<...SqliteCheckpointer object at 0x...>" and recovered
    nothing (docs helper, session 41)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="db_path must be"):
        SqliteCheckpointer(bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.asyncio
async def test_sqlite_in_memory_path_works(make_thread) -> None:
    cp = SqliteCheckpointer(":memory:")
    cfg = {"thread_id": make_thread()}
    await cp.aput_state(cfg, AgentState(context=[msg("m", mid="mm")]))
    assert texts((await cp.aget_state(cfg)).context) == ["m"]


@pytest.mark.parametrize("bad", [dict, int, "NoteState", NoteState(), None], ids=["dict", "int", "str", "instance", "none"])
def test_bind_state_type_rejects_non_agent_state(checkpointer, bad: Any) -> None:
    with pytest.raises(TypeError):
        checkpointer.bind_state_type(bad)
    assert checkpointer.state_type is AgentState


def test_bind_state_type_rules(checkpointer) -> None:
    assert checkpointer.state_type is AgentState
    checkpointer.bind_state_type(NoteState)
    assert checkpointer.state_type is NoteState
    checkpointer.bind_state_type(NoteState)  # same class again is fine
    assert checkpointer.state_type is NoteState
    with pytest.raises(ValueError):
        checkpointer.bind_state_type(OtherState)
    assert checkpointer.state_type is NoteState


@pytest.mark.asyncio
async def test_unbound_checkpointer_reads_base_state(checkpointer, make_thread) -> None:
    cfg = {"thread_id": make_thread()}
    await checkpointer.aput_state(cfg, NoteState(note="x"))
    got = await checkpointer.aget_state(cfg)
    assert type(got) is AgentState


@pytest.mark.asyncio
async def test_release_then_in_memory_is_empty(make_thread) -> None:
    cp = InMemoryCheckpointer()
    cfg = {"thread_id": make_thread()}
    await cp.aput_state(cfg, AgentState())
    await cp.arelease()
    assert await cp.aget_state(cfg) is None


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_isolation_non_owner_reads_nothing_and_cannot_write(kind, tmp_path) -> None:
    from tenxgraph.core.exceptions import StorageError
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer

    cp = (InMemoryCheckpointer(enforce_user_isolation=True) if kind == "memory"
          else SqliteCheckpointer(tmp_path / "iso.db", enforce_user_isolation=True))
    owner = {"thread_id": "iso", "user_id": "alice"}
    await cp.aput_state(owner, AgentState(context=[Message.text_message("secret")]))
    intruder = {"thread_id": "iso", "user_id": "mallory"}
    assert await cp.aget_state(intruder) is None
    assert await cp.alist_messages(intruder) == []
    with pytest.raises(StorageError) as e:
        await cp.aput_tool_result(intruder, "m:c", {"__kind__": "raw", "value": 1})
    assert e.value.error_code == "STORAGE_FORBIDDEN_001"
    with pytest.raises(StorageError):
        await cp.aput_state(intruder, AgentState())
    assert (await cp.aget_state(owner)).context[0].text() == "secret"
