"""An MCP call that returned, then had its run cut off after it (a slow MCP ``after_invoke``
callback), on every backend (helper red-team, session 35):

- ``node_timeout`` or ``stop()`` ran out there: the call had no record, and ``ainvoke({})`` sent
  it to the server again (the default side-effect class), or told the model its outcome was
  unknown (``mcp_side_effects="at_most_once"``);
- its ``tool_timeout`` ran out there: the model was told the call was cancelled.

Local tools got this in session 31 (test_tool_cut_after_return.py); an MCP call now tells the
node handler it returned as soon as the server answered, before callbacks and the client's exit.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

fastmcp = pytest.importorskip("fastmcp", reason="the mcp extra (fastmcp) is not installed")
from fastmcp import Client, FastMCP  # noqa: E402

from tenxgraph import END, START, AgentState, Message, StateGraph  # noqa: E402
from tenxgraph.core.graph.tool_node import ToolNode  # noqa: E402
from tenxgraph.utils import CallbackManager, InvocationType  # noqa: E402

from .tool_graphs import call, route, scripted_model, tool_texts  # noqa: E402


def _server(served: list[int]) -> FastMCP:
    mcp = FastMCP("payments")

    @mcp.tool
    def charge(amount: int) -> str:
        """Charge the card."""
        served.append(amount)
        return f"charged {amount}"

    return mcp


@pytest.mark.asyncio
@pytest.mark.parametrize("cut", ["node_timeout", "stop", "tool_timeout"])
@pytest.mark.parametrize("side_effects", ["idempotent", "at_most_once"])
async def test_an_mcp_call_cut_off_after_it_returned_is_never_sent_again(
    checkpointer: Any, make_thread: Any, cut: str, side_effects: str
) -> None:
    served: list[int] = []
    after_entered = asyncio.Event()

    async def audit(context: Any, invocation: Any, output: Any) -> Any:
        after_entered.set()
        await asyncio.sleep(60)  # cut off by the limit or the stop
        return output

    mgr = CallbackManager()
    mgr.register_after_invoke(InvocationType.MCP, audit)
    g = StateGraph(AgentState)
    g.add_node("model", scripted_model([[call("c1", "charge", {"amount": 5})]]))
    g.add_node("tools", ToolNode([], client=Client(_server(served)), mcp_side_effects=side_effects))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=checkpointer, callback_manager=mgr)
    cfg: dict[str, Any] = {"thread_id": make_thread()}
    limits = {"node_timeout": {"node_timeout": 1}, "tool_timeout": {"tool_timeout": 1}}.get(cut, {})
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("pay")]}, {**cfg, **limits}))
    if cut == "stop":
        await asyncio.wait_for(after_entered.wait(), 30)
        assert (await app.astop(dict(cfg)))["running"] is True
    try:
        await asyncio.wait_for(run, 60)
    except Exception:  # noqa: BLE001 - NodeTimeoutError for node_timeout; the thread is resumed below
        pass
    assert after_entered.is_set() and served == [5]
    mgr.clear_callbacks()
    out = await app.ainvoke({}, dict(cfg), "full")
    assert served == [5], "the call that returned was sent to the server again"
    assert out["state"].execution_meta.status == "completed"
    told = str(tool_texts(out["state"].context)["c1"])
    assert "charged 5" in told and "cancelled" not in told and "unknown" not in told.lower(), told
