"""Where a ``transfer_to_<name>`` call may send the run (helper red-team, session 31).

A call was a handoff by its name alone (10xGraph's rule): a model's made-up ``transfer_to_savings``
on an agent without handoffs was answered "Handoff to savings", then the run failed routing to a
node that does not exist (``GRAPH_ROUTING_002``); ``transfer_to_<a tool node>`` failed the node on
every retry (``NODE_002``), ``transfer_to___end__`` ended the run without a reply, and a member
with handoff tools of its own could hand off past them (a ``can_handoff_to`` bypass). Now only an
agent node of the graph is a target, and on a ToolNode with handoff tools only through those;
anything else is an unknown tool, answered "Tool '...' not found." for the model to read.
"""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.prebuilt.tools.handoff import create_handoff_tool

from .tool_graphs import call, route, scripted_model


def _agent(name: str) -> Any:
    async def agent(state: AgentState) -> Message:
        return Message.text_message(f"{name} here", role="assistant")

    return agent


def _graph(tools: list[Any], asked: list[dict[str, Any]], checkpointer: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", scripted_model([asked, []]))
    g.add_node("tools", ToolNode(tools))
    g.add_node("savings_desk", _agent("savings_desk"))
    g.add_node("billing", _agent("billing"))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    g.add_edge("savings_desk", END)
    g.add_edge("billing", END)
    return g.compile(checkpointer=checkpointer)


async def _run(app: Any, checkpointer: Any, thread: str) -> list[Message]:
    cfg = {"thread_id": thread}
    await app.ainvoke({"messages": [Message.text_message("move my money")]}, dict(cfg))
    state = await checkpointer.aget_state(dict(cfg))
    assert str(state.execution_meta.status).endswith("completed"), state.execution_meta
    return state.context


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["transfer_to_savings", "transfer_to_tools", "transfer_to___end__",
                                  "transfer_to_a:b", "transfer_to_1"])
async def test_a_handoff_to_no_agent_is_an_unknown_tool(name: str, checkpointer: Any, make_thread: Any) -> None:
    app = _graph([], [call("h1", name)], checkpointer)
    ctx = await _run(app, checkpointer, make_thread("no-agent"))
    assert [(m.role, m.text()) for m in ctx[2:]] == [("tool", f"Tool '{name}' not found."), ("assistant", "done")]


@pytest.mark.asyncio
async def test_a_handoff_by_name_to_an_agent_node_still_routes(checkpointer: Any, make_thread: Any) -> None:
    app = _graph([], [call("h1", "transfer_to_billing")], checkpointer)
    ctx = await _run(app, checkpointer, make_thread("by-name"))
    assert [(m.role, m.text()) for m in ctx[2:]] == [("tool", "Handoff to billing"), ("assistant", "billing here")]


@pytest.mark.asyncio
async def test_a_node_with_handoff_tools_hands_off_only_through_them(checkpointer: Any, make_thread: Any) -> None:
    # Its one handoff tool goes to savings_desk: billing is an agent of the graph, but not its to reach.
    app = _graph([create_handoff_tool("savings_desk")], [call("h1", "transfer_to_billing")], checkpointer)
    ctx = await _run(app, checkpointer, make_thread("allowed"))
    assert [(m.role, m.text()) for m in ctx[2:]] == [("tool", "Tool 'transfer_to_billing' not found."),
                                                    ("assistant", "done")]
    app = _graph([create_handoff_tool("savings_desk")], [call("h1", "transfer_to_savings_desk")], checkpointer)
    ctx = await _run(app, checkpointer, make_thread("allowed-ok"))
    assert [(m.role, m.text()) for m in ctx[2:]] == [("tool", "Handoff to savings_desk"),
                                                    ("assistant", "savings_desk here")]


@pytest.mark.asyncio
async def test_a_second_handoff_in_one_message_is_told_the_first_wins(checkpointer: Any, make_thread: Any) -> None:
    """(session 31) Both calls were answered "Handoff to ...", and only the first got control."""
    app = _graph([], [call("h1", "transfer_to_billing"), call("h2", "transfer_to_savings_desk")], checkpointer)
    ctx = await _run(app, checkpointer, make_thread("two"))
    assert [(m.role, m.text()) for m in ctx[2:]] == [
        ("tool", "Handoff to billing"),
        ("tool", "Not handed off to savings_desk: this message already hands off to billing (the first handoff wins)"),
        ("assistant", "billing here")]


@pytest.mark.asyncio
async def test_a_handoff_beside_a_clients_call_goes_on_to_its_agent_once_the_client_answers(
    checkpointer: Any, make_thread: Any
) -> None:
    """One assistant message asks for a handoff and for a client-run (remote) tool: the tool node
    pauses for the client; its goto was dropped with the pause, so once the client answered the
    run went down the tool node's edge back to the model and the agent it handed off to never
    ran (second pass over session 38's routing fix; 10xGraph loops to RECURSION_001 here)."""
    import json

    from tenxgraph.core.state.message_block import ToolResultBlock

    calls: list[str] = []

    def model(state: AgentState) -> Message:
        calls.append("model")
        if state.context[-1].role == "tool":
            return Message.text_message("model again", role="assistant")
        return Message(role="assistant", content=[], tools_calls=[
            call("h1", "transfer_to_billing"), call("r1", "read_clipboard", {"fmt": "txt"})])

    def billing(state: AgentState) -> Message:
        calls.append("billing")
        return Message.text_message("billing here", role="assistant")

    from tenxgraph.runtime.publisher.publish import outbox_for

    from .publisher_graphs import Recorder

    rec = Recorder()
    g = StateGraph(AgentState, publisher=rec)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([create_handoff_tool("billing")]))
    g.add_node("billing", billing)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    g.add_edge("billing", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread(), "remote_tools": [{
        "name": "read_clipboard", "description": "Read the clipboard.",
        "parameters": {"type": "object", "properties": {"fmt": {"type": "string"}}}}]}
    await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    paused = await checkpointer.aget_state(dict(cfg))
    assert paused.execution_meta.interrupt_reason == "remote_tool_call"
    # The goto kept with the pause is the loop's: the pause's event carries no payload, as before.
    await outbox_for(rec).flush(30)
    interrupted = [e for e in rec.events if str(e.event_type) == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].data.get("interrupt") is None, interrupted
    answer = Message.tool_message([ToolResultBlock(call_id="r1", output="CLIP", status="completed")])
    out = await app.ainvoke({"messages": [answer]}, dict(cfg))
    assert calls == ["model", "billing"]
    assert [m.text() for m in out["messages"]][-1] == "billing here"
    stored = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in stored.context if m.role == "tool"] == ["Handoff to billing", "CLIP"]
    assert json.dumps(stored.execution_meta.interrupt_data) == "null"
