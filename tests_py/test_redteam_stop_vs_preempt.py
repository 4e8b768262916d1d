"""Red team (session 9): a user's stop must end a hung node even when a new turn with
``on_busy="interrupt"`` arrives right after it.

Both requests lived under the same key: ``stop()`` wrote a hard stop there, the preempting run
its soft ``{"preempt": ...}`` (stop at the next safe point, never inside a node), and the later
write replaced the earlier. A preemption landing after the user's stop and before the running
execution's next poll turned the hard stop into a soft one: the hung node went on (until its
node_timeout, 900 s by default) and the user's stop was lost.

Deterministic: the running execution (a child process, so nothing reaches it but the store) is
frozen with SIGSTOP while the stop and then the preemption are written, and thawed after.
SQLite, Postgres, Postgres+Redis (the key lives in Redis there).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import ThreadBusyError
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
from tenxgraph.testing.crash import child_env

AGENT = Path(__file__).resolve().parent / "crash_agents" / "hung_agent.py"


@pytest.fixture(params=["sqlite", "postgres", "postgres+redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, str]:
    if request.param == "sqlite":
        return str(tmp_path / "hung.db"), "-", "public"
    redis = request.getfixturevalue("tenx_redis").url if request.param == "postgres+redis" else "-"
    return request.getfixturevalue("tenx_postgres").dsn, redis, f"t_{uuid.uuid4().hex[:16]}"


def _open(db: str, redis: str, schema: str):
    if db.startswith("postgresql://"):
        return PgCheckpointer(db, redis_url=None if redis == "-" else redis, schema=schema, enforce_user_isolation=False)
    return SqliteCheckpointer(db)


def _noop_graph(cp):
    g = StateGraph(AgentState)
    g.add_node("n", lambda state: [Message.text_message("b", role="assistant")])
    g.add_edge(START, "n")
    g.add_edge("n", END)
    return g.compile(checkpointer=cp)


def test_a_stop_followed_by_a_preemption_still_ends_the_hung_node(store: tuple[str, str, str], tmp_path: Path) -> None:
    db, redis, schema = store
    tid, started = f"hung-{uuid.uuid4().hex[:8]}", tmp_path / "started"
    if db.startswith("postgresql://"):
        _open(db, redis, schema).setup()  # the schema exists before the child and we race on it
    child = subprocess.Popen([sys.executable, str(AGENT), db, redis, schema, tid, str(started)], env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parent.parent)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():  # the node is running (a file barrier)
            assert child.poll() is None, child.stderr.read()
            assert time.monotonic() < deadline, "the child's node never started"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGSTOP)  # it cannot poll between the two requests
        try:
            cp = _open(db, redis, schema)

            async def requests() -> None:
                await cp.arequest_stop({"thread_id": tid})
                with pytest.raises(ThreadBusyError):
                    await _noop_graph(cp).ainvoke({"messages": [Message.text_message("next turn")]},
                                                  {"thread_id": tid, "on_busy": "interrupt", "busy_timeout": 0.5})
                await cp.arelease()

            asyncio.run(requests())
        finally:
            os.kill(child.pid, signal.SIGCONT)
        # A hard stop is seen at the next poll (500 ms): the bound only keeps a regression from
        # hanging the suite.
        out, err = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("the user's stop did not end the hung node (the preemption replaced it)")
    assert child.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"status": "interrupted_after", "reason": "stop_requested", "stop": "stopped"}, result
