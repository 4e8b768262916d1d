"""What a transaction that met a network blackhole leaves behind in the connection pool.

`PgStore::bounded` ends a transaction whose statement gets no answer (STORAGE_TRANSIENT_001 after
twice the deadline). The dropped transaction's connection still has a ROLLBACK queued, and the
pool flushes it on return: without a deadline there, on a network that stopped answering, the
connection held its pool slot until TCP gave up (hours), and with a small pool every later call
failed waiting for a slot. The promise: the slot comes back within the deadline, and the next
call on a healthy path succeeds.

Real PostgreSQL (TENXGRAPH_TEST_PG_DSN) behind a real TCP proxy that swallows everything after a
BEGIN once armed.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from urllib.parse import urlsplit

import pytest

from tenxgraph import Message
from tenxgraph.storage.checkpointer import PgCheckpointer
from tests_py.redteam.blackhole import BlackholeAfterBegin

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not DSN, reason="needs TENXGRAPH_TEST_PG_DSN (python -m tenxgraph.testing serve ENV)")

DEADLINE = 1.0


def test_a_blackholed_transaction_gives_its_pool_slot_back_within_the_deadline() -> None:
    parts = urlsplit(DSN)
    proxy = BlackholeAfterBegin(parts.hostname or "127.0.0.1", parts.port or 5432)
    thread = f"slot-{uuid.uuid4().hex[:8]}"
    cfg = {"thread_id": thread, "user_id": "u1"}
    try:
        # One pool slot, so the connection the blackhole holds is the only one there is.
        cp = PgCheckpointer(proxy.dsn_for(DSN, "pool_slot_bh"), schema=f"ps_{uuid.uuid4().hex[:10]}",
                            enforce_user_isolation=False,
                            pool_config={"max_size": 1, "timeout": 3.0, "command_timeout": DEADLINE})
        cp.setup()

        async def scenario() -> tuple[BaseException | None, list[str], float]:
            await cp.aput_messages(cfg, [Message.text_message("first", message_id="m-1")])
            proxy.armed = True
            first: BaseException | None = None
            try:
                await asyncio.wait_for(cp.aput_messages(cfg, [Message.text_message("lost", message_id="m-2")]), 20)
            except Exception as exc:  # noqa: BLE001
                first = exc
            proxy.armed = False  # new connections go through; the held one stays a blackhole
            # Calls after it: each waits up to the pool's 3 s for a slot. The slot must come back
            # (release flush bounded by the deadline, then a new connection) well before 20 s.
            errors: list[str] = []
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20:
                try:
                    await asyncio.wait_for(cp.aput_messages(cfg, [Message.text_message("next", message_id="m-3")]), 10)
                    return first, errors, time.monotonic() - t0
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{getattr(exc, 'error_code', None)}: {exc}")
            return first, errors, float("inf")

        first, errors, took = asyncio.run(scenario())
        assert proxy.tripped.is_set(), "the blackhole never started"
        assert getattr(first, "error_code", None) == "STORAGE_TRANSIENT_001", first
        assert took < 20, ("the pool slot never came back: every later call waited for it", errors[-3:])
        ids = [str(m.message_id) for m in asyncio.run(cp.alist_messages(cfg))]
        assert ids == ["m-1", "m-3"], ids  # the blackholed write left nothing half-way
    finally:
        proxy.stop()
