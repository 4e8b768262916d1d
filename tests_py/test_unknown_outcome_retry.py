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
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.interrupt import pending_interrupt
from tenxgraph.utils.tool_decorator import tool

AGENT = textwrap.dedent('''
    import asyncio, json, os, sys
    from tenxgraph import END, START, AgentState, Message, StateGraph
    from tenxgraph.core.graph.tool_node import ToolNode
    from tenxgraph.storage.checkpointer import SqliteCheckpointer
    from tenxgraph.utils.interrupt import pending_interrupt
    from tenxgraph.utils.tool_decorator import tool

    EFFECTS = os.environ["EFFECTS"]

    @tool(side_effects="at_most_once", on_unknown="interrupt")
    async def wire(amount: int, idempotency_key: str) -> str:
        """Wire money (at most once)."""
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, b"wire\\n"); os.fsync(fd); os.close(fd)
        return "wired"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            m = Message.text_message("wiring", role="assistant")
            m.tools_calls = [{"id": "call_1", "type": "function",
                              "function": {"name": "wire", "arguments": '{"amount": 100}'}}]
            return m
        return Message.text_message("DONE", role="assistant")

    async def main(db, payload, failpoints):
        g = StateGraph(AgentState)
        g.add_node("model", model)
        g.add_node("tools", ToolNode([wire]))
        g.add_edge(START, "model")
        g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                                {"tools": "tools", END: END})
        g.add_edge("tools", "model")
        app = g.compile(checkpointer=SqliteCheckpointer(db))
        cfg = {"thread_id": "t"}
        if failpoints:
            cfg["failpoints"] = failpoints
        r = await app.ainvoke(json.loads(payload), cfg, response_granularity="full")
        p = pending_interrupt(r["state"])
        print(json.dumps({"status": str(r["state"].execution_meta.status.value), "pending": p.reason if p else None,
                          "key": p.key if p else None, "last": r["state"].context[-1].text()}))

    asyncio.run(main(*sys.argv[1:4]))
''')


class Agent:
    def __init__(self, tmp_path: Path) -> None:
        self.script = tmp_path / "wire_agent.py"
        self.script.write_text(AGENT)
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

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            m = Message.text_message("wiring", role="assistant")
            m.tools_calls = [{"id": "call_1", "type": "function",
                              "function": {"name": "wire", "arguments": '{"amount": 100}'}}]
            return m
        return Message.text_message("DONE", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([wire]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=SqliteCheckpointer(tmp_path / "t.db"))
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
