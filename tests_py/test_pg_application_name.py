"""The server sees PgCheckpointer's connections under the DSN's own ``application_name`` when it
names one (a user's monitoring tells services apart by it), and as ``tenxgraph`` otherwise."""

from __future__ import annotations

import asyncio

import pytest

from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.postgres_server import PostgresServer


def _names(pg: PostgresServer, dsn: str) -> set[str]:
    dbname = dsn.rsplit("/", 1)[1].split("?", 1)[0]
    out = pg.psql(
        f"SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = '{dbname}' "
        "AND pid <> pg_backend_pid()", dbname=dbname)
    return {line for line in out.splitlines() if line}


async def _names_while_open(pg: PostgresServer, dsn: str) -> set[str]:
    cp = PgCheckpointer(dsn, enforce_user_isolation=False)
    try:
        await cp.asetup()
        assert await cp.aget_state({"thread_id": "nobody"}) is None  # one pooled connection kept
        return await asyncio.to_thread(_names, pg, dsn)
    finally:
        await cp.arelease()


@pytest.mark.asyncio
async def test_connections_are_named_tenxgraph_by_default(pg_dsn: str, tenx_postgres: PostgresServer) -> None:
    assert await _names_while_open(tenx_postgres, pg_dsn) == {"tenxgraph"}


@pytest.mark.asyncio
@pytest.mark.parametrize("sep", ["?", "&"])
async def test_the_dsns_application_name_is_kept(pg_dsn: str, tenx_postgres: PostgresServer, sep: str) -> None:
    dsn = pg_dsn + ("?connect_timeout=10" if sep == "&" else "") + f"{sep}application_name=billing-agent"
    assert await _names_while_open(tenx_postgres, dsn) == {"billing-agent"}
