"""A tool node's step stores each tool message as the text its ledger row was made from (no second
dump), and only where nothing of the user's can change the message before that step's commit: a
routing condition leaving the tool node or a lifecycle hook sees the message first, and what it
changed in place is what is stored."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.utils import CallbackManager, GraphLifecycleHook
from tenxgraph.utils.tool_decorator import tool
from tests_py.tool_graphs import call, route, scripted_model


@tool(name="lookup")
async def lookup(order: str) -> dict[str, Any]:
    return {"order": order, "total": 12.5, "items": ["a", "b"], "note": "é \"quoted\" \u2028"}


def mark(state: AgentState, how: str) -> None:
    for m in state.context:
        if m.role == "tool":
            m.metadata["changed_by"] = how  # in place: the same object the step stores


class Marking(GraphLifecycleHook):
    async def on_state_update(self, context: Any, node_name: str, old_state: Any, new_state: Any, step: int) -> None:
        if node_name == "tools":
            mark(new_state, "hook")
        return None


def build(cp: Any, how: str | None) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", scripted_model([[call("c1", "lookup", {"order": "o-1"}), call("c2", "lookup", {"order": "o-2"})]]))
    g.add_node("tools", ToolNode([lookup]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    if how == "condition":
        def back(state: AgentState) -> str:
            mark(state, "condition")
            return "model"

        g.add_conditional_edges("tools", back, {"model": "model"})
    else:
        g.add_edge("tools", "model")
    kw: dict[str, Any] = {}
    if how == "hook":
        mgr = CallbackManager()
        mgr.register_lifecycle_hook(Marking())
        kw["callback_manager"] = mgr
    return g.compile(checkpointer=cp, **kw)


async def stored_tool_messages(cp: Any, thread: str) -> list[dict[str, Any]]:
    state = await cp.aget_state({"thread_id": thread})
    return [m.model_dump(mode="json") for m in state.context if m.role == "tool"]


@pytest.mark.asyncio
async def test_tool_messages_are_stored_as_the_run_holds_them(checkpointer: Any, make_thread: Any) -> None:
    thread = make_thread("stored")
    r = await build(checkpointer, None).ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": thread})
    live = [m.model_dump(mode="json") for m in r["messages"] if m.role == "tool"]
    assert [m["metadata"]["tool_call_id"] for m in live] == ["c1", "c2"]
    assert live[1]["content"][0]["output"][0]["order"] == "o-2"  # a dict result, as a one-item list
    assert await stored_tool_messages(checkpointer, thread) == live


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["condition", "hook"])
async def test_a_change_made_before_the_commit_is_stored(checkpointer: Any, make_thread: Any, how: str) -> None:
    thread = make_thread(f"changed-{how}")
    r = await build(checkpointer, how).ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": thread})
    assert [m.metadata.get("changed_by") for m in r["messages"] if m.role == "tool"] == [how, how]
    stored = await stored_tool_messages(checkpointer, thread)
    assert [m["metadata"].get("changed_by") for m in stored] == [how, how]
