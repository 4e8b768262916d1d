"""A new turn on a thread that failed at a tool node.

A tool node that fails (a node timeout on a tool whose backend hangs, say) leaves the assistant's
tool calls without results. The turn cannot land between those calls and their results, and `{}`
fails the same way again while the backend hangs: before, the thread took no new turn at all
(STORAGE_BUSY_001 here, NODE_002 on 10xGraph 0.10). Now the new turn first answers each call,
with its recorded result where the ledger has one (that tool is not run again) and with an error
saying it was not run again otherwise, and then goes on as any turn. Every backend.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.exceptions import NodeTimeoutError
from tenxgraph.core.state.message_block import ToolResultBlock
from tests_py.redteam.graphs import agent_loop
from tests_py.redteam.tool_history import order_turn_message


def build(cp: Any, effects: Counter[str], hang_for: set[str], interrupt_before: list[str] | None = None) -> Any:
    """model asks for `charge` and `ship` of the order its user names, then answers; `ship` hangs
    for the orders in ``hang_for``."""

    async def charge(order_id: str) -> str:
        """Charge the order."""
        effects[f"charge {order_id}"] += 1
        return f"charged {order_id}"

    async def ship(order_id: str) -> str:
        """Ship the order."""
        if order_id in hang_for:
            await asyncio.Event().wait()
        effects[f"ship {order_id}"] += 1
        return f"shipped {order_id}"

    async def model(state: AgentState) -> Message:
        return order_turn_message(state)

    return agent_loop(model, [charge, ship], cp, interrupt_before=interrupt_before)


def turn(text: str) -> dict[str, Any]:
    return {"messages": [Message.text_message(text)]}


def result_of(msg: Message) -> ToolResultBlock:
    blocks = [b for b in msg.content if isinstance(b, ToolResultBlock)]
    assert len(blocks) == 1, msg
    return blocks[0]


async def send(app: Any, how: str, data: dict[str, Any], cfg: dict[str, Any]) -> None:
    if how == "ainvoke":
        await app.ainvoke(data, cfg)
    elif how == "astream":
        async for _ in app.astream(data, cfg):
            pass
    else:
        await asyncio.to_thread(app.invoke, data, cfg)


@pytest.mark.parametrize("how", ["ainvoke", "astream", "invoke"])
def test_a_new_turn_answers_the_failed_calls_first_and_runs_no_finished_tool_again(
        checkpointer: Any, make_thread: Any, how: str, caplog: pytest.LogCaptureFixture) -> None:
    effects: Counter[str] = Counter()
    app = build(checkpointer, effects, hang_for={"o-1"})
    cfg = {"thread_id": make_thread("failed-tools"), "user_id": "u1", "node_timeout": 0.5}

    async def scenario() -> None:
        with pytest.raises(NodeTimeoutError):
            await app.ainvoke(turn("o-1"), cfg)
        # `{}` tries the node again: the recorded charge is answered from the ledger, ship hangs again.
        with pytest.raises(NodeTimeoutError):
            await app.ainvoke({}, cfg)
        state = await checkpointer.aget_state(cfg)
        assert state.execution_meta.status.value == "error" and state.execution_meta.current_node == "tools"
        with caplog.at_level(logging.WARNING, logger="tenxgraph"):
            await send(app, how, turn("o-2"), cfg)

    asyncio.run(scenario())
    state = asyncio.run(checkpointer.aget_state(cfg))
    ctx = state.context
    assert [m.role for m in ctx] == ["user", "assistant", "tool", "tool", "user", "assistant", "tool", "tool", "assistant"]
    assert state.execution_meta.status.value == "completed"
    charged, not_shipped = result_of(ctx[2]), result_of(ctx[3])
    # The charge had returned and was recorded before the node timed out: its own result.
    assert (charged.call_id, charged.output, charged.is_error) == ("charge-o-1", "charged o-1", False)
    # The hanging ship was never recorded: an error the model can read, not a result.
    assert not_shipped.call_id == "ship-o-1" and not_shipped.is_error
    assert "TOOL_NOT_ANSWERED" in str(not_shipped.output) and "not run again" in str(not_shipped.output)
    assert ctx[4].text() == "o-2"
    assert [result_of(m).output for m in ctx[6:8]] == ["charged o-2", "shipped o-2"]
    # Each tool's effect once: the charge of o-1 was not fired again by `{}` nor by the close.
    assert effects == Counter({"charge o-1": 1, "charge o-2": 1, "ship o-2": 1})
    assert any(getattr(r, "event", None) == "failed_tool_node_closed" for r in caplog.records)


def test_a_review_gate_or_a_stop_at_the_tool_node_still_refuses_a_new_turn(checkpointer: Any, make_thread: Any) -> None:
    """Only a failed node is closed by a new turn: calls paused at a review gate wait for the
    reviewer (`{}` runs them), so a new message there is still refused, and nothing is written."""
    effects: Counter[str] = Counter()
    app = build(checkpointer, effects, hang_for=set(), interrupt_before=["tools"])
    cfg = {"thread_id": make_thread("gate"), "user_id": "u1"}

    async def scenario() -> None:
        await app.ainvoke(turn("o-1"), cfg)
        before = await checkpointer.aget_state(cfg)
        with pytest.raises(Exception) as refused:
            await app.ainvoke(turn("o-2"), cfg)
        assert getattr(refused.value, "error_code", None) == "STORAGE_BUSY_001", refused.value
        after = await checkpointer.aget_state(cfg)
        assert len(after.context) == len(before.context) and after.execution_meta.status == before.execution_meta.status
        await app.ainvoke({}, cfg)  # the reviewer's go-ahead runs them

    asyncio.run(scenario())
    assert effects == Counter({"charge o-1": 1, "ship o-1": 1})


def test_two_new_turns_racing_on_a_failed_tool_node_close_it_once(checkpointer: Any, make_thread: Any) -> None:
    """Two clients send a turn at once to a thread that failed at a tool node (on_busy="wait"):
    the calls are answered once, both turns land after them, each in one piece."""
    effects: Counter[str] = Counter()
    app = build(checkpointer, effects, hang_for={"o-1"})
    thread = make_thread("race")
    cfg = {"thread_id": thread, "user_id": "u1", "node_timeout": 0.5}

    async def scenario() -> None:
        with pytest.raises(NodeTimeoutError):
            await app.ainvoke(turn("o-1"), cfg)
        wait_cfg = {**cfg, "on_busy": "wait", "busy_timeout": 60}
        await asyncio.gather(app.ainvoke(turn("o-2"), {**wait_cfg, "run_id": uuid.uuid4().hex}),
                             app.ainvoke(turn("o-3"), {**wait_cfg, "run_id": uuid.uuid4().hex}))

    asyncio.run(scenario())
    ctx = asyncio.run(checkpointer.aget_state(cfg)).context
    answers = [result_of(m).call_id for m in ctx if m.role == "tool"]
    assert sorted(answers) == sorted(["charge-o-1", "ship-o-1", "charge-o-2", "ship-o-2", "charge-o-3", "ship-o-3"]), answers
    # every assistant's calls are followed by exactly their results
    for i, m in enumerate(ctx):
        if m.role == "assistant" and m.tools_calls:
            want = [c["id"] for c in m.tools_calls]
            assert [result_of(x).call_id for x in ctx[i + 1:i + 1 + len(want)]] == want, [x.role for x in ctx]
    assert effects == Counter({"charge o-1": 1, "charge o-2": 1, "ship o-2": 1, "charge o-3": 1, "ship o-3": 1})
