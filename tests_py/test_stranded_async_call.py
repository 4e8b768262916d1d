"""An async tool call left on an event loop that no longer runs (a user's own loop, left after a
Ctrl-C or an early return), then the thread resumed in the same process (helper red-team,
session 32): the resume waited for that call, which could never end, until ``tool_timeout``
(300 s by default, past ``busy_timeout``), then told the model the call had timed out though it
never ran. Now a call whose loop is closed or not running is not waited for: the resume runs it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer


def _app(checkpointer: Any, fired: list[int], entered: list[int]) -> Any:
    async def slow(order_id: str, idempotency_key: str) -> str:
        """A slow call."""
        entered.append(1)
        await asyncio.sleep(1.0)
        fired.append(1)
        return "slow done"

    def model(state: AgentState) -> Message:
        if state.context[-1].role == "tool":
            return Message.text_message("all done", role="assistant")
        call = {"id": "c1", "type": "function", "function": {"name": "slow", "arguments": json.dumps({"order_id": "x"})}}
        return Message(role="assistant", content=[], tools_calls=[call])

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([slow]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END)
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("close_it", [False, True], ids=["left", "closed"])
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_resume_runs_a_call_stranded_on_a_dead_loop(tmp_path: Path, backend: str, close_it: bool) -> None:
    cp = InMemoryCheckpointer() if backend == "memory" else SqliteCheckpointer(str(tmp_path / "a.db"))
    fired: list[int] = []
    entered: list[int] = []
    app = _app(cp, fired, entered)
    cfg = {"thread_id": "stranded", "tool_timeout": 40}
    loop = asyncio.new_event_loop()
    try:
        loop.create_task(app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg)))

        async def in_the_tool() -> None:
            while not entered:
                await asyncio.sleep(0.01)

        loop.run_until_complete(asyncio.wait_for(in_the_tool(), 60))  # then the loop stops running
        if close_it:
            loop.close()
        started = time.monotonic()
        # The stranded run's lease runs out; the resume waits for that, not for the call.
        out = app.invoke({}, dict(cfg, on_busy="wait", busy_timeout=30))
        took = time.monotonic() - started
    finally:
        if not loop.is_closed():
            loop.close()
    assert out["messages"][-1].text() == "all done"
    assert fired == [1], "the resume ran the call (the stranded one never can)"
    assert took < 30, f"the resume waited {took:.1f} s for a call that could never end"
