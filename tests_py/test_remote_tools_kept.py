"""A turn's per-run remote tools (``config["remote_tools"]``) are kept with the thread, so a run
that continues the turn without them still hands the client its call (red-team, session 36).

Before, a resume without them (``arecover()`` after a SIGKILL, a plain ``ainvoke({})`` after a
failure) took the client's call for a server tool it lacked: the model was told "Tool
'read_clipboard' not found" and the turn ended without the client ever being asked.
"""

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

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core.graph import ToolNode
from tenxgraph.storage.checkpointer import SqliteCheckpointer

PER_RUN = [{"name": "read_clipboard", "description": "Read the clipboard",
            "parameters": {"type": "object", "properties": {"fmt": {"type": "string"}}}}]

GRAPH = textwrap.dedent('''
    import json, os, signal
    from tenxgraph import END, AgentState, Message, StateGraph
    from tenxgraph.core.graph import ToolNode

    def add(a: int, b: int) -> int:
        """Adds."""
        if os.environ.get("KILL_IN_TOOL") and not os.path.exists(os.environ["KILL_IN_TOOL"]):
            open(os.environ["KILL_IN_TOOL"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return a + b

    def model(state):
        if state.context[-1].role == "tool":
            return Message.text_message("done", role="assistant")
        calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}},
                 {"id": "c2", "type": "function", "function": {"name": "read_clipboard", "arguments": "{}"}}]
        return Message(role="assistant", content=[], tools_calls=calls)

    def route(state):
        return "tools" if state.context[-1].tools_calls else END

    def build(cp):
        g = StateGraph(AgentState)
        g.add_node("model", model)
        g.add_node("tools", ToolNode([add]))
        g.set_entry_point("model")
        g.add_conditional_edges("model", route, {"tools": "tools", END: END})
        g.add_edge("tools", "model")
        return g.compile(checkpointer=cp)
''')


def _assert_client_was_asked(state: Any) -> None:
    meta = state.execution_meta
    assert (str(meta.status), meta.interrupt_reason) == ("interrupted_after", "remote_tool_call"), meta
    tool_texts = [m.text() for m in state.context if m.role == "tool"]
    assert tool_texts == ["3"], tool_texts  # the server's own tool only; nothing said "not found"


@pytest.mark.asyncio
async def test_recovery_after_a_kill_hands_the_client_its_call(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(GRAPH)
    db, flag = tmp_path / "cp.db", tmp_path / "killed"
    child = textwrap.dedent(f'''
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        from agent import build
        from tenxgraph import Message
        from tenxgraph.storage.checkpointer import SqliteCheckpointer
        build(SqliteCheckpointer({str(db)!r})).invoke({{"messages": [Message.text_message("hi")]}},
            {{"thread_id": "t1", "remote_tools": {PER_RUN!r}}})
    ''')
    done = subprocess.run([sys.executable, "-c", child], env={**os.environ, "KILL_IN_TOOL": str(flag)}, timeout=120)
    assert done.returncode == -signal.SIGKILL and flag.exists()
    sys.path.insert(0, str(tmp_path))
    try:
        from agent import build  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("agent", None)
    cp = SqliteCheckpointer(db)
    app = build(cp)
    report = await app.arecover()  # the dead holder is this machine's: taken over at once
    assert [r.thread_id for r in report.resumed] == ["t1"], report
    _assert_client_was_asked(await cp.aget_state({"thread_id": "t1"}))
    await cp.arelease()


@pytest.mark.asyncio
async def test_a_retry_without_them_after_a_failure_hands_the_client_its_call(tmp_path: Path) -> None:
    failing = True

    def add(a: int, b: int) -> int:
        """Adds."""
        return a + b

    def model(state: AgentState) -> Message:
        if state.context[-1].role == "tool":
            return Message.text_message("done", role="assistant")
        calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}},
                 {"id": "c2", "type": "function", "function": {"name": "read_clipboard", "arguments": "{}"}}]
        return Message(role="assistant", content=[], tools_calls=calls)

    async def gate(state: AgentState) -> AgentState:  # fails once, after the model's calls
        if failing:
            raise RuntimeError("gate down")
        return state

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("gate", gate)
    g.add_node("tools", ToolNode([add]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", lambda s: "gate" if s.context[-1].tools_calls else END, {"gate": "gate", END: END})
    g.add_edge("gate", "tools")
    g.add_edge("tools", "model")
    cp = SqliteCheckpointer(tmp_path / "cp.db")
    app = g.compile(checkpointer=cp)
    with pytest.raises(Exception, match="gate down"):
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t2", "remote_tools": PER_RUN})
    failing = False
    await asyncio.wait_for(app.ainvoke({}, {"thread_id": "t2"}), 60)
    _assert_client_was_asked(await cp.aget_state({"thread_id": "t2"}))
    # Kept with the thread as sent (the model node of a resumed turn lists them too).
    state = await cp.aget_state({"thread_id": "t2"})
    assert state.execution_meta.internal_data.get("remote_tools") == PER_RUN
    await cp.arelease()
