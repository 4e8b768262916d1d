"""``aprune`` on PostgreSQL with a Redis that stalls, or that is not given (red-team, session 43).

1. A deleted thread's Redis entries were deleted inside the prune batch's transaction, with the
   deleted threads' rows locked: a Redis that stopped answering held those locks for about a
   second per thread (150 threads: 60 s, the prune then failed), and a turn on one of them failed
   with a statement timeout. The entries now go after the batch's commit, and only while Redis
   answers.
2. Without the application's Redis (``tenxgraph prune`` without ``--redis-url``), prune cannot see
   a 10xGraph run that lives in its Redis entry alone, so threads whose latest state 10xGraph wrote
   are left and the report says so (``legacy_unchecked``); the CLI exits 1.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.storage.checkpointer import PgCheckpointer
from tests_py.test_bad_input_catalogue import echo_graph

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]


class StallingProxy:
    """A TCP proxy to Redis that, once a client sends a ``DEL``, forwards nothing more on any
    connection and sets ``stalled``: a Redis that stops answering mid-prune."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.stalled = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, from_client: bool) -> None:
            while data := await src.read(65536):
                if from_client and b"\r\nDEL\r\n" in data:
                    self.stalled.set()
                if self.stalled.is_set():
                    continue  # swallowed: no answer ever comes
                dst.write(data)
                await dst.drain()

        await asyncio.gather(pump(reader, up_w, True), pump(up_r, writer, False), return_exceptions=True)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_stalled_redis_holds_no_row_lock_of_a_prune_batch(tenx_postgres: Any, pg_dsn: str,
                                                                   tenx_redis: Any) -> None:
    proxy = StallingProxy(int(tenx_redis.url.rsplit(":", 1)[1].split("/")[0]))
    url = await proxy.start()
    cp = PgCheckpointer(pg_dsn, redis_url=url)
    threads = [f"done-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    try:
        app = echo_graph(cp)
        for t in threads:
            await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": t, "user_id": "u"})
        dbname = pg_dsn.rsplit("/", 1)[1]
        ids = ",".join(f"'{t}'" for t in threads)

        async def rows_seen_from_outside() -> int:
            # Another session: the batch's delete is visible only once it committed.
            out = await asyncio.to_thread(tenx_postgres.psql, f"SELECT COUNT(*) FROM threads WHERE thread_id IN ({ids})",
                                          dbname=dbname)
            return int(out.strip())

        prune = asyncio.ensure_future(cp.aprune(finished_older_than=0))
        await asyncio.wait([prune, asyncio.ensure_future(proxy.stalled.wait())], return_when=asyncio.FIRST_COMPLETED)
        assert proxy.stalled.is_set(), f"prune asked Redis for no DEL: {prune.result()}"
        # Redis stalls on the first entry delete: the batch that deleted the threads has committed
        # (its row locks gone), not waiting on Redis inside its transaction.
        assert await rows_seen_from_outside() == 0, "the prune batch waited on Redis with its rows locked"
        report = await prune
        assert report["threads"] == 5 and report["legacy_unchecked"] is False, report
    finally:
        await cp.arelease()
        await proxy.close()


@pytest.mark.parametrize("redis", ["none", "down"])
async def test_threads_10xgraph_wrote_last_are_left_and_said_so_without_redis(
        tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, redis: str) -> None:
    """A completed thread whose latest row has 10xGraph's shape (the context inside the state):
    left by ``finished_older_than`` / ``ledger_ttl`` unless Redis answers, with the report's
    ``legacy_unchecked``; one of ours beside it is pruned either way."""
    cp = PgCheckpointer(pg_dsn, redis_url=tenx_redis.url)
    dbname = pg_dsn.rsplit("/", 1)[1]
    ours, theirs = f"ours-{uuid.uuid4().hex[:8]}", f"theirs-{uuid.uuid4().hex[:8]}"
    try:
        app = echo_graph(cp)
        for t in (ours, theirs):
            await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": t, "user_id": "u"})
    finally:
        await cp.arelease()
    # What 10xGraph writes last: its state row carries the context (ours keeps it in the log).
    state = json.loads(tenx_postgres.psql(
        f"SELECT state_data FROM states WHERE thread_id = '{theirs}' ORDER BY version DESC LIMIT 1", dbname=dbname))
    state["context"] = []
    tenx_postgres.psql(
        f"UPDATE states SET state_data = $j${json.dumps(state)}$j$::jsonb WHERE thread_id = '{theirs}' "
        f"AND version = (SELECT MAX(version) FROM states WHERE thread_id = '{theirs}')", dbname=dbname)

    def count(t: str) -> int:
        return int(tenx_postgres.psql(f"SELECT COUNT(*) FROM threads WHERE thread_id = '{t}'", dbname=dbname).strip())

    if redis == "none":
        # The CLI without --redis-url: the same report, a line saying what was kept, exit 1.
        cli = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "tenxgraph", "--dsn", pg_dsn, "prune",
                                                       "--older-than", "0s", "--dry-run"], capture_output=True, text=True)
        assert cli.returncode == 1 and "would remove: 0 state versions, 1 completed threads" in cli.stdout, cli
        assert "kept: completed threads 10xGraph wrote last" in cli.stdout, cli.stdout
    unasked = PgCheckpointer(pg_dsn, redis_url=None if redis == "none" else "redis://127.0.0.1:1/0")
    try:
        dry = await unasked.aprune(finished_older_than=0, dry_run=True)
        report = await unasked.aprune(finished_older_than=0)
        assert report["threads"] == dry["threads"] == 1 and report["legacy_unchecked"] is dry["legacy_unchecked"] is True
        assert (count(ours), count(theirs)) == (0, 1)
        # Nothing left to report once no such thread is old enough.
        assert (await unasked.aprune(finished_older_than=3600))["legacy_unchecked"] is False
    finally:
        await unasked.arelease()
    asked = PgCheckpointer(pg_dsn, redis_url=tenx_redis.url)
    try:
        report = await asked.aprune(finished_older_than=0)
        assert report["threads"] == 1 and report["legacy_unchecked"] is False, report
        assert count(theirs) == 0
    finally:
        await asked.arelease()
