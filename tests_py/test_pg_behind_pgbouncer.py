"""PgCheckpointer behind PgBouncer, as many production deployments run it.

Session pooling works as a direct connection does. Transaction pooling before PgBouncer 1.21
(Debian 12 ships 1.18) cannot work with prepared statements: the server connection changes
between our statements, so a statement prepared on one is found again (or missing) on another.
What a user needs then is to be told what is wrong and what to change, not a bare
`prepared statement "sqlx_s_1" already exists` (the error before session 28).
"""

from __future__ import annotations

import uuid

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import StorageError
from tenxgraph.storage.checkpointer import PgCheckpointer

from tests_py.one_tool_graph import one_tool_graph
from tests_py.pgbouncer_server import start_pgbouncer


@pytest.fixture
def database(tenx_postgres):
    name = f"tenx_pgb_{uuid.uuid4().hex[:12]}"
    tenx_postgres.create_database(name)
    yield name
    tenx_postgres.drop_database(name)


def _tool_graph(cp, ran: list[int]):
    async def pay(amount: int) -> str:
        """Pay an amount."""
        ran.append(amount)
        return f"paid {amount}"

    return one_tool_graph(cp, pay, "pay", {"amount": 7})


@pytest.mark.asyncio
async def test_session_pooling_runs_turns_as_a_direct_connection_does(tenx_postgres, database) -> None:
    bouncer = start_pgbouncer(tenx_postgres.dsn, "session")
    cp = PgCheckpointer(bouncer.dsn_for(database), pool_config={"max_size": 3})
    ran: list[int] = []
    try:
        app = _tool_graph(cp, ran)
        for i in range(3):
            result = await app.ainvoke({"messages": [Message.text_message(f"pay {i}", message_id=f"u-{i}")]},
                                       config={"thread_id": "t-session"})
            assert [m.role for m in result["messages"]][-3:] == ["assistant", "tool", "assistant"]
        assert ran == [7, 7, 7]
        state = await cp.aget_state({"thread_id": "t-session"})
        assert len(state.context) == 12
    finally:
        await cp.arelease()
        bouncer.stop()


@pytest.mark.asyncio
async def test_transaction_pooling_that_breaks_prepared_statements_is_named_in_the_error(
    tenx_postgres, database
) -> None:
    direct = PgCheckpointer(tenx_postgres.dsn_for(database))
    await direct.asetup()  # migrated directly, as a deploy step would
    await direct.arelease()
    # One server connection: the second client's first prepared statement meets the first's.
    bouncer = start_pgbouncer(tenx_postgres.dsn, "transaction", pool_size=1)
    first = PgCheckpointer(bouncer.dsn_for(database))
    second = PgCheckpointer(bouncer.dsn_for(database))
    try:
        # Each client's connections prepare their statements under the same names on the one
        # server connection: from the second preparer on, they collide. Every failure says why.
        errors = []
        for cp in (first, second, first, second):
            try:
                assert await cp.aget_state({"thread_id": "t-tx"}) is None
            except StorageError as e:
                errors.append(str(e))
        assert errors, "a second client's prepared statement met the first's"
        for text in errors:
            assert "pooler in transaction mode" in text and "max_prepared_statements" in text, text
    finally:
        await first.arelease()
        await second.arelease()
        bouncer.stop()
