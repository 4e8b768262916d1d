"""A turn's per-run remote tools (``config["remote_tools"]``) are kept with the thread, so a run
that continues the turn without them still hands the client its call (red-team, session 36).

Before, a resume without them (``arecover()`` or ``ainvoke({})`` after a SIGKILL, or after a
failure) took the client's call for a server tool it lacked: the model was told "Tool
'read_clipboard' not found" and the turn ended without the client ever being asked.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core.state.message import ToolResultBlock
from tenxgraph.core.graph import ToolNode
from tenxgraph.storage.checkpointer import SqliteCheckpointer

PER_RUN = [{"name": "read_clipboard", "description": "Read the clipboard",
            "parameters": {"type": "object", "properties": {"fmt": {"type": "string"}}}}]


def _assert_client_was_asked(state: Any) -> None:
    meta = state.execution_meta
    assert (str(meta.status), meta.interrupt_reason) == ("interrupted_after", "remote_tool_call"), meta
    tool_texts = [m.text() for m in state.context if m.role == "tool"]
    assert tool_texts == ["3"], tool_texts  # the server's own tool only; nothing said "not found"


@pytest.mark.parametrize("point", ["before_tool:add", "after_record:add"])
def test_a_resume_after_a_kill_hands_the_client_its_call(crash_kit: Any, point: str) -> None:
    """The run is SIGKILLed in its tool node, before the local call runs or once it is recorded;
    a fresh process resumes the thread without ``remote_tools`` (as ``arecover()`` and
    ``tenxgraph recover`` do)."""
    target = "tests_py.kit_agents.remote:build_per_run"
    crashed = crash_kit.run_until_crash(target, "rk-1", failpoints=f"{point}=kill", input="hi",
                                        config={"remote_tools": PER_RUN})
    assert crashed.killed, crashed
    paused = crash_kit.resume(target, "rk-1")
    assert (paused.status, paused.message_dicts[-1]["content"][0]["type"]) == ("interrupted_after", "remote_tool_call"), paused
    results = [b["output"] for m in paused.message_dicts for b in m["content"] if b["type"] == "tool_result"]
    assert results == ["3"], results  # the server's own tool only; nothing said "not found"
    crash_kit.effects.assert_exactly_once("add")


def _gated_graph(cp: Any, model: Any, gate: Any) -> Any:
    """model -> gate -> tools (``add``, the client's tools beside it) -> model."""

    def add(a: int, b: int) -> int:
        """Adds."""
        return a + b

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("gate", gate)
    g.add_node("tools", ToolNode([add]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", lambda s: "gate" if s.context[-1].tools_calls else END, {"gate": "gate", END: END})
    g.add_edge("gate", "tools")
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


@pytest.mark.asyncio
async def test_a_retry_without_them_after_a_failure_hands_the_client_its_call(tmp_path: Path) -> None:
    failing = True

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

    cp = SqliteCheckpointer(tmp_path / "cp.db")
    app = _gated_graph(cp, model, gate)
    with pytest.raises(Exception, match="gate down"):
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t2", "remote_tools": PER_RUN})
    failing = False
    await asyncio.wait_for(app.ainvoke({}, {"thread_id": "t2"}), 60)
    _assert_client_was_asked(await cp.aget_state({"thread_id": "t2"}))
    # Kept with the thread as sent (the model node of a resumed turn lists them too).
    state = await cp.aget_state({"thread_id": "t2"})
    assert state.execution_meta.internal_data.get("remote_tools") == {"turn": state.context[0].message_id,
                                                                     "tools": PER_RUN}
    await cp.arelease()


def _offering_graph(cp: Any, offered: list[list[str]]) -> Any:
    """A model that asks for the client's tool on "read my clip", and on any other turn asks for
    it only if it is offered (as a real model given its tools would); it notes what it is offered."""

    def model(state: AgentState, config: dict[str, Any]) -> Message:
        tools = [t["name"] for t in (config.get("remote_tools") or [])]
        offered.append(tools)
        last = state.context[-1]
        if last.role == "tool":
            return Message.text_message("done", role="assistant")
        if "clip" in last.text() or tools:
            call = {"id": f"c{len(offered)}", "type": "function", "function": {"name": "read_clipboard", "arguments": "{}"}}
            return Message(role="assistant", content=[], tools_calls=[call])
        return Message.text_message("plain answer", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


@pytest.mark.asyncio
async def test_a_new_turn_refused_on_a_kept_copy_is_not_offered_the_last_turns_tools(
        checkpointer: Any, make_thread: Any) -> None:
    """(second red-team, session 36) Worker A's turn paused for the client; worker B (another
    graph: its own kept copy) took the client's result. A's next turn, without remote tools, was
    refused on A's kept copy and prepared again from a read, and the first preparation had put
    the kept tools in the run's config: the new turn was offered them and paused for the client."""
    from tenxgraph.core.state.message_block import ToolResultBlock

    offered: list[list[str]] = []
    a, b = _offering_graph(checkpointer, offered), _offering_graph(checkpointer, offered)
    cfg = {"thread_id": make_thread("kept-copy")}
    await a.ainvoke({"messages": [Message.text_message("read my clip")]}, dict(cfg, remote_tools=PER_RUN))
    result = Message.tool_message([ToolResultBlock(call_id="c1", output="CLIP", status="completed")])
    await b.ainvoke({"messages": [result]}, dict(cfg))
    offered.clear()
    out = await a.ainvoke({"messages": [Message.text_message("what is 2+2")]}, dict(cfg))
    assert out["messages"][-1].text() == "plain answer"
    assert offered == [[]], offered
    state = await checkpointer.aget_state(dict(cfg))
    assert "remote_tools" not in state.execution_meta.internal_data


@pytest.mark.asyncio
async def test_remote_tools_the_store_cannot_hold_are_used_for_the_call_and_not_kept(tmp_path: Path) -> None:
    """(second red-team, session 36) A schema with an infinity (``"maximum": inf``) passed a
    plain ``json.dumps``, and its keeping failed the whole turn with STORAGE_SERIALIZATION_001
    naming a field the user never set. Used for this call, as before, and not kept."""
    offered: list[list[str]] = []
    cp = SqliteCheckpointer(tmp_path / "cp.db")
    app = _offering_graph(cp, offered)
    odd = [{"name": "read_clipboard", "description": "Read",
            "parameters": {"type": "object", "properties": {"n": {"type": "number", "maximum": float("inf")}}}}]
    await app.ainvoke({"messages": [Message.text_message("read my clip")]}, {"thread_id": "t-odd", "remote_tools": odd})
    state = await cp.aget_state({"thread_id": "t-odd"})
    assert (state.execution_meta.interrupt_reason, offered) == ("remote_tool_call", [["read_clipboard"]])
    assert "remote_tools" not in state.execution_meta.internal_data
    await cp.arelease()


def _nested(levels: int) -> list[dict[str, Any]]:
    """Remote tools whose JSON nests ``levels`` deep (list > tool > parameters > default...)."""
    default: Any = "x"
    for _ in range(levels - 3):
        default = [default]
    return [{"name": "read_clipboard", "description": "Read",
             "parameters": {"type": "object", "properties": {}, "default": default}}]


@pytest.mark.asyncio
@pytest.mark.parametrize(("levels", "kept"), [(123, True), (124, False)], ids=["as-deep-as-kept", "deeper"])
async def test_remote_tools_are_kept_as_deep_as_the_store_holds_them(tmp_path: Path, levels: int, kept: bool) -> None:
    """Kept under four levels of the state, the tools may nest 123 deep in a store that holds
    127 (a separate depth walk allowed 100, refusing what the store keeps: session 37); deeper
    ones serve their call and are not kept, and the turn's commit holds."""
    offered: list[list[str]] = []
    cp = SqliteCheckpointer(tmp_path / "cp.db")
    app = _offering_graph(cp, offered)
    tools = _nested(levels)
    await app.ainvoke({"messages": [Message.text_message("read my clip")]}, {"thread_id": "t-deep", "remote_tools": tools})
    state = await cp.aget_state({"thread_id": "t-deep"})
    assert (state.execution_meta.interrupt_reason, offered) == ("remote_tool_call", [["read_clipboard"]])
    assert ((state.execution_meta.internal_data.get("remote_tools") or {}).get("tools") == tools) is kept
    await cp.arelease()


@pytest.mark.asyncio
@pytest.mark.parametrize("window", [False, True], ids=["whole-history", "window"])
async def test_tools_kept_with_an_earlier_turn_are_not_offered_to_a_later_one(checkpointer: Any,
                                                                              make_thread: Any, window: bool) -> None:
    """(red-team, session 37) A writer that does not know the kept tools (a process of the
    previous release during a rolling deploy, 10xGraph, ``aput_state``) starts a new turn and
    leaves them in place; that turn, continued by ``{}`` (a recovery), was offered the earlier
    turn's client tools, and its model's call to one paused for a client that never sent it."""
    from tenxgraph.core.state.execution_state import ExecutionStatus

    offered: list[list[str]] = []
    app = _offering_graph(checkpointer, offered)
    cfg = {"thread_id": make_thread("turns")}
    await app.ainvoke({"messages": [Message.text_message("read my clip")]}, dict(cfg, remote_tools=PER_RUN))
    paused = await checkpointer.aget_state(dict(cfg))
    call_id = paused.context[-1].tools_calls[0]["id"]
    await app.ainvoke({"messages": [Message.tool_message(content=[ToolResultBlock(call_id=call_id, output="clip")])]},
                      dict(cfg))
    done = await checkpointer.aget_state(dict(cfg))
    assert done.context[-1].text() == "done" and "remote_tools" in done.execution_meta.internal_data
    # The other writer's new turn, paused before the model (its input stored, the kept tools left);
    # with a window of the last messages, which drops the earlier turn's question too (third
    # red-team pass: the tools were taken for a turn that trimmed its own question).
    if window:
        done.context = done.context[-2:]
    done.context.append(Message.text_message("what time is it"))
    meta = done.execution_meta
    meta.status, meta.current_node, meta.interrupted_node = ExecutionStatus.INTERRUPTED_BEFORE, "model", "model"
    await checkpointer.aput_state(dict(cfg), done)
    offered.clear()
    out = await app.ainvoke({}, dict(cfg))
    assert offered == [[]]
    assert out["messages"][-1].text() == "plain answer"


@pytest.mark.asyncio
async def test_a_retry_hands_the_client_its_call_when_a_node_trimmed_the_turns_question(tmp_path: Path) -> None:
    """(second red-team pass, session 37) The model node keeps a window of the last messages,
    dropping the turn's user message; the tools kept with that turn were then taken for an
    earlier turn's, and the retry answered the client's call "Tool ... not found"."""
    failing = True

    def model(state: AgentState) -> AgentState:
        results = [m for m in state.context if m.role == "tool"]
        if len(state.context) > 2:
            state.context = state.context[-2:]  # a window of the latest messages
        if len(results) >= 2:
            state.context.append(Message.text_message("done", role="assistant"))
            return state
        name, args = ("add", {"a": 1, "b": 2}) if not results else ("read_clipboard", {})
        call = {"id": f"c{len(results) + 1}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        state.context.append(Message(role="assistant", content=[], tools_calls=[call]))
        return state

    async def gate(state: AgentState) -> AgentState:  # fails once, before the client's call
        nonlocal failing
        if failing and state.context[-1].tools_calls[0]["id"] == "c2":
            failing = False
            raise RuntimeError("gate down")
        return state

    cp = SqliteCheckpointer(tmp_path / "cp.db")
    app = _gated_graph(cp, model, gate)
    with pytest.raises(Exception, match="gate down"):
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t", "remote_tools": PER_RUN})
    await asyncio.wait_for(app.ainvoke({}, {"thread_id": "t"}), 60)
    state = await cp.aget_state({"thread_id": "t"})
    assert (str(state.execution_meta.status), state.execution_meta.interrupt_reason) == ("interrupted_after",
                                                                                         "remote_tool_call")
    assert not any("not found" in m.text() for m in state.context if m.role == "tool")
    await cp.arelease()
