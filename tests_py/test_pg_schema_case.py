"""A schema name with capitals names the schema PostgreSQL folds it to (``Tenant`` is ``tenant``),
and every check the migration makes must look there. The catalog queries bound the raw name, so
they found nothing: the id-type check was skipped (a bigint database opened as "string" failed
on its first turn instead of being refused) and the read-only path for an up-to-date schema was
never taken (``CREATE SCHEMA`` ran for a user with only read/write rights, who was refused)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.storage.checkpointer import PgCheckpointer

from tests_py.tool_graphs import one_node_graph


@pytest.mark.asyncio
async def test_a_mixed_case_schema_with_other_id_types_is_refused(pg_dsn: str) -> None:
    owner = PgCheckpointer(pg_dsn, schema="tenant_ids", id_type="bigint", user_id_type="bigint")
    await owner.asetup()
    await owner.arelease()
    for name in ("tenant_ids", "Tenant_IDs"):
        cp = PgCheckpointer(pg_dsn, schema=name)  # string ids, the schema has bigint ones
        with pytest.raises(ValueError, match="created with"):
            await cp.asetup()
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_user_with_only_read_write_rights_opens_a_migrated_schema_by_any_case(
    tenx_postgres: Any, pg_dsn: str
) -> None:
    dbname = pg_dsn.rsplit("/", 1)[1].split("?", 1)[0]
    role = f"app_{uuid.uuid4().hex[:10]}"
    tenx_postgres.psql(
        f"CREATE ROLE {role} LOGIN; REVOKE CREATE ON DATABASE {dbname} FROM PUBLIC; "
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC", dbname=dbname)
    try:
        owner = PgCheckpointer(pg_dsn, schema="tenant")  # the deploy step, as the owner
        await owner.asetup()
        await owner.arelease()
        tenx_postgres.psql(
            f"GRANT USAGE ON SCHEMA tenant TO {role}; "
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tenant TO {role}; "
            f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA tenant TO {role}; "
            f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tenant TO {role}", dbname=dbname)
        user_part = pg_dsn.split("://", 1)[1].split("@", 1)[0]
        app_dsn = pg_dsn.replace(f"://{user_part}@", f"://{role}@", 1)
        for name in ("tenant", "Tenant"):
            cp = PgCheckpointer(app_dsn, schema=name)
            try:
                await cp.asetup()
                out = await one_node_graph(cp).ainvoke(
                    {"messages": [Message.text_message("hi")]}, {"thread_id": f"t-{name}"})
                assert out["messages"][-1].text() == "ok"
            finally:
                await cp.arelease()
        # Both names wrote to the one schema.
        count = tenx_postgres.psql("SELECT count(*) FROM tenant.threads", dbname=dbname).strip()
        assert count == "2"
    finally:
        tenx_postgres.psql(f"DROP OWNED BY {role}; DROP ROLE {role}", dbname=dbname)
