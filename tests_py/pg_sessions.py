"""PostgreSQL sessions a test plays beside the runtime's own: one-shot ``psql`` statements, a
session that holds locks across statements (``Holder``), and the wait for a backend to block on
another (``pg_blocking_pids``: a barrier, not a sleep)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

from tenxgraph.testing.postgres_server import find_pg_binary


def psql(dsn: str, sql: str) -> str:
    """``sql`` in a session of its own; its output, unaligned, one row a line."""
    res = subprocess.run([find_pg_binary("psql"), "-X", "-Atq", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


class Holder:
    """A ``psql`` session kept open: statements sent one line at a time, so a transaction and its
    locks last across them; closed with a ROLLBACK."""

    def __init__(self, dsn: str) -> None:
        self.proc = subprocess.Popen([find_pg_binary("psql"), "-X", "-Atq", "-d", dsn], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, sql: str) -> str:
        """Sends ``sql``; the first line it printed (blocks until there is one)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(sql + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    async def ask_async(self, sql: str) -> str:
        return await asyncio.to_thread(self.ask, sql)

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.write("ROLLBACK;\n\\q\n")
            self.proc.stdin.flush()
        self.proc.wait(30)


async def blocked_by(dsn: str, pid: str, task: "asyncio.Task[Any] | None" = None, timeout: float = 60) -> str:
    """The lowest pid of a backend waiting on ``pid``'s locks, or '' when none did within
    ``timeout`` (or ``task`` ended first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (task is None or not task.done()):
        found = psql(dsn, f"SELECT min(pid) FROM pg_stat_activity WHERE {pid} = ANY(pg_blocking_pids(pid))")
        if found:
            return found
        await asyncio.sleep(0.02)
    return ""
