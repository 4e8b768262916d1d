"""Many runs at once on one SQLite file in one process: every write transaction (lease, step,
ledger) queues behind this process's other writers instead of racing them in SQLite's busy
handler, so none waits out the busy timeout ("database is locked")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer


async def answer(state: AgentState, config: dict[str, Any]) -> Message:
    await asyncio.sleep(0)
    return Message.text_message(f"seen {len(state.context)}", role="assistant")


@pytest.mark.asyncio
async def test_96_concurrent_threads_on_one_file_all_complete_every_turn(tmp_path: Path) -> None:
    g = StateGraph(AgentState())
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    cp = SqliteCheckpointer(tmp_path / "busy.db")
    app = g.compile(checkpointer=cp, live_states=0)  # every turn loads: more readers in the mix

    async def thread(i: int) -> None:
        for turn in range(3):
            out = await app.ainvoke({"messages": [Message.text_message(f"t{i} turn {turn}")]}, {"thread_id": f"c{i}"})
            assert out["messages"][-1].text() == f"seen {2 * turn + 1}"

    results = await asyncio.gather(*(thread(i) for i in range(96)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    for i in (0, 47, 95):
        state = await cp.aget_state({"thread_id": f"c{i}"})
        assert [m.text() for m in state.context][-1] == "seen 5" and len(state.context) == 6
    await cp.arelease()


_OPENER = """
import asyncio, sys, time
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer

async def answer(state, config):
    return Message.text_message("ok", role="assistant")

start_at, path, i = float(sys.argv[1]), sys.argv[2], sys.argv[3]
time.sleep(max(0.0, start_at - time.time()))  # every process opens the new file at once
g = StateGraph(AgentState())
g.add_node("answer", answer)
g.add_edge(START, "answer")
g.add_edge("answer", END)
app = g.compile(checkpointer=SqliteCheckpointer(path))
out = asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": f"p{i}"}))
print(out["messages"][-1].text())
"""


def test_processes_opening_a_new_file_at_once_all_get_in(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from tenxgraph.testing.crash import child_env

    path = tmp_path / "fresh.db"
    start_at = time.time() + 2.0  # after every interpreter has imported tenxgraph
    procs = [subprocess.Popen([sys.executable, "-c", _OPENER, str(start_at), str(path), str(i)], env=child_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(8)]
    results = [p.communicate(timeout=120) for p in procs]
    failed = [(p.returncode, err[-600:]) for p, (_, err) in zip(procs, results) if p.returncode != 0]
    assert not failed, failed
    assert [out.strip() for out, _ in results] == ["ok"] * 8


_ABANDONED = """
import asyncio, json, sqlite3, sys, time
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer

async def answer(state, config):
    return Message.text_message("ok", role="assistant")

path = sys.argv[1]
g = StateGraph(AgentState())
g.add_node("answer", answer)
g.add_edge(START, "answer")
g.add_edge("answer", END)
app = g.compile(checkpointer=SqliteCheckpointer(path))
asyncio.run(app.ainvoke({"messages": [Message.text_message("warm")]}, {"thread_id": "w"}))  # schema made

other = sqlite3.connect(path, isolation_level=None)
other.execute("BEGIN IMMEDIATE")  # another process's writer: run a's first commit waits for it
loop = asyncio.new_event_loop()
task = loop.create_task(app.ainvoke({"messages": [Message.text_message("to a", message_id="in-a")]},
                                    {"thread_id": "a"}))
loop.run_until_complete(asyncio.sleep(3.0))  # a reaches its input commit and waits there
task.cancel()  # and the loop never runs again: nobody polls run a
other.execute("ROLLBACK")
t0 = time.monotonic()
out = asyncio.run(app.ainvoke({"messages": [Message.text_message("to b")]}, {"thread_id": "b"}))
took = time.monotonic() - t0
stored = sqlite3.connect(path).execute("SELECT count(*) FROM messages WHERE thread_id = 'a' AND message_id = 'in-a'").fetchone()[0]
print(json.dumps({"took": took, "reply": out["messages"][-1].text(), "a_input_stored": stored}))
"""


def test_a_write_left_on_a_loop_that_never_runs_again_does_not_lock_the_file(tmp_path: Path) -> None:
    """Run a waits for the file's write lock in its first commit when its event loop stops for
    good (``run_until_complete`` returning after a cancel). The commit finishes without the loop
    (the input is stored), and a run on another loop writes at once instead of failing after
    the 10 s busy wait with "database is locked"."""
    import json
    import subprocess
    import sys

    from tenxgraph.testing.crash import child_env

    done = subprocess.run([sys.executable, "-c", _ABANDONED, str(tmp_path / "abandoned.db")], env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["reply"] == "ok"
    assert result["a_input_stored"] == 1
    assert result["took"] < 8.0, result  # the busy wait is 10 s; a turn takes milliseconds
