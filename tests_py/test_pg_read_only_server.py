"""A PostgreSQL server that refuses writes for a while (a standby after a failover, or
``default_transaction_read_only`` set by an operator or a managed service on a full disk), and one
that refuses connections (``too many connections``).

What a user needs: the refusal is a ``TransientStorageError`` (the docs tell callers to retry
those), nothing is written half-way, and once the server takes writes again the next attempt of
the same process writes. The setting is read when a session starts, so a pool that kept its
sessions stayed read-only for ever: every later write of the process failed until a restart.
Each test uses a database of its own (the setting is per database).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import StorageError, TransientStorageError
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils import tool

from tests_py.one_tool_graph import ledger_key, one_tool_graph


@pytest.fixture
def database(tenx_postgres):
    name = f"tenx_ro_{uuid.uuid4().hex[:12]}"
    dsn = tenx_postgres.create_database(name)
    yield name, dsn
    tenx_postgres.drop_database(name)


def _read_only(server, name: str, on: bool, *, end_sessions: bool) -> None:
    if on:
        server.psql(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on', dbname="postgres")
    else:
        server.psql(f'ALTER DATABASE "{name}" RESET default_transaction_read_only', dbname="postgres")
    if end_sessions:  # what a failover does to the sessions of the old primary
        server.psql(
            f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{name}'",
            dbname="postgres",
        )


def _payment_graph(cp, on_pay, side_effects: str = "at_most_once"):
    """One ``pay`` call per user message; ``on_pay`` runs inside the tool."""
    paid: list[int] = []

    @tool(side_effects=side_effects)
    async def pay(amount: int) -> str:
        """Pay an amount."""
        paid.append(amount)
        await on_pay()
        return f"paid {amount}"

    return one_tool_graph(cp, pay, "pay", {"amount": 5}), paid


@pytest.mark.asyncio
@pytest.mark.parametrize("side_effects", ["at_most_once", "idempotent"])
async def test_a_step_refused_by_a_read_only_server_is_transient_and_the_next_attempt_writes(
    tenx_postgres, database, side_effects: str
) -> None:
    name, dsn = database
    switched = asyncio.Event()

    async def failover() -> None:
        if not switched.is_set():
            switched.set()
            await asyncio.to_thread(_read_only, tenx_postgres, name, True, end_sessions=True)

    cp = PgCheckpointer(dsn, pool_config={"max_size": 3})
    app, paid = _payment_graph(cp, failover, side_effects)
    config = {"thread_id": "t-failover"}
    try:
        with pytest.raises(TransientStorageError) as err:
            await app.ainvoke({"messages": [Message.text_message("pay 5", message_id="u-1")]}, config=config)
        assert err.value.error_code == "STORAGE_TRANSIENT_001"
        assert "read-only" in str(err.value)
        # Nothing of the refused step: the thread holds the model step (the call), no result.
        state = await cp.aget_state(config)
        assert [m.role for m in state.context] == ["user", "assistant"]

        # The operator lifts it; the pool's sessions, opened while it held, are not ended.
        _read_only(tenx_postgres, name, False, end_sessions=False)
        result = await app.ainvoke({}, config=config)
        # The call finished in this process before the refusal: its result is replayed (and
        # recorded now), not run again, whatever its class (before: an idempotent call ran
        # twice, an at-most-once one was answered "outcome unknown").
        assert paid == [5]
        tool_text = json.dumps([m.model_dump(mode="json") for m in result["messages"] if m.role == "tool"])
        assert "paid 5" in tool_text and "TOOL_OUTCOME_UNKNOWN" not in tool_text, tool_text
        assert await cp.aget_tool_status(config, ledger_key("u-1", 0, "pay")) == "completed"
        assert result["messages"][-1].role == "assistant"
        # And a new turn of the same process writes too.
        await app.ainvoke({"messages": [Message.text_message("again", message_id="u-2")]}, config=config)
        assert paid == [5, 5]
    finally:
        _read_only(tenx_postgres, name, False, end_sessions=False)
        await cp.arelease()


@pytest.mark.asyncio
async def test_an_input_refused_by_a_read_only_server_writes_nothing_and_a_retry_passes_once_lifted(
    tenx_postgres, database
) -> None:
    name, dsn = database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 2})
    app, paid = _payment_graph(cp, lambda: asyncio.sleep(0))
    try:
        await app.ainvoke({"messages": [Message.text_message("warm up", message_id="w-1")]},
                          config={"thread_id": "t-warm"})
        _read_only(tenx_postgres, name, True, end_sessions=True)
        config = {"thread_id": "t-input"}
        refusals = []
        for _ in range(3):  # refused every time while it holds, never a generic storage error
            with pytest.raises(TransientStorageError) as err:
                await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config=config)
            assert err.value.error_code == "STORAGE_TRANSIENT_001"
            # (The first may meet a session the terminate ended just after the pool's ping.)
            refusals.append("read-only" in str(err.value))
        assert refusals[1:] == [True, True], refusals
        assert await cp.aget_thread(config) is None
        assert paid == [5]  # the warm-up's only

        _read_only(tenx_postgres, name, False, end_sessions=False)
        result = await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config=config)
        assert result["messages"][-1].role == "assistant"
        assert paid == [5, 5]
    finally:
        _read_only(tenx_postgres, name, False, end_sessions=False)
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_server_out_of_connections_is_transient(tenx_postgres, database) -> None:
    name, dsn = database
    role = f"tenx_lim_{uuid.uuid4().hex[:10]}"
    tenx_postgres.psql(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0', dbname="postgres")
    try:
        parts = urlsplit(dsn)
        limited = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
        cp = PgCheckpointer(limited)
        with pytest.raises(TransientStorageError) as err:
            await cp.asetup()
        assert err.value.error_code == "STORAGE_TRANSIENT_001"
        assert "too many connections" in str(err.value)
        assert isinstance(err.value, StorageError)
    finally:
        tenx_postgres.psql(f'DROP ROLE IF EXISTS "{role}"', dbname="postgres")
