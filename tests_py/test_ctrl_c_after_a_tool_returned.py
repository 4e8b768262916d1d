"""Ctrl-C as a plain ``KeyboardInterrupt`` (Python's default SIGINT handler: a loop that is not
``asyncio.run``'s, or a second Ctrl-C) landing just after a tool returned, while its value was
turned into its message. Red-team of session 24: the retry ``invoke({})`` ran the returned tool
again in 12 of 12 rounds; the result of a call cut off after its return was kept only for a
``CancelledError`` in an ``after_invoke`` callback. Each round runs in a child process (the
signal is the child's own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tenxgraph.testing.crash import child_env

_CHILD = """
import json, os, signal, sys, threading, time
sys.path.insert(0, sys.argv[3])
from tenxgraph import AgentState, Message
from tests_py.crash_agents.lease_agent import open_db
from tests_py.tool_graphs import call, tool_graph, tool_texts

db, delays = sys.argv[1], [float(d) for d in sys.argv[2].split(",")]
runs = {}
returned = threading.Event()


def raise_interrupt(signum, frame):
    raise KeyboardInterrupt


async def pay(idempotency_key: str, config: dict) -> list:
    big = [{"i": i, "v": str(i)} for i in range(200_000)]  # turned into its message for a while
    runs[config["thread_id"]] = runs.get(config["thread_id"], 0) + 1
    returned.set()
    return big


app = tool_graph(AgentState, [pay], [[call("c1", "pay")]], checkpointer=open_db(db))
rounds = []
for n, delay in enumerate(delays):
    thread = f"ctrl-c-{os.getpid()}-{n}"
    returned.clear()
    signal.signal(signal.SIGINT, raise_interrupt)

    def fire():
        if returned.wait(60):
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGINT)

    killer = threading.Thread(target=fire)
    killer.start()
    try:
        app.invoke({"messages": [Message.text_message("pay")]}, {"thread_id": thread})
        first = "finished"
    except KeyboardInterrupt:
        first = "interrupted"
    killer.join()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    done = app.invoke({}, {"thread_id": thread})
    answer = tool_texts(done["messages"]).get("c1")
    rounds.append({"first": first, "runs": runs[thread], "answered": isinstance(answer, list) and len(answer) == 200_000})
print(json.dumps(rounds))
"""


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return sqlite_db if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


def test_a_tool_that_returned_before_a_ctrl_c_is_not_run_again(db: str) -> None:
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", _CHILD, db, "0.005,0.015,0.03,0.06", root], env=child_env(),
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rounds: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any(r["first"] == "interrupted" for r in rounds), rounds  # the Ctrl-C landed in the run
    assert all(r["runs"] == 1 and r["answered"] for r in rounds), rounds
