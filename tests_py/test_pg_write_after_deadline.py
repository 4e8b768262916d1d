"""A write the caller was told failed (STORAGE_TRANSIENT_001, "nothing was written") must not
land afterwards (helper red-team of exhaustion, session 33). A session held the thread's row
lock past the client's statement deadline; the input write gave up, the lock holder then ended,
and the server-side statement, still waiting for the lock (step, input and ledger writes wait
past lock_timeout, migration 12), committed: the thread held the message the client was told
had failed, and a resend was refused STORAGE_BUSY_001. The server now ends the statement before
the client's deadline."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import TransientStorageError
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.postgres_server import find_pg_binary

from tests_py.tool_graphs import one_node_graph


class RowLock:
    """A psql session holding ``sql``'s row locks in an open transaction."""

    def __init__(self, dsn: str, sql: str) -> None:
        self.proc = subprocess.Popen([find_pg_binary("psql"), dsn, "-X", "-Atq"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"BEGIN;\n{sql};\nSELECT 'held';\n")
        self.proc.stdin.flush()
        while (line := self.proc.stdout.readline()) and line.strip() != "held":
            pass

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("ROLLBACK;\n\\q\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)


@pytest.mark.asyncio
async def test_an_input_write_reported_failed_never_lands_later(pg_dsn: str) -> None:
    for _ in range(2):
        schema = f"lc_{uuid.uuid4().hex[:8]}"
        cp = PgCheckpointer(pg_dsn, schema=schema, pool_config={"command_timeout": 1.0})
        app = one_node_graph(cp, reply="reply")
        cfg: dict[str, Any] = {"thread_id": "t1", "user_id": "u"}
        await app.ainvoke({"messages": [Message.text_message("first")]}, cfg)
        lock = RowLock(pg_dsn, f"SELECT 1 FROM {schema}.threads WHERE thread_id = 't1' FOR UPDATE")
        try:
            with pytest.raises(TransientStorageError):
                await app.ainvoke({"messages": [Message.text_message("again", message_id="m-again")]}, cfg)
        finally:
            lock.release()  # right after the caller gave up: the old window
        # The server notices a client gone within client_connection_check_interval (1 s); a
        # statement it had not ended by then would have committed by now.
        await asyncio.sleep(3)
        await cp.arelease()
        fresh = PgCheckpointer(pg_dsn, schema=schema)
        state = await fresh.aget_state(cfg)
        assert [m.text() for m in state.context] == ["first", "reply"]
        # And the input can simply be sent again.
        out = await one_node_graph(fresh, reply="reply").ainvoke(
            {"messages": [Message.text_message("again", message_id="m-again")]}, cfg)
        assert [m.text() for m in out["messages"]] == ["again", "reply"]
        await fresh.arelease()
