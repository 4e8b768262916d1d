"""What a transaction that met a network blackhole leaves behind in the connection pool.

`PgStore::bounded` ends a transaction whose statement gets no answer (STORAGE_TRANSIENT_001 after
twice the deadline). The dropped transaction's connection still has a ROLLBACK queued, and the
pool flushes it on return: without a deadline there, on a network that stopped answering, the
connection held its pool slot until TCP gave up (hours), and with a small pool every later call
failed waiting for a slot. The same for a plain statement (or a BEGIN) cut off mid-flight by the
deadline or by the caller's cancellation: its reply is still pending when the connection goes
back. The promise: the slot comes back within the deadline, and the next call on a healthy path
succeeds.

Real PostgreSQL (TENXGRAPH_TEST_PG_DSN) behind a real TCP proxy that swallows everything after a
BEGIN once armed.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

from tenxgraph import Message
from tenxgraph.storage.checkpointer import PgCheckpointer
from tests_py.redteam.blackhole import BlackholeAfterBegin, FreezeAtPing, FreezeProxy

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not DSN, reason="needs TENXGRAPH_TEST_PG_DSN (python -m tenxgraph.testing serve ENV)")

DEADLINE = 1.0


def _one_slot_store(proxy: Any, app: str) -> PgCheckpointer:
    """A store behind ``proxy`` with one pool slot (the connection the proxy holds is the only
    one there is), waits of 3 s for it, and a statement deadline of ``DEADLINE``."""
    cp = PgCheckpointer(proxy.dsn_for(DSN, app), schema=f"ps_{uuid.uuid4().hex[:10]}", enforce_user_isolation=False,
                        pool_config={"max_size": 1, "timeout": 3.0, "command_timeout": DEADLINE})
    cp.setup()
    return cp


def test_a_blackholed_transaction_gives_its_pool_slot_back_within_the_deadline() -> None:
    parts = urlsplit(DSN)
    proxy = BlackholeAfterBegin(parts.hostname or "127.0.0.1", parts.port or 5432)
    thread = f"slot-{uuid.uuid4().hex[:8]}"
    cfg = {"thread_id": thread, "user_id": "u1"}
    try:
        cp = _one_slot_store(proxy, "pool_slot_bh")

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


async def _recovers(cp: PgCheckpointer, cfg: dict, budget: float = 20.0) -> tuple[float, list[str]]:
    """How long until a write goes through again (each attempt waits up to the pool's 3 s)."""
    errors: list[str] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < budget:
        try:
            await asyncio.wait_for(cp.aput_messages(cfg, [Message.text_message("next", message_id=f"n-{uuid.uuid4().hex[:6]}")]), 10)
            return time.monotonic() - t0, errors
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__} {getattr(exc, 'error_code', None)}: {str(exc)[:120]}")
    return float("inf"), errors


@pytest.mark.parametrize("op", ["aget_state", "alist_messages", "aput_messages"])
@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_a_blackholed_statement_gives_its_pool_slot_back(op: str, how: str) -> None:
    """Every connection open at the moment goes dark (new ones pass); a call on it ends by the
    store's deadline or by the caller's `wait_for` (0.3 s). With one pool slot, later calls must
    go through within the bound: before, only a dropped transaction's connection was flushed
    under the deadline, and a plain statement's held the slot (found by red team, session 18)."""
    parts = urlsplit(DSN)
    proxy = FreezeProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    cfg = {"thread_id": f"slot-{uuid.uuid4().hex[:8]}", "user_id": "u1"}
    try:
        cp = _one_slot_store(proxy, "pool_slot_freeze")

        async def scenario() -> tuple[float, list[str], BaseException | None]:
            await cp.aput_messages(cfg, [Message.text_message("first", message_id="m-1")])
            assert proxy.freeze() >= 1
            call = {"aget_state": lambda: cp.aget_state(cfg),
                    "alist_messages": lambda: cp.alist_messages(cfg),
                    "aput_messages": lambda: cp.aput_messages(cfg, [Message.text_message("x", message_id="m-x")])}[op]
            first: BaseException | None = None
            try:
                await asyncio.wait_for(call(), 0.3 if how == "cancel" else 20)
            except BaseException as exc:  # noqa: BLE001
                first = exc
            took, errors = await _recovers(cp, cfg)
            return took, errors, first

        took, errors, first = asyncio.run(scenario())
        # The call itself may end either way (a read can go to a fresh connection); when it
        # fails, it fails typed, or by the caller's own timeout.
        assert first is None or isinstance(first, asyncio.TimeoutError) or \
            getattr(first, "error_code", None) == "STORAGE_TRANSIENT_001", first
        assert took < 20, (f"the pool slot never came back after {op} ({how}); first={first!r}", errors[-2:])
    finally:
        proxy.stop()


def test_a_connection_that_goes_dark_between_the_release_pings_gives_its_slot_back(
        caplog: pytest.LogCaptureFixture) -> None:
    """A connection given back to the pool is pinged twice: the store's ping, bounded by the
    deadline, then sqlx's own, which has none. A network that goes dark between the two held
    the pool's slot until TCP gave up (with one slot, every later call failed): two fresh-clone
    CI runs of session 24 met it by chance (the freeze above landing between the pings of the
    first write's connection). Frozen here at that exact point: the slot must come back."""
    parts = urlsplit(DSN)
    proxy = FreezeAtPing(parts.hostname or "127.0.0.1", parts.port or 5432)
    cfg = {"thread_id": f"slot-{uuid.uuid4().hex[:8]}", "user_id": "u1"}
    try:
        cp = _one_slot_store(proxy, "pool_slot_ping")

        async def scenario() -> tuple[float, list[str]]:
            proxy.armed = True
            # A write's transaction gives its connection back through the pool (both pings).
            await cp.aput_messages(cfg, [Message.text_message("first", message_id="m-1")])
            await asyncio.get_running_loop().run_in_executor(None, proxy.tripped.wait, 20)
            return await _recovers(cp, cfg)

        took, errors = asyncio.run(scenario())
        assert proxy.tripped.is_set(), "the connection never went dark at its second ping"
        assert took < 20, ("the pool slot never came back", errors[-2:])
        ids = [str(m.message_id) for m in asyncio.run(cp.alist_messages(cfg))]
        assert ids[0] == "m-1" and len(ids) == 2, ids
        # The operator hears of it (a WARNING through the tenxgraph logger).
        assert any("given back to the pool got no answer" in r.getMessage() and r.levelname == "WARNING"
                   for r in caplog.records), [r.getMessage() for r in caplog.records][-5:]
    finally:
        proxy.stop()
