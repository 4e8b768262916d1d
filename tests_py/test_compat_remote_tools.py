"""Client-run (remote) tools: the run pauses after the tool node and resumes with the client's
results, as on 10xGraph 0.10.0, and the pause is a committed state that survives the process."""

from __future__ import annotations

import pytest

from tenxgraph.core.exceptions import GraphError
from tenxgraph.core.graph import RemoteToolConfig, StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import ToolResultBlock
from tenxgraph.testing import CrashKit
from tenxgraph.utils import END
from tests_py.kit_agents.remote import CLIPBOARD, build

PER_RUN = [{"name": "read_clipboard", "description": "Read the client's clipboard",
            "parameters": {"type": "object", "properties": {"fmt": {"type": "string"}}}}]

SCRIPT = r"""
import json, os
from tenxgraph.core.graph import StateGraph, ToolNode, RemoteToolConfig
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import ToolResultBlock
from tenxgraph.utils import END
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

def add(a: int, b: int) -> int:
    '''add'''
    return a + b

def model(state):
    if state.context[-1].role == "tool":
        outs = [str(b.output) for m in state.context if m.role == "tool" for b in m.content if hasattr(b, "output")]
        return [Message.text_message("done: " + " | ".join(outs), role="assistant")]
    return [Message(role="assistant", content=[], tools_calls=[
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}},
        {"id": "c2", "type": "function", "function": {"name": "read_clipboard", "arguments": json.dumps({"fmt": "txt"})}}])]

def route(state):
    return "tools" if state.context[-1].tools_calls else END

g = StateGraph(AgentState)
g.add_node("model", model); g.add_node("tools", ToolNode([add]))
g.set_entry_point("model")
g.add_conditional_edges("model", route, {"tools": "tools", END: END}); g.add_edge("tools", "model")
cp = InMemoryCheckpointer()
app = g.compile(checkpointer=cp)
cfg = {"thread_id": "t1"}
if os.environ["MODE"] == "attach":
    app.attach_remote_tools([RemoteToolConfig(node="tools", name="read_clipboard", description="Read clipboard",
                                              parameters={"type": "object", "properties": {"fmt": {"type": "string"}}})])
else:
    cfg["remote_tools"] = [{"name": "read_clipboard", "description": "Read clipboard",
                            "parameters": {"type": "object", "properties": {"fmt": {"type": "string"}}}}]
advertised = [t["function"]["name"] for t in g.nodes["tools"].func.all_tools_sync(config=cfg)]

def show(ms):
    return [{"role": m.role, "content": m.model_dump(mode="json")["content"], "metadata": m.metadata} for m in ms]

def meta():
    st = cp.get_state({"thread_id": "t1", "user_id": "anonymous"})
    em = st.execution_meta
    return {"status": str(em.status.value), "current_node": em.current_node, "interrupted_node": em.interrupted_node,
            "interrupt_reason": em.interrupt_reason, "roles": [m.role for m in st.context]}

paused = app.invoke({"messages": [Message.text_message("hi")]}, config=cfg)
at_pause = meta()
answer = Message.tool_message([ToolResultBlock(call_id="c2", output="CLIP", status="completed")])
resumed = app.invoke({"messages": [answer]}, config=cfg)
after = meta()
emit({"advertised": advertised, "paused": show(paused["messages"]), "at_pause": at_pause,
      "resumed": [(m["role"], m["content"]) for m in show(resumed["messages"])],
      "after": {"status": after["status"], "roles": after["roles"]}})
"""


@pytest.mark.parametrize("mode", ["attach", "per_run"])
def test_pause_and_resume_as_10xgraph(oracle, mode: str) -> None:
    theirs, ours = oracle.run_both(SCRIPT, env={"MODE": mode})
    assert ours == theirs
    assert ours["at_pause"] == {"status": "interrupted_after", "current_node": "tools", "interrupted_node": "tools",
                                "interrupt_reason": "remote_tool_call", "roles": ["user", "assistant", "tool"]}
    assert ours["paused"][-1]["content"] == [{"type": "remote_tool_call", "id": "c2", "name": "read_clipboard",
                                              "args": {"fmt": "txt"}, "tool_type": "remote"}]
    assert ours["resumed"][-1] == ["assistant", [{"type": "text", "text": "done: 3 | CLIP", "annotations": []}]]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return sqlite_db if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


@pytest.mark.parametrize("target,config", [("tests_py.kit_agents.remote:build", None),
                                           ("tests_py.kit_agents.remote:build_per_run", {"remote_tools": PER_RUN})])
def test_the_pause_survives_the_process(crash_kit: CrashKit, db: str, target: str, config) -> None:
    # One process runs until the pause and exits; a fresh one takes the client's result.
    paused = crash_kit.resume(target, "r-1", db=db, input="hi", config=config)
    assert paused.status == "interrupted_after", paused
    assert paused.message_dicts[-1]["content"][0]["type"] == "remote_tool_call"
    assert paused.message_dicts[-2]["content"][0]["output"] == "3"
    answer = Message.tool_message([ToolResultBlock(call_id="c2", output="CLIP", status="completed")])
    done = crash_kit.resume(target, "r-1", db=db, input={"messages": [answer.model_dump(mode="json")]}, config=config)
    assert done.status == "completed" and done.last == "done: 3 | CLIP", done
    crash_kit.effects.assert_exactly_once("add")  # the local call is not run again on resume


def test_attach_remote_tools_checks_everything_first() -> None:
    g = StateGraph(AgentState)
    g.add_node("plain", lambda state: [Message.text_message("x", role="assistant")])
    g.add_node("tools", ToolNode([]))
    g.set_entry_point("plain")
    g.add_edge("plain", "tools")
    g.add_edge("tools", END)
    app = g.compile()
    with pytest.raises(GraphError) as missing:
        app.attach_remote_tools([{"node": "nope", "name": "x", "description": "d"}])
    assert missing.value.error_code == "GRAPH_004"
    with pytest.raises(GraphError) as not_tools:
        app.attach_remote_tools([{"type": "function", "function": {"name": "x"}}], "plain")
    assert not_tools.value.error_code == "GRAPH_005"
    with pytest.raises(ValueError, match="Duplicate remote tool name"):
        app.attach_remote_tools([CLIPBOARD, CLIPBOARD])
    with pytest.raises(ValueError, match="targets node 'tools', not 'other'"):
        app.attach_remote_tools([CLIPBOARD], "other")
    with pytest.raises(ValueError):
        RemoteToolConfig.model_validate({"node": "tools", "name": "x", "description": "d", "typo": 1})
    with pytest.raises(ValueError, match="must be 'object'"):
        RemoteToolConfig(node="tools", name="x", description="d", parameters={"type": "array"})
    with pytest.raises(ValueError, match="must not be blank"):
        RemoteToolConfig(node="tools", name="  ", description="d")
    # A bad entry anywhere in the list attaches nothing.
    with pytest.raises(ValueError):
        app.attach_remote_tools([CLIPBOARD, {"node": "tools", "name": "y", "description": ""}])
    assert g.nodes["tools"].func.remote_tool_names == []
    app.attach_remote_tools([CLIPBOARD])
    assert g.nodes["tools"].func.remote_tool_names == ["read_clipboard"]
    assert [t["function"]["name"] for t in g.nodes["tools"].func.all_tools_sync()] == ["read_clipboard"]
    # As in 10xGraph, attaching again sets the node's client tools anew.
    app.attach_remote_tools([{"type": "function", "function": {"name": "pick_file", "description": "Pick"}}], "tools")
    assert g.nodes["tools"].func.remote_tool_names == ["pick_file"]


@pytest.mark.asyncio
async def test_resume_routes_past_the_paused_node_on_every_backend(checkpointer, make_thread) -> None:
    app = build(checkpointer)
    cfg = {"thread_id": make_thread()}
    paused = await app.ainvoke({"messages": [Message.text_message("hi")]}, cfg)
    assert paused["messages"][-1].metadata == {"is_remote": True}
    state = await checkpointer.aget_state(cfg)
    assert [m.role for m in state.context] == ["user", "assistant", "tool"]  # no placeholder stored
    answer = Message.tool_message([ToolResultBlock(call_id="c2", output="CLIP", status="completed")])
    done = await app.ainvoke({"messages": [answer]}, cfg)
    assert done["messages"][-1].text() == "done: 3 | CLIP"
    state = await checkpointer.aget_state(cfg)
    assert [m.role for m in state.context] == ["user", "assistant", "tool", "tool", "assistant"]


@pytest.mark.asyncio
async def test_a_streamed_run_pauses_and_resumes_the_same_way(checkpointer, make_thread) -> None:
    from tenxgraph.core.state import StreamEvent

    app = build(checkpointer)
    cfg = {"thread_id": make_thread()}
    chunks = [c async for c in app.astream({"messages": [Message.text_message("hi")]}, cfg,
                                           response_granularity="full")]
    shown = [c.message for c in chunks if c.event == StreamEvent.MESSAGE and c.message is not None]
    assert any(b.type == "remote_tool_call" for m in shown for b in m.content)
    paused = [c.data for c in chunks if c.event == StreamEvent.UPDATES and c.data.get("status") == "interrupted"]
    assert paused == [{"status": "interrupted", "reason": "Remote tool call - graph interrupted",  # 10xGraph's text
                       "interrupt_reason": "remote_tool_call", "node": "tools"}]
    state = await checkpointer.aget_state(cfg)
    assert state.execution_meta.interrupt_reason == "remote_tool_call"
    assert [m.role for m in state.context] == ["user", "assistant", "tool"]
    answer = Message.tool_message([ToolResultBlock(call_id="c2", output="CLIP", status="completed")])
    texts = [c.message.text() async for c in app.astream({"messages": [answer]}, cfg) if c.message is not None]
    assert texts[-1] == "done: 3 | CLIP"
