"""PgCheckpointer with Redis: one Redis shared by several stores, and a Redis that blips (helper
red-team, session 32). Real PostgreSQL and real Redis servers; the blip is a real SIGSTOP.

1. Redis keys named no database: two services sharing one Redis, on two databases or schemas with
   the same thread ids, stopped each other's runs (a stop request, a preemption), cleared each
   other's stop requests at run start, and read each other's cached values.
2. The generic cache (stop requests, ``aput_cache_value``) went to Redis when it was up and to
   the table while it was marked down; its values have no version, so once Redis answered again
   its older value won: a put made during a blip was undone, and a stop request cleared during
   one stopped the next turn.
3. Generic keys were not escaped in Redis: ``("a:b", "c")`` and ``("a", "b:c")`` were one entry,
   a key prefix was a glob, and namespace ``"tenxgraph"`` reached the state cache.
The generic cache is the table alone now, and the state cache's Redis keys carry the store's id.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.services import start_redis

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
REDIS = os.environ.get("TENXGRAPH_TEST_REDIS_URL")
pytestmark = pytest.mark.skipif(not (DSN and REDIS), reason="needs TENXGRAPH_TEST_PG_DSN and TENXGRAPH_TEST_REDIS_URL")


def _cfg(thread: str) -> dict[str, Any]:
    return {"thread_id": thread, "user_id": "alice"}


@pytest.mark.asyncio
async def test_two_stores_sharing_one_redis_never_share_an_entry() -> None:
    tag = uuid.uuid4().hex[:8]
    a = PgCheckpointer(DSN, redis_url=REDIS, schema=f"svc_a_{tag}")
    b = PgCheckpointer(DSN, redis_url=REDIS, schema=f"svc_b_{tag}")
    try:
        thread = f"shared-{tag}"
        await a.arequest_stop(_cfg(thread))
        assert await a.ais_stop_requested(_cfg(thread)) is True
        assert await b.ais_stop_requested(_cfg(thread)) is False, "A's stop request stops B's run"

        await a.aput_cache_value("session", "cart", {"owner": "A"})
        assert await b.aget_cache_value("session", "cart") is None
        assert await b.alist_cache_keys("session") == []
        await b.aput_cache_value("session", "cart", {"owner": "B"})
        assert await a.aget_cache_value("session", "cart") == {"owner": "A"}
        await b.aclear_cache_value("session", "cart")
        assert await a.aget_cache_value("session", "cart") == {"owner": "A"}

        # A's cached state is not B's, for a thread B has never heard of.
        state = AgentState()
        state.context = [Message.text_message("A's conversation")]
        await a.aput_state_cache(_cfg(thread), state)
        assert await b.aget_state_cache(_cfg(thread)) is None
        # B's run start clears B's stop request only.
        await b.aclear_stop_request(_cfg(thread))
        assert await a.ais_stop_requested(_cfg(thread)) is True
    finally:
        await a.arelease()
        await b.arelease()


@pytest.mark.asyncio
async def test_generic_keys_do_not_alias_and_prefixes_are_not_globs() -> None:
    cp = PgCheckpointer(DSN, redis_url=REDIS, schema=f"svc_k_{uuid.uuid4().hex[:8]}")
    try:
        await cp.aput_cache_value("a:b", "c", 1)
        assert await cp.aget_cache_value("a", "b:c") is None
        assert await cp.alist_cache_keys("a") == []
        await cp.aput_cache_value("ns", "abc", 2)
        assert await cp.alist_cache_keys("ns", prefix="a*c") == []
        assert await cp.alist_cache_keys("ns", prefix="ab") == ["abc"]
        # Namespace "tenxgraph" (not the reserved "tenxgraph:...") never reaches a cached state.
        thread = f"fresh-{uuid.uuid4().hex[:8]}"
        await cp.aput_cache_value("tenxgraph", f"state_cache:{thread}:alice",
                                  {"v": 0, "d": {"context": [], "execution_meta": {"current_node": "x"}}})
        assert await cp.aget_state_cache(_cfg(thread)) is None
    finally:
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_cache_write_or_a_stop_clear_made_during_a_redis_blip_stands() -> None:
    redis = start_redis(use_env=False)
    assert redis.pid is not None
    cp = PgCheckpointer(DSN, redis_url=redis.url, schema=f"svc_blip_{uuid.uuid4().hex[:8]}")
    try:
        thread = f"blip-{uuid.uuid4().hex[:8]}"
        await cp.aput_cache_value("session", "cart", {"cart": "v1"})
        await cp.arequest_stop(_cfg(thread))
        await cp.aput_state_cache(_cfg(thread), AgentState())  # Redis in use
        os.kill(redis.pid, signal.SIGSTOP)
        try:
            # A Redis call times out: Redis is marked down for a while.
            await cp.aget_state_cache(_cfg(thread))
        finally:
            os.kill(redis.pid, signal.SIGCONT)
        await cp.aput_cache_value("session", "cart", {"cart": "v2"})
        await cp.aclear_stop_request(_cfg(thread))
        # Past the moment Redis is tried again (2 s after the failure), the last writes still hold.
        for _ in range(8):
            assert await cp.aget_cache_value("session", "cart") == {"cart": "v2"}
            assert await cp.ais_stop_requested(_cfg(thread)) is False
            await asyncio.sleep(0.5)
        await cp.aput_state_cache(_cfg(thread), AgentState())  # Redis answers again
    finally:
        await cp.arelease()
        redis.stop()
