"""A human's "retry" for an at-most-once call whose outcome is unknown is spent once (helper
red-team of side-effect classes, session 33). The answer stays with the thread until the tool
node finishes, and a retried call cut off again (SIGKILL in the same window, or node_timeout)
found the same "retry" on the next replay and ran again, silently, once per crash: one human
"retry" led to four wires. Now the ledger row counts the retries spent, and the next unknown
outcome of the call is a new question."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.interrupt import pending_interrupt
from tenxgraph.utils.tool_decorator import tool

from tests_py.crash_agents.wire_agent import wire_graph

class Agent:
    def __init__(self, tmp_path: Path) -> None:
        self.script = Path(__file__).parent / "crash_agents" / "wire_agent.py"
        self.db = str(tmp_path / "wire.db")
        self.effects = tmp_path / "effects"

    def wires(self) -> int:
        return len(self.effects.read_text().splitlines()) if self.effects.exists() else 0

    def run(self, payload: Any, failpoints: str = "") -> Any:
        p = subprocess.run([sys.executable, str(self.script), self.db, json.dumps(payload), failpoints],
                           env=dict(os.environ, EFFECTS=str(self.effects)), capture_output=True, text=True,
                           timeout=120)
        if p.returncode == -signal.SIGKILL:
            return "killed"
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_retry_killed_again_is_a_new_question_not_a_second_retry(tmp_path: Path) -> None:
    agent = Agent(tmp_path)
    new = {"messages": [{"role": "user", "content": [{"type": "text", "text": "wire 100"}]}]}
    assert agent.run(new, "after_tool:wire=kill") == "killed"
    first = agent.run({})
    assert first["pending"] == "tool_outcome_unknown"
    assert agent.run({"resume": "retry"}, "after_tool:wire=kill") == "killed"
    assert agent.wires() == 2
    # The retried call's outcome is unknown again: at most once, so a human is asked again.
    second = agent.run({})
    assert agent.wires() == 2, "the stored 'retry' ran the wire again without asking"
    assert second["pending"] == "tool_outcome_unknown" and second["key"] != first["key"]
    # The human's answer to the new question counts: a result is recorded, nothing runs.
    done = agent.run({"resume": {"result": "wired, ref 42"}})
    assert done["status"] == "completed" and done["last"] == "DONE" and agent.wires() == 2


@pytest.mark.asyncio
async def test_a_retry_cut_off_by_node_timeout_is_not_run_again_by_the_next_attempt(tmp_path: Path) -> None:
    wires: list[int] = []
    slow = asyncio.Event()

    @tool(side_effects="at_most_once", on_unknown="interrupt")
    async def wire(amount: int, idempotency_key: str) -> str:
        """Wire money (at most once)."""
        wires.append(amount)
        if slow.is_set():
            await asyncio.sleep(60)  # the bank is slow to answer; the wire went out
        return "wired"

    app = wire_graph(SqliteCheckpointer(tmp_path / "t.db"), wire)
    cfg: dict[str, Any] = {"thread_id": "t"}
    with pytest.raises(Exception):  # the wire went out, its record did not: "started" stays
        await app.ainvoke({"messages": [Message.text_message("wire 100")]},
                          dict(cfg, failpoints="after_tool:wire=raise"))
    r = await app.ainvoke({}, cfg, response_granularity="full")
    assert pending_interrupt(r["state"]).reason == "tool_outcome_unknown"
    slow.set()
    with pytest.raises(Exception):
        await app.ainvoke({"resume": "retry"}, dict(cfg, node_timeout=1))
    slow.clear()
    assert len(wires) == 2
    r = await app.ainvoke({}, cfg, response_granularity="full")
    assert len(wires) == 2, "the spent 'retry' ran the wire a third time"
    assert pending_interrupt(r["state"]).reason == "tool_outcome_unknown"
    # A new "retry" is a new human decision: it runs once.
    r = await app.ainvoke({"resume": "retry"}, cfg, response_granularity="full")
    assert len(wires) == 3 and r["state"].execution_meta.status.value == "completed"


@pytest.mark.asyncio
async def test_a_retry_cancelled_before_its_call_started_stays_spent(tmp_path: Path) -> None:
    """The retry is spent (the row counts it), then the caller cancels before the call starts:
    the cancelled run marks the call not started, and that mark dropped the count, so after the
    next crash the stored "retry" was found again and the wire ran a third time, unasked."""
    from tenxgraph import metrics

    wires: list[int] = []

    @tool(side_effects="at_most_once", on_unknown="interrupt")
    async def wire(amount: int, idempotency_key: str) -> str:
        """Wire money (at most once)."""
        wires.append(amount)
        return "wired"

    app = wire_graph(SqliteCheckpointer(tmp_path / "t.db"), wire)
    cfg: dict[str, Any] = {"thread_id": "t"}
    with pytest.raises(Exception):
        await app.ainvoke({"messages": [Message.text_message("wire 100")]},
                          dict(cfg, failpoints="after_tool:wire=raise"))
    r = await app.ainvoke({}, cfg, response_granularity="full")
    assert pending_interrupt(r["state"]).reason == "tool_outcome_unknown"
    asked = metrics.snapshot()["tenxgraph.tool.outcome_unknown"]
    retry = asyncio.ensure_future(app.ainvoke({"resume": "retry"}, dict(cfg, failpoints="before_tool:wire=delay(10000)")))
    while metrics.snapshot()["tenxgraph.tool.outcome_unknown"] == asked and not retry.done():
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)  # the retry's mark commits in milliseconds; the call waits 10 s to start
    retry.cancel()
    await asyncio.gather(retry, return_exceptions=True)
    assert wires == [100]
    with pytest.raises(Exception):  # the resume runs the call: the wire goes out, and the run fails
        await app.ainvoke({}, dict(cfg, failpoints="after_tool:wire=raise"))
    assert wires == [100, 100]
    r = await app.ainvoke({}, cfg, response_granularity="full")
    assert wires == [100, 100], "the spent 'retry' ran the wire a third time"
    assert pending_interrupt(r["state"]).reason == "tool_outcome_unknown"
