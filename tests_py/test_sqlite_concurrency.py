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
