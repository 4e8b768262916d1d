"""Handoff tools (tenxgraph.prebuilt.tools): a call to ``transfer_to_<agent>`` routes the run to
that node, answered and recorded through the tool ledger like any call.

Differences from 10xGraph 0.10.0, pinned here: its invoke path drops the handoff (the tool
node's Command is ignored and the graph follows its edges, here until GraphRecursionError); its
stream path routes but leaves the call unanswered (no tool message), and runs none of the other
calls of that message. tenxgraph routes on both paths, answers the call with a tool result
("Handoff to <agent>") and runs the message's other calls.
"""

from __future__ import annotations

import pytest

from tenxgraph.prebuilt.tools import create_handoff_tool, is_handoff_tool
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.testing import CrashKit
from tenxgraph.core.graph import ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.core.graph import StateGraph
from tenxgraph.utils import END
from tests_py.kit_agents.handoff import build

SCRIPT = r"""
import os
from tenxgraph.core.graph import StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.prebuilt.tools import create_handoff_tool, is_handoff_tool

to_researcher = create_handoff_tool("researcher", description="Send to research")
ran = []

def coordinator(state):
    ran.append("coordinator")
    return [Message(role="assistant", content=[], tools_calls=[
        {"id": "h1", "type": "function", "function": {"name": "transfer_to_researcher", "arguments": "{}"}}])]

def researcher(state):
    ran.append("researcher")
    return [Message.text_message("research done", role="assistant")]

g = StateGraph(AgentState)
g.add_node("coordinator", coordinator); g.add_node("tools", ToolNode([to_researcher])); g.add_node("researcher", researcher)
g.set_entry_point("coordinator"); g.add_edge("coordinator", "tools"); g.add_edge("tools", "coordinator")
g.add_edge("researcher", END)
app = g.compile(checkpointer=InMemoryCheckpointer())
cfg = {"thread_id": "t", "recursion_limit": 6}
out = {"tool": {"name": to_researcher.__name__, "doc": to_researcher.__doc__,
                "schema": ToolNode([to_researcher]).get_local_tool(),
                "is": [is_handoff_tool("transfer_to_researcher"), is_handoff_tool("transfer_to_"), is_handoff_tool("calc")]}}
if os.environ["PATH_KIND"] == "stream":
    chunks = list(app.stream({"messages": [Message.text_message("hi")]}, config=cfg))
    msgs = [c.message for c in chunks if c.message is not None]
else:
    try:
        msgs = app.invoke({"messages": [Message.text_message("hi")]}, config=cfg)["messages"]
    except Exception as exc:
        msgs = []
        out["raised"] = type(exc).__name__
out["ran"] = ran
out["messages"] = [(m.role, m.text()) for m in msgs]
emit(out)
"""


def test_handoff_on_the_stream_path_matches_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(SCRIPT, env={"PATH_KIND": "stream"})
    assert ours["tool"] == theirs["tool"]
    assert ours["ran"] == theirs["ran"] == ["coordinator", "researcher"]
    assistant = [m for m in ours["messages"] if m[0] != "tool"]
    assert assistant == theirs["messages"]
    # The one difference: the handoff call is answered (providers reject an unanswered call).
    assert [m for m in ours["messages"] if m[0] == "tool"] == [["tool", "Handoff to researcher"]]
    assert not [m for m in theirs["messages"] if m[0] == "tool"]


def test_handoff_on_invoke_routes_where_10xgraph_loops(oracle) -> None:
    theirs, ours = oracle.run_both(SCRIPT, env={"PATH_KIND": "invoke"})
    assert theirs.get("raised") == "GraphRecursionError"  # 10xGraph 0.10's invoke ignores the handoff
    assert "raised" not in ours
    assert ours["ran"] == ["coordinator", "researcher"]
    assert ours["messages"][-1] == ["assistant", "research done"]


def test_handoff_tool_shape() -> None:
    tool = create_handoff_tool("billing")
    assert tool.__name__ == "transfer_to_billing" and tool.__doc__ == "Transfer control to billing agent"
    assert tool.__handoff_tool__ is True and tool.__target_agent__ == "billing"
    assert ToolNode([tool]).get_local_tool()[0]["function"]["parameters"] == {"type": "object", "properties": {}}
    direct = tool()  # called outside a graph, as 10xGraph's: a tool message with a TextBlock
    assert direct.role == "tool" and isinstance(direct.content[0], TextBlock) and direct.text() == "Handoff to billing"
    assert is_handoff_tool("transfer_to_billing") == (True, "billing")
    assert is_handoff_tool("transfer_to_") == (False, None)
    with pytest.raises(ValueError, match="cannot be empty"):
        create_handoff_tool("")
    with pytest.raises(TypeError, match="must be str"):
        create_handoff_tool(3)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_the_handoff_is_recorded_in_the_ledger(checkpointer, make_thread, effects) -> None:
    app = build(checkpointer)
    cfg = {"thread_id": make_thread()}
    out = await app.ainvoke({"messages": [Message.text_message("otters?")]}, cfg)
    assert out["messages"][-1].text() == "researched: notes on otters; Handoff to researcher"
    state = await checkpointer.aget_state(cfg)
    issuing = next(m for m in state.context if m.tools_calls)
    record = await checkpointer.aget_tool_result({**cfg, "user_id": "anonymous"}, f"{issuing.message_id}:h1")
    assert record is not None and record["value"]["content"][0]["output"] == "Handoff to researcher"
    effects.assert_exactly_once("lookup")


def test_a_crashed_handoff_node_resumes_to_the_agent(crash_kit: CrashKit) -> None:
    target = "tests_py.kit_agents.handoff:build"
    crashed = crash_kit.run_until_crash(target, "h-1", failpoints="after_record:lookup=kill", input="otters?")
    assert crashed.killed, crashed
    done = crash_kit.resume(target, "h-1")
    assert done.status == "completed" and done.last == "researched: notes on otters; Handoff to researcher", done
    crash_kit.effects.assert_exactly_once("lookup")  # answered from the ledger on resume


@pytest.mark.asyncio
async def test_a_tool_of_your_own_named_transfer_to_runs_as_itself() -> None:
    moved = []

    def transfer_to_savings(amount: int) -> str:
        """Move money to savings."""
        moved.append(amount)
        return f"moved {amount}"

    def model(state: AgentState) -> list[Message]:
        if state.context[-1].role == "tool":
            return [Message.text_message("ok: " + state.context[-1].text(), role="assistant")]
        return [Message(role="assistant", content=[], tools_calls=[{"id": "t1", "type": "function", "function": {
            "name": "transfer_to_savings", "arguments": '{"amount": 5}'}}])]

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([transfer_to_savings]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    out = await g.compile(checkpointer=InMemoryCheckpointer()).ainvoke(
        {"messages": [Message.text_message("save 5")]}, {"thread_id": "own"})
    assert moved == [5] and out["messages"][-1].text() == "ok: moved 5"
