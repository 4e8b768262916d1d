"""A tool that returned, then had its run cut off in code that runs after it (a slow
``after_invoke`` callback), on every backend (helper red-team, session 31):

- ``node_timeout`` ran out there: the node was dropped with the call's record, and the resume
  (``ainvoke({})``) fired the tool again, for sync and async tools and callbacks alike (a cancel
  by the client was already recorded; 10xGraph fires it again too);
- the call's own ``tool_timeout`` ran out there: the model was told the call "exceeded its
  timeout and was cancelled" (``NODE_TIMEOUT_002``) although it had taken effect, so it could ask
  for a charge that had already succeeded (10xGraph the same).

Now the call is recorded as the tool returned it in both cases, and with ``tool_timeout`` the
model gets that result. A sync callback blocks the event loop: the limits are enforced by the
engine's own timers, beside it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.exceptions import NodeTimeoutError
from tenxgraph.utils import CallbackManager, InvocationType

from .tool_graphs import call, tool_graph, tool_texts

# A sync callback blocks the loop this long: well past the limits below, which the engine's
# timers (other threads) enforce meanwhile.
BLOCK_SECONDS = 3.0
LIMIT = 0.5


def _charge(kind: str, fired: list[int]) -> Any:
    if kind == "sync":
        def charge(amount: int) -> str:
            """Charge a card."""
            fired.append(amount)
            return f"charged {amount}"
    else:
        async def charge(amount: int) -> str:
            """Charge a card."""
            fired.append(amount)
            return f"charged {amount}"
    return charge


def _slow_after(kind: str) -> Any:
    if kind == "sync":
        def after(context: Any, invocation: Any, output: Any) -> Any:
            time.sleep(BLOCK_SECONDS)
            return output
    else:
        async def after(context: Any, invocation: Any, output: Any) -> Any:
            await asyncio.sleep(60)  # cancelled by the limit
            return output
    return after


def _graph(tool: str, callback: str, checkpointer: Any, fired: list[int]) -> tuple[Any, CallbackManager]:
    mgr = CallbackManager()
    mgr.register_after_invoke(InvocationType.TOOL, _slow_after(callback))
    app = tool_graph(AgentState, [_charge(tool, fired)], [[call("c1", "charge", {"amount": 129})], []],
                     checkpointer=checkpointer, callback_manager=mgr)
    return app, mgr


@pytest.mark.asyncio
@pytest.mark.parametrize("tool,callback", [("sync", "sync"), ("sync", "async"), ("async", "sync"), ("async", "async")])
async def test_node_timeout_after_the_tool_returned_does_not_fire_it_again(
        tool: str, callback: str, checkpointer: Any, make_thread: Any) -> None:
    fired: list[int] = []
    app, mgr = _graph(tool, callback, checkpointer, fired)
    cfg = {"thread_id": make_thread("node-timeout"), "node_timeout": LIMIT, "tool_timeout": 120}
    with pytest.raises(NodeTimeoutError):
        await app.ainvoke({"messages": [Message.text_message("pay")]}, dict(cfg))
    assert fired == [129]
    mgr.clear_callbacks()
    await app.ainvoke({}, dict(cfg))
    assert fired == [129], "the resume fired the tool again"
    state = await checkpointer.aget_state(dict(cfg))
    assert tool_texts(state.context)["c1"] == "charged 129"
    assert state.context[-1].text() == "done"


@pytest.mark.asyncio
@pytest.mark.parametrize("callback", ["sync", "async"])
async def test_tool_timeout_after_the_tool_returned_gives_the_model_its_result(
        callback: str, checkpointer: Any, make_thread: Any) -> None:
    fired: list[int] = []
    app, _ = _graph("async", callback, checkpointer, fired)
    cfg = {"thread_id": make_thread("tool-timeout"), "tool_timeout": LIMIT}
    await app.ainvoke({"messages": [Message.text_message("pay")]}, dict(cfg))
    assert fired == [129]
    state = await checkpointer.aget_state(dict(cfg))
    result = [m for m in state.context if m.role == "tool"]
    assert len(result) == 1 and result[0].text() == "charged 129", result[0].text()
    assert "NODE_TIMEOUT_002" not in result[0].text()
    key = f"{next(m for m in state.context if m.tools_calls).message_id}:c1"
    status = await checkpointer.aget_tool_status(dict(cfg), key)
    assert status is not None and "completed" in str(status).lower(), status
