"""The state cache and the generic cache (helper red-team, session 30).

1. A state cached for a thread that was deleted (another user's ``aclean_thread`` where users are
   not isolated, ``aprune``) and made again under its id was served by ``aget_state_cache``: the
   new thread reaches the same versions, so the version check passed, and the config it set let
   ``aput_state`` write the deleted conversation over the new turns.
2. Stores without Redis kept the state cache in the generic cache under the namespace
   ``"state_cache"``: ``alist_cache_keys``/``aget_cache_value`` read any user's cached state and
   ``aput_cache_value`` replaced it, past user isolation.
3. A cache namespace or key with a NUL or a lone surrogate was a bare ``UnicodeEncodeError``, or
   stored on one backend and refused on another (a value Postgres+Redis wrote it could not clear).
"""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import InvalidConfigError

from .conftest import make_checkpointer


def _echo(checkpointer: Any) -> Any:
    async def model(state: AgentState) -> Message:
        return Message.text_message("reply to " + state.context[-1].text(), role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=checkpointer)


def _turn(text: str) -> dict[str, Any]:
    return {"messages": [Message.text_message(text)]}


async def _texts(cp: Any, cfg: dict[str, Any]) -> list[str]:
    state = await cp.aget_state(dict(cfg))
    return [m.text() for m in state.context]


@pytest.mark.asyncio
@pytest.mark.parametrize("delete", ["other_users_clean", "prune"])
async def test_a_state_cached_for_a_deleted_thread_is_not_served_for_the_thread_made_again(
        checkpointer: Any, make_thread: Any, delete: str) -> None:
    app = _echo(checkpointer)
    cfg = {"thread_id": make_thread("reborn"), "user_id": "alice"}
    await app.ainvoke(_turn("deleted conversation"), dict(cfg))
    c = dict(cfg)
    await checkpointer.aput_state_cache(c, await checkpointer.aget_state(c))
    if delete == "prune":
        await checkpointer.aprune(finished_older_than=0)
    else:
        await checkpointer.aclean_thread({"thread_id": cfg["thread_id"], "user_id": "operator"})
    assert await checkpointer.aget_state(dict(cfg)) is None
    await app.ainvoke(_turn("new conversation"), dict(cfg))
    stored = await _texts(checkpointer, cfg)
    assert stored == ["new conversation", "reply to new conversation"]

    c = dict(cfg)
    cached = await checkpointer.aget_state_cache(c)
    assert [m.text() for m in cached.context] == stored
    # A read-modify-write through the cache keeps the new turns.
    cached.context_summary = "edited"
    await checkpointer.aput_state(c, cached)
    assert await _texts(checkpointer, cfg) == stored


@pytest.mark.asyncio
async def test_a_cached_state_of_the_same_thread_is_still_served(checkpointer: Any, make_thread: Any) -> None:
    app = _echo(checkpointer)
    cfg = {"thread_id": make_thread("kept"), "user_id": "alice"}
    await app.ainvoke(_turn("hello"), dict(cfg))
    c = dict(cfg)
    state = await checkpointer.aget_state(c)
    state.context_summary = "only in the cache"
    await checkpointer.aput_state_cache(c, state)
    got = await checkpointer.aget_state_cache(dict(cfg))
    assert got.context_summary == "only in the cache"
    # A new turn moves the thread on: the entry is stale and the rows answer.
    await app.ainvoke(_turn("again"), dict(cfg))
    got = await checkpointer.aget_state_cache(dict(cfg))
    assert got.context_summary != "only in the cache"
    assert [m.text() for m in got.context][-1] == "reply to again"


@pytest.mark.asyncio
@pytest.mark.parametrize("isolated", [False, True])
async def test_the_generic_cache_cannot_read_or_plant_a_users_cached_state(
        request: pytest.FixtureRequest, tmp_path: Any, make_thread: Any, isolated: bool) -> None:
    for kind in ("memory", "sqlite", "postgres"):
        cp = make_checkpointer(kind, request, tmp_path / kind, enforce_user_isolation=isolated)
        app = _echo(cp)
        tid = make_thread(f"private-{kind}")
        alice = {"thread_id": tid, "user_id": "alice"}
        await app.ainvoke(_turn("alice's secret"), dict(alice))
        c = dict(alice)
        await cp.aput_state_cache(c, await cp.aget_state(c))
        # The namespace the state cache was kept under is an ordinary one now.
        for ns in ("state_cache", "tenxgraph:state_cache"):
            if ns.startswith("tenxgraph:"):
                with pytest.raises(InvalidConfigError) as e:
                    await cp.alist_cache_keys(ns)
                assert e.value.error_code == "STORAGE_CONFIG_002"
                with pytest.raises(InvalidConfigError):
                    await cp.aput_cache_value(ns, f"{tid}:alice", {"planted": True})
                continue
            assert await cp.alist_cache_keys(ns) == [], kind
            assert await cp.aget_cache_value(ns, f"{tid}:alice") is None, kind
            await cp.aput_cache_value(ns, f"{tid}:alice", {"planted": True})
            assert await cp.aget_cache_value(ns, f"{tid}:alice") == {"planted": True}
        cached = await cp.aget_state_cache(dict(alice))
        assert [m.text() for m in cached.context] == ["alice's secret", "reply to alice's secret"], kind
        await cp.arelease()


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", ["a\0b", "a\ud800b"], ids=["nul", "lone-surrogate"])
async def test_a_cache_name_no_store_can_keep_is_refused_everywhere_before_anything_is_written(
        checkpointer: Any, make_thread: Any, bad: str) -> None:
    ns = make_thread("ns")
    calls = [
        lambda: checkpointer.aput_cache_value(ns, bad, 1),
        lambda: checkpointer.aget_cache_value(ns, bad),
        lambda: checkpointer.aclear_cache_value(ns, bad),
        lambda: checkpointer.aput_cache_value(bad, "k", 1),
        lambda: checkpointer.aget_cache_value(bad, "k"),
        lambda: checkpointer.aclear_cache_value(bad, "k"),
        lambda: checkpointer.alist_cache_keys(bad),
        lambda: checkpointer.alist_cache_keys(ns, bad),
    ]
    for call in calls:
        with pytest.raises(InvalidConfigError) as e:
            await call()
        assert e.value.error_code == "STORAGE_CONFIG_002"
    assert await checkpointer.alist_cache_keys(ns) == []
    # An int key is stored as its text, as 10xGraph's f"{namespace}:{key}" keys it.
    await checkpointer.aput_cache_value(ns, 7, "seven")
    assert await checkpointer.aget_cache_value(ns, "7") == "seven"
    assert await checkpointer.alist_cache_keys(ns) == ["7"]
