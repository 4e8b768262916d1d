"""Which tool nodes write intent rows before their calls start: only those with an at-most-once
call (its replay must not run it again). A node of idempotent calls reads the ledger and writes
nothing before its calls run (one durable commit fewer per turn); each call's result is still
recorded the moment it returns, and a crashed idempotent call is run again on replay."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.utils.tool_decorator import tool
from tests_py.tool_graphs import call, tool_graph, tool_texts


def status_probe(name: str, effects: str, cp: Any, cfg: dict[str, Any], seen: dict[str, Any]) -> Any:
    """A tool that reads its own call's ledger status while it runs."""

    @tool(name=name, side_effects=effects)
    async def probe() -> str:
        state = await cp.aget_state(cfg)
        [asked] = [m for m in state.context if m.tools_calls]
        for c in asked.tools_calls:
            key = f"{asked.message_id}:{c['id']}"
            seen.setdefault(c["id"], await cp.aget_tool_status(cfg, key))
        return f"{name} done"

    return probe


@pytest.mark.asyncio
@pytest.mark.parametrize(("classes", "started"), [
    (["idempotent", "idempotent"], False),
    (["idempotent", "at_most_once"], True),
    (["at_most_once"], True),
])
async def test_only_a_node_with_an_at_most_once_call_writes_intents(checkpointer, make_thread, classes,
                                                                    started) -> None:
    cfg = {"thread_id": make_thread()}
    seen: dict[str, Any] = {}
    tools = [status_probe(f"t{i}", c, checkpointer, cfg, seen) for i, c in enumerate(classes)]
    calls = [call(f"c{i}", f"t{i}", {}) for i in range(len(classes))]
    # seen["c0"] is read by c0 itself (or by a sibling earlier) before c0 returns: "started" when
    # an intent row was written, None when the node wrote nothing before its calls ran.
    app = tool_graph(AgentState, tools, [calls], checkpointer=checkpointer)
    await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg))
    state = await checkpointer.aget_state(cfg)
    assert str(state.execution_meta.status) == "completed"
    assert tool_texts(state.context) == {f"c{i}": f"t{i} done" for i in range(len(classes))}
    first = seen["c0"]
    assert first == ("started" if started else None), seen
    for i in range(len(classes)):  # recorded once each returned, either way
        [asked] = [m for m in state.context if m.tools_calls]
        assert await checkpointer.aget_tool_status(cfg, f"{asked.message_id}:c{i}") == "completed"
