"""Listing and thread APIs a user calls directly, on 10xGraph 0.10.0 and on tenxgraph (a
differential pass over the checkpointer API, session 21), and the same rules on every backend of
ours: a message search ignores case, a thread search is literal, a ``limit`` of 0 is no limit, and
``aput_thread`` keeps the ``ThreadInfo``'s ``user_id`` where the config names none. Each was
different before (see each test)."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.utils.thread_info import ThreadInfo

# Each script defines ``run(cp)``; this runs it on a fresh in-memory and a fresh SQLite
# checkpointer and emits both answers.
_ON_BOTH_STORES = """
async def main():
    return {"memory": await run(InMemoryCheckpointer()),
            "sqlite": await run(SqliteCheckpointer(os.path.join(tempfile.mkdtemp(), "c.db")))}

emit(asyncio.run(main()))
sys.stdout.flush()
os._exit(0)  # 10xGraph's SqliteCheckpointer leaves its aiosqlite thread running at exit
"""


# alist_messages(search=...) is case-insensitive on every 10xGraph 0.10 checkpointer (in-memory and
# SQLite lower-case both sides, Postgres uses ILIKE); tenxgraph's was case-sensitive on every backend
# until session 21 (``contains`` / ``instr`` / ``strpos``): a search for "hello" missed "Hello World".
SEARCH_SCRIPT = """
import asyncio, os, sys, tempfile
from tenxgraph import Message
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer

async def run(cp):
    cfg = {"thread_id": "t"}
    await cp.aput_messages(cfg, [Message.text_message("Hello World", message_id="m1"),
                                 Message.text_message("bye", message_id="m2"),
                                 Message.text_message("say HELLO", message_id="m3")])
    out = {}
    for needle in ("hello", "Hello", "HELLO", "world", "o w"):
        out[needle] = [m.message_id for m in await cp.alist_messages(cfg, search=needle)]
    return out

""" + _ON_BOTH_STORES


def test_message_search_is_case_insensitive_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(SEARCH_SCRIPT)
    expected = {"hello": ["m1", "m3"], "Hello": ["m1", "m3"], "HELLO": ["m1", "m3"], "world": ["m1"],
                "o w": ["m1"]}
    assert theirs == {"memory": expected, "sqlite": expected}, theirs  # 10xGraph 0.10.0 as observed
    assert ours == theirs


# ``limit=0`` in alist_messages / alist_threads: every 10xGraph 0.10 checkpointer treats it as "no
# limit" (in-memory and SQLite slice with ``(start + limit) if limit else None``, Postgres adds
# ``LIMIT`` only ``if limit``) and lists everything; tenxgraph listed nothing until session 21.
LIMIT_SCRIPT = """
import asyncio, os, sys, tempfile
from tenxgraph import Message
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo

async def run(cp):
    cfg = {"thread_id": "t"}
    await cp.aput_messages(cfg, [Message.text_message(f"n{i}", message_id=f"m{i}") for i in range(3)])
    for i in range(3):
        await cp.aput_thread({"thread_id": f"th{i}"}, ThreadInfo(thread_id=f"th{i}", thread_name=f"n{i}"))
    return {
        "messages_limit0": [m.message_id for m in await cp.alist_messages(cfg, limit=0)],
        "messages_offset1_limit0": [m.message_id for m in await cp.alist_messages(cfg, offset=1, limit=0)],
        "threads_limit0": sorted(str(t.thread_id) for t in await cp.alist_threads({}, limit=0)
                                 if str(t.thread_id).startswith("th")),
    }

""" + _ON_BOTH_STORES


def test_limit_zero_lists_everything_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(LIMIT_SCRIPT)
    expected = {"messages_limit0": ["m0", "m1", "m2"], "messages_offset1_limit0": ["m1", "m2"],
                "threads_limit0": ["th0", "th1", "th2"]}
    assert theirs == {"memory": expected, "sqlite": expected}, theirs  # 10xGraph 0.10.0 as observed
    assert ours == theirs


# alist_threads(search=...) on SqliteCheckpointer: 10xGraph 0.10's (and both in-memory
# checkpointers) match the search text literally, lower-casing both sides with Python's
# ``str.lower``. Until session 21 tenxgraph's SQLite store used ``LIKE '%<search>%'`` unescaped, so
# ``%`` and ``_`` were wildcards (``"_"`` or ``"%"`` listed every thread, ``"user_1"`` also found
# ``"userX1"``), and LIKE folds ASCII only (``"été"`` missed ``"ÉTÉ"``).
THREAD_SEARCH_SCRIPT = """
import asyncio, os, sys, tempfile
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo

async def run(cp):
    for tid, name in [("a", "100% done"), ("b", "plain"), ("c", "user_1"), ("d", "userX1"), ("e", "ÉTÉ")]:
        await cp.aput_thread({"thread_id": tid}, ThreadInfo(thread_id=tid, thread_name=name))
    return {s: sorted(t.thread_id for t in await cp.alist_threads({}, search=s))
            for s in ["%", "_", "user_1", "PLAIN", "été"]}

""" + _ON_BOTH_STORES


def test_thread_search_is_literal_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(THREAD_SEARCH_SCRIPT)
    expected = {"%": ["a"], "_": ["c"], "user_1": ["c"], "PLAIN": ["b"], "été": ["e"]}
    assert theirs == {"memory": expected, "sqlite": expected}, theirs  # 10xGraph 0.10.0 as observed
    assert ours["memory"] == expected  # ours in memory already answers so
    assert ours["sqlite"] == theirs["sqlite"]


# aput_thread(config, ThreadInfo(user_id=...)): every 10xGraph 0.10 checkpointer keeps the
# ThreadInfo's user_id (in-memory and SQLite store the ThreadInfo as given; Postgres inserts
# ``thread_info.user_id or config user_id``), so aget_thread / alist_threads give it back. Until
# session 21 tenxgraph dropped it without a word and recorded the config's user (the anonymous user
# when the config had none). Now it keeps it where the config names no user, and refuses a
# ThreadInfo naming another user than the config (as a mismatched thread_id is refused).
THREAD_USER_SCRIPT = """
import asyncio, os, sys, tempfile
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo

async def run(cp):
    out = {}
    try:
        await cp.aput_thread({"thread_id": "u"}, ThreadInfo(thread_id="u", user_id="alice", thread_name="n"))
        out["no_config_user"] = (await cp.aget_thread({"thread_id": "u"})).user_id
    except ValueError as e:
        out["no_config_user"] = "ValueError"
    try:
        await cp.aput_thread({"thread_id": "v", "user_id": "alice"},
                             ThreadInfo(thread_id="v", user_id="alice", thread_name="n"))
        out["same_user"] = (await cp.aget_thread({"thread_id": "v", "user_id": "alice"})).user_id
    except ValueError as e:
        out["same_user"] = "ValueError"
    out["listed_for_alice"] = sorted(str(t.thread_id) for t in await cp.alist_threads({"user_id": "alice"})
                                     if t.user_id == "alice")
    return out

""" + _ON_BOTH_STORES


def test_thread_info_user_id_is_not_silently_replaced(oracle) -> None:
    theirs, ours = oracle.run_both(THREAD_USER_SCRIPT)
    expected = {"no_config_user": "alice", "same_user": "alice", "listed_for_alice": ["u", "v"]}
    assert theirs == {"memory": expected, "sqlite": expected}, theirs  # 10xGraph 0.10.0 as observed
    assert ours == theirs


# -- the same rules on every backend of ours (Postgres included) -------------------------------


@pytest.mark.asyncio
async def test_listing_rules_hold_on_every_backend(checkpointer: Any, make_thread: Any) -> None:
    cfg = {"thread_id": make_thread("listing")}
    await checkpointer.aput_messages(cfg, [Message.text_message("Hello World", message_id=f"{cfg['thread_id']}-1"),
                                           Message.text_message("bye", message_id=f"{cfg['thread_id']}-2"),
                                           Message.text_message("say HELLO", message_id=f"{cfg['thread_id']}-3")])

    async def found(search: str | None = None, **page: Any) -> list[str]:
        return [m.message_id.rsplit("-", 1)[1] for m in await checkpointer.alist_messages(cfg, search, **page)]

    assert await found("hello") == ["1", "3"]
    assert await found("HELLO", offset=1) == ["3"]
    assert await found("o w") == ["1"]
    assert await found(limit=0) == ["1", "2", "3"]
    assert await found(offset=1, limit=0) == ["2", "3"]
    assert await found(limit=1) == ["1"]
    with pytest.raises(ValueError):
        await found(limit=-1)

    prefix = make_thread("names")
    names = {"a": "100% done", "b": "plain", "c": "user_1", "d": "userX1", "e": "back\\slash"}
    for key, name in names.items():
        await checkpointer.aput_thread({"thread_id": f"{prefix}-{key}"},
                                       ThreadInfo(thread_id=f"{prefix}-{key}", thread_name=name))

    async def threads(search: str, **page: Any) -> list[str]:
        return sorted(t.thread_name for t in await checkpointer.alist_threads({}, search=search, **page)
                      if str(t.thread_id).startswith(prefix))

    assert await threads("%") == ["100% done"]
    assert await threads("_") == ["user_1"]
    assert await threads("user_1") == ["user_1"]
    assert await threads("PLAIN") == ["plain"]
    assert await threads("\\") == ["back\\slash"]
    assert len(await threads(prefix, limit=0)) == 5
    assert len(await threads(prefix, limit=2)) == 2


@pytest.mark.asyncio
async def test_thread_info_user_id_is_kept_or_refused_on_every_backend(checkpointer: Any, make_thread: Any) -> None:
    tid = make_thread("owner")
    assert await checkpointer.aput_thread({"thread_id": tid}, ThreadInfo(thread_id=tid, user_id="alice"))
    info = await checkpointer.aget_thread({"thread_id": tid, "user_id": "alice"})
    assert info is not None and str(info.user_id) == "alice"
    assert tid in [str(t.thread_id) for t in await checkpointer.alist_threads({"user_id": "alice"})
                   if str(t.user_id) == "alice"]
    other = make_thread("owner")
    with pytest.raises(ValueError, match="user_id"):
        await checkpointer.aput_thread({"thread_id": other, "user_id": "bob"},
                                       ThreadInfo(thread_id=other, user_id="alice"))
    assert await checkpointer.aget_thread({"thread_id": other, "user_id": "bob"}) is None


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", [None, "", True])
async def test_a_message_without_an_id_is_refused_and_the_thread_stays_readable(
    checkpointer: Any, make_thread: Any, bad: Any
) -> None:
    """A message whose ``message_id`` was set to None after construction was stored under the key
    "None": every later read of the thread failed with a ValidationError on memory and SQLite
    (Postgres gave the id back as the text "None"). Refused now, nothing written."""
    cfg = {"thread_id": make_thread("no-id")}
    good = Message.text_message("kept")
    await checkpointer.aput_messages(cfg, [good])
    m = Message.text_message("no id")
    m.message_id = bad
    with pytest.raises(ValueError, match="message_id"):
        await checkpointer.aput_messages(cfg, [Message.text_message("also not stored"), m])
    assert [x.text() for x in await checkpointer.alist_messages(cfg)] == ["kept"]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def isolated(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    from tests_py.conftest import make_checkpointer

    return make_checkpointer(request.param, request, tmp_path, enforce_user_isolation=True)


@pytest.mark.asyncio
async def test_a_thread_info_user_never_changes_who_the_caller_is_under_isolation(isolated: Any, make_thread: Any) -> None:
    """Keeping the ThreadInfo's user (above) must not let a caller act as that user where users are
    isolated: an anonymous config with ``ThreadInfo(user_id="alice")`` would otherwise write
    alice's thread. Refused there, nothing changed."""
    tid = make_thread("alices")
    alice = {"thread_id": tid, "user_id": "alice"}
    await isolated.aput_thread(alice, ThreadInfo(thread_id=tid, thread_name="mine"))
    for config in ({"thread_id": tid}, {"thread_id": tid, "user_id": "mallory"}):
        with pytest.raises(ValueError, match="user_id"):
            await isolated.aput_thread(config, ThreadInfo(thread_id=tid, user_id="alice", thread_name="hijacked"))
    info = await isolated.aget_thread(alice)
    assert info is not None and info.thread_name == "mine" and str(info.user_id) == "alice"
    fresh = make_thread("fresh")
    with pytest.raises(ValueError, match="user_id"):
        await isolated.aput_thread({"thread_id": fresh}, ThreadInfo(thread_id=fresh, user_id="alice"))
    assert await isolated.aget_thread({"thread_id": fresh, "user_id": "alice"}) is None
