"""A PostgreSQL store call whose event loop stops for good (``run_until_complete`` returning while
the call waits, the loop never run again) runs to its end as a task on the runtime: the store's
first open (connect, migrate under the schema's lock) and ``aprune`` (transactions holding row
locks and a pooled connection). In the caller's future they froze with the loop: the open held
the store's initialisation, so every later call of the process waited for ever; the prune kept
its connection, so a checkpointer with a pool of one could not run anything again."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from tenxgraph.testing.crash import child_env
from tenxgraph.testing.postgres_server import find_pg_binary

pytestmark = pytest.mark.timeout(180)

_CHILD = """
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[4])
from frozen_child import MIGRATION_LOCK_KEY, lock_holder
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import PgCheckpointer

case, dsn, schema, tests_dir, psql = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
cp = PgCheckpointer(dsn, schema=schema, pool_config={"max_size": 1}, enforce_user_isolation=False)

async def answer(state, config):
    return Message.text_message("ok", role="assistant")

if case == "open":
    # Another process migrating holds the schema's lock: this store's open waits for it.
    holder = lock_holder([psql, "-X", "-Atq", "-v", "ON_ERROR_STOP=1"], dsn, "rt_abandon_open", f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
    call = cp.asetup()
else:
    g = StateGraph(AgentState())
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    app = g.compile(checkpointer=cp)
    asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "kept"}))
    # Another session holds the threads table: the prune's first batch waits for it, in its
    # transaction, on the pool's one connection.
    holder = lock_holder([psql, "-X", "-Atq", "-v", "ON_ERROR_STOP=1"], dsn, "rt_abandon_prune", f'LOCK TABLE "{schema}".threads IN ACCESS EXCLUSIVE MODE')
    call = cp.aprune(finished_older_than=0.0)

loop = asyncio.new_event_loop()
task = loop.create_task(call)
loop.run_until_complete(asyncio.sleep(1.0))  # the call reaches its wait (or not: frozen either way)
task.cancel()  # requested only: the loop never runs again, nobody polls the call
holder.kill()  # the lock holder's session ends: its lock is released
holder.wait()
t0 = time.monotonic()
try:
    state = asyncio.run(asyncio.wait_for(cp.aget_state({"thread_id": "kept"}), 25))
    out = {"ok": True, "messages": None if state is None else len(state.context)}
except BaseException as exc:
    out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
out["took"] = time.monotonic() - t0
print(json.dumps(out))
"""


@pytest.mark.parametrize("case", ["open", "prune"])
def test_a_call_left_on_a_loop_that_never_runs_again_does_not_stop_the_store(tenx_postgres, case: str) -> None:
    import os

    schema = f"t_{uuid.uuid4().hex[:12]}"
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", _CHILD, case, tenx_postgres.dsn, schema, tests_dir,
                           find_pg_binary("psql")], env=child_env(), capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    # "kept" was never written in the open case; in the prune case it is the thread just run
    # (a finished thread older than 0 s: the prune may have deleted it by now, or not yet).
    assert result["messages"] in (None, 2), result
