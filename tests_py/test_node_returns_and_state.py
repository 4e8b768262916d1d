"""What a node may return, and how a thread's state is read, next to 10xGraph 0.10 (the oracle)."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import NodeError
from tenxgraph.utils import Command

# 10xGraph binds the first compiled graph's checkpointer process-wide (its DI container), so each
# script compiles exactly one graph.
PRELUDE = """
import asyncio
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END, START, Command
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

async def returns_none(state):
    return None

async def command_without_update(state):
    return Command(goto="after")

async def answer(state):
    return Message.text_message("after ran", role="assistant")

def build(first):
    g = StateGraph(AgentState)
    g.add_node("first", first)
    g.add_node("after", answer)
    g.add_edge(START, "first")
    g.add_edge("first", "after")
    g.add_edge("after", END)
    cp = InMemoryCheckpointer()
    return g.compile(checkpointer=cp), cp
"""

NONE_SCRIPT = PRELUDE + """
app, cp = build(returns_none)
try:
    app.invoke({"messages": [Message.text_message("hi")]}, config={"thread_id": "t1"})
    emit("accepted")
except Exception as exc:
    emit([type(exc).__name__, getattr(exc, "error_code", None)])
"""

COMMAND_SCRIPT = PRELUDE + """
app, cp = build(command_without_update)
res = app.invoke({"messages": [Message.text_message("hi")]}, config={"thread_id": "t2"})
emit([m.text() for m in res["messages"]])
"""

STATE_SCRIPT = PRELUDE + """
app, cp = build(answer)
app.invoke({"messages": [Message.text_message("hi")]}, config={"thread_id": "t3"})
# A thread's state is read from the checkpointer; CompiledGraph has no get_state in 10xGraph.
state = cp.get_state({"thread_id": "t3"})
astate = asyncio.run(cp.aget_state({"thread_id": "t3"}))
emit({"state": [type(state).__name__, [m.text() for m in state.context], state.execution_meta.status.value],
      "astate": astate.execution_meta.status.value,
      "graph_has_get_state": [hasattr(app, "get_state"), hasattr(app, "aget_state")]})
"""


def test_a_node_returning_none_is_refused_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(NONE_SCRIPT)
    assert theirs == ["NodeError", "NODE_001"]
    assert ours == theirs


def test_command_without_update_routes_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(COMMAND_SCRIPT)
    assert theirs == ["hi", "after ran"]
    assert ours == theirs


def test_a_threads_state_is_read_from_the_checkpointer_as_in_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(STATE_SCRIPT)
    assert theirs["state"] == ["AgentState", ["hi", "after ran", "after ran"], "completed"]
    assert ours == theirs, (theirs, ours)


@pytest.mark.asyncio
async def test_a_node_returning_none_is_a_node_error_and_writes_nothing(checkpointer, make_thread) -> None:
    async def forgot_return(state: AgentState) -> Any:
        Message.text_message("built, never returned", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", forgot_return)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread("nonenode")
    cfg = {"thread_id": tid}
    with pytest.raises(NodeError) as exc:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, cfg)
    assert exc.value.error_code == "NODE_001"
    assert "the node returned None" in str(exc.value)
    state = await checkpointer.aget_state(cfg)
    # The input is committed before the node by design; the node added nothing.
    assert [(m.role, m.text()) for m in state.context] == [("user", "hi")]
    assert state.execution_meta.status.value == "error"


@pytest.mark.asyncio
async def test_command_without_update_still_routes(checkpointer, make_thread) -> None:
    async def jump(state: AgentState) -> Command:
        return Command(goto="after")

    async def after(state: AgentState) -> Message:
        return Message.text_message("after ran", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("first", jump)
    g.add_node("after", after)
    g.add_edge(START, "first")
    g.add_edge("first", "after")
    g.add_edge("after", END)
    app = g.compile(checkpointer=checkpointer)
    out = await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": make_thread("cmd")})
    assert [m.text() for m in out["messages"]] == ["hi", "after ran"]
