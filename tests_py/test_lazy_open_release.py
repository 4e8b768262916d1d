"""``arelease()`` while the checkpointer's first open is still in flight (a migration waiting for
another migrator's lock, a slow connect): the release found nothing open and returned, then the
open finished and its pool stayed connected for the rest of the process."""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import pytest

from tenxgraph.core.exceptions import StorageError
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.postgres_server import find_pg_binary

# The key src/store/postgres/migrations.rs takes while it migrates.
_MIGRATION_LOCK = 0x4147_4E54_464C_5721


@pytest.fixture
def fresh_database(tenx_postgres):
    name = f"tenx_lazy_{uuid.uuid4().hex[:12]}"
    dsn = tenx_postgres.create_database(name)
    yield name, dsn
    tenx_postgres.drop_database(name)


def _ours(tenx_postgres, name: str) -> int:
    return int(tenx_postgres.psql(
        f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{name}' AND application_name = 'tenxgraph'").strip())


async def _until(check, what: str) -> None:
    for _ in range(600):
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.asyncio
async def test_a_release_during_the_first_open_closes_what_the_open_makes(tenx_postgres, fresh_database) -> None:
    name, dsn = fresh_database
    # Another migrator holds the lock: the first open waits in its migration.
    holder = subprocess.Popen([find_pg_binary("psql"), "-X", "-q", "-d", dsn], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdin is not None
        holder.stdin.write(f"SELECT pg_advisory_lock({_MIGRATION_LOCK});\n")
        holder.stdin.flush()
        await _until(lambda: tenx_postgres.psql(
            f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
            f"(SELECT oid FROM pg_database WHERE datname = '{name}')").strip() == "1", "the holder's lock")
        cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
        opening = asyncio.create_task(cp.asetup())
        await _until(lambda: tenx_postgres.psql(
            f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = "
            f"(SELECT oid FROM pg_database WHERE datname = '{name}')").strip() == "1", "the open to wait for the lock")
        await asyncio.wait_for(cp.arelease(), 30)
        holder.stdin.write(f"SELECT pg_advisory_unlock({_MIGRATION_LOCK});\n")
        holder.stdin.flush()
        # The migration is done, and the checkpointer is closed: setup says so.
        with pytest.raises(StorageError, match="the checkpointer was closed") as caught:
            await asyncio.wait_for(opening, 60)
        assert caught.value.error_code == "STORAGE_001"
        await _until(lambda: _ours(tenx_postgres, name) == 0, "the opened pool to be closed")
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=30)


@pytest.mark.asyncio
async def test_a_release_before_the_first_use_does_not_close_a_later_open(tenx_postgres, fresh_database) -> None:
    """A checkpointer released before anything opened it opens on its next use and stays usable."""
    name, dsn = fresh_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 2})
    await cp.arelease()
    await cp.asetup()
    try:
        assert await cp.aget_state({"thread_id": "nobody"}) is None
    finally:
        await cp.arelease()


@pytest.mark.asyncio
async def test_setup_after_release_says_the_checkpointer_was_closed(tenx_postgres, fresh_database) -> None:
    """It read "migration failed: attempted to acquire a connection on a closed pool"
    (SchemaVersionError), as if the schema were broken."""
    name, dsn = fresh_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 2})
    await cp.asetup()
    await cp.arelease()
    with pytest.raises(StorageError, match="the checkpointer was closed") as caught:
        await cp.asetup()
    assert caught.value.error_code == "STORAGE_001"
