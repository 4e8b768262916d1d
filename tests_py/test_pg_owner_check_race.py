"""User B's call on a thread id at the moment user A's first write creates that thread. The
owner was checked in a statement of its own and the work done in others: when A's commit landed
between the two, B's ``aclear_state``, ``aclean_thread`` or ``adelete_message`` destroyed A's new
rows and returned as if nothing was wrong, and B's ``alist_messages`` / ``aget_state`` read them
(red-team, session 39: about one try in ten). Now a read runs in the snapshot the check was made
in, and a change checks the owner of the thread row it holds.

The race is real (two pools, the two calls started together with a random number of event-loop
turns between them) and the assertion is that no try of many ever crosses users: with the check
where the work is done, none can, however the two interleave."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import MessageNotFoundError, StorageError
from tenxgraph.storage.checkpointer import PgCheckpointer

from .pg_sessions import psql

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not DSN, reason="needs TENXGRAPH_TEST_PG_DSN (python -m tenxgraph.testing serve ENV)")

TRIES = 150


def _config(thread: str, user: str, scoped: bool) -> dict[str, Any]:
    config: dict[str, Any] = {"thread_id": thread, "user_id": user}
    if scoped:
        config["authz"] = {"scope": "owner", "user_id": user}
    return config


async def _race(op: str, scoped: bool) -> list[str]:
    """Crossings seen over TRIES threads: B's call that changed or read what A created."""
    schema = f"own_{uuid.uuid4().hex[:10]}"
    # Two checkpointers, two pools: A's commit and B's statements interleave on the server.
    cpa = PgCheckpointer(postgres_dsn=DSN, schema=schema, enforce_user_isolation=not scoped)
    cpb = PgCheckpointer(postgres_dsn=DSN, schema=schema, enforce_user_isolation=not scoped)
    await cpa.asetup()
    await cpb.asetup()
    crossed: list[str] = []
    rng = random.Random(39)
    try:
        for i in range(TRIES):
            thread, mid = f"t:{i}", f"m:{i}"
            a, b = _config(thread, "A", scoped), _config(thread, "B", scoped)
            secret = Message(message_id=mid, role="user", content=Message.text_message("A-secret").content)
            turns = rng.randint(0, 6)

            async def by_b() -> Any:
                for _ in range(turns):
                    await asyncio.sleep(0)
                if op == "clear":
                    return await cpb.aclear_state(b)
                if op == "clean":
                    return await cpb.aclean_thread(b)
                if op == "delete":
                    return await cpb.adelete_message(b, mid)
                if op == "list":
                    return await cpb.alist_messages(b)
                return await cpb.aget_state(b)

            done_a, done_b = await asyncio.gather(cpa.aput_messages(a, [secret]), by_b(), return_exceptions=True)
            assert not isinstance(done_a, BaseException), done_a
            if isinstance(done_b, StorageError) and done_b.error_code.startswith("STORAGE_FORBIDDEN"):
                continue  # B came after A: refused, as it must be
            if isinstance(done_b, MessageNotFoundError):
                continue  # B's delete came first: nothing of A's was there
            assert not isinstance(done_b, BaseException), done_b
            if op in ("list", "get"):
                if "A-secret" in repr(done_b):
                    crossed.append(f"{thread}: B read A's message")
                continue
            left = psql(str(DSN), f"SELECT (SELECT count(*) FROM \"{schema}\".threads WHERE thread_id = '{thread}'), "
                                  f"(SELECT count(*) FROM \"{schema}\".messages WHERE thread_id = '{thread}')")
            if left != "1|1":
                crossed.append(f"{thread}: B's {op} returned {done_b!r}, A's rows (threads|messages) {left}")
    finally:
        await cpa.arelease()
        await cpb.arelease()
        psql(str(DSN), f'DROP SCHEMA "{schema}" CASCADE')
    return crossed


@pytest.mark.asyncio
@pytest.mark.parametrize("op", ["clear", "clean", "delete", "list"])
async def test_another_users_call_never_reaches_a_thread_created_beside_it(op: str) -> None:
    assert await _race(op, scoped=False) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("op", ["clear", "list", "get"])
async def test_an_owner_scoped_call_never_reaches_a_thread_created_beside_it(op: str) -> None:
    """A store that does not isolate users, with the per-call ``config["authz"]`` owner scope:
    the check was only Python's, before any read."""
    assert await _race(op, scoped=True) == []


WINDOW_CALLS = {
    "aget_tool_result": lambda cp, b: cp.aget_tool_result(b, "k"),
    "aget_tool_status": lambda cp, b: cp.aget_tool_status(b, "k"),
    "aget_lease": lambda cp, b: cp.aget_lease(b),
    "aget_thread_owner": lambda cp, b: cp.aget_thread_owner(b["thread_id"], b),
    "alist_messages": lambda cp, b: cp.alist_messages(b),
    "aget_state": lambda cp, b: cp.aget_state(b),
    "aget_thread": lambda cp, b: cp.aget_thread(b),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("call", list(WINDOW_CALLS))
async def test_an_owner_scoped_read_made_right_after_its_check_reads_nothing_of_another_user(
        call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic: user A creates the thread (a run, a recorded tool result) right after B's
    ``config["authz"]`` check passed on a thread with no owner yet. The tool-result, lease and
    owner reads checked the scope in Python only, and gave B A's recorded result, A's run's lease
    holder (run id, host, pid) and A's name (helper red-team of the fix above, 1 try in 5-10
    when raced). The others are controls, fixed with the first race."""
    import tenxgraph.storage.checkpointer.native_checkpointer as native

    from .reply_graph import reply_graph

    schema = f"win_{uuid.uuid4().hex[:10]}"
    cpa = PgCheckpointer(postgres_dsn=DSN, schema=schema, enforce_user_isolation=False)
    cpb = PgCheckpointer(postgres_dsn=DSN, schema=schema, enforce_user_isolation=False)
    await cpa.asetup()
    a, b = _config("t:1", "A", True), _config("t:1", "B", True)
    app = reply_graph(cpa)
    created: list[bool] = []
    check = native.check_authz

    async def then_a_creates_the_thread(cp: Any, config: dict[str, Any], thread_id: Any = None) -> None:
        await check(cp, config, thread_id)
        if config.get("user_id") == "B" and not created:
            created.append(True)
            await app.ainvoke({"messages": [Message.text_message("A-secret")]}, dict(a))
            await cpa.aput_tool_result(dict(a), "k", {"secret": "A-secret"})

    monkeypatch.setattr(native, "check_authz", then_a_creates_the_thread)
    try:
        seen = await WINDOW_CALLS[call](cpb, dict(b))
        assert created, "the window was not reached"
        assert seen in (None, []), f"B read {seen!r} of A's thread"
        with pytest.raises(StorageError) as refused:  # outside the window, the scope refuses
            await WINDOW_CALLS[call](cpb, dict(b))
        assert refused.value.error_code == "STORAGE_FORBIDDEN_001"
    finally:
        await cpa.arelease()
        await cpb.arelease()
        psql(str(DSN), f'DROP SCHEMA "{schema}" CASCADE')
