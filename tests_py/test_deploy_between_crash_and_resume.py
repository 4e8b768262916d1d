"""A thread crashed under one deploy of an agent and continued by the next, which renamed a node
or a tool (helper red-team, session 37). A deploy SIGKILLs the workers mid-run and the new code
recovers their threads: what the old code started must stay settled by the ledger."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph.core.exceptions import GraphError
from tenxgraph.storage.checkpointer import SqliteCheckpointer

from .kit_agents import deploys

OLD = "tests_py.kit_agents.deploys:build"


@pytest.mark.asyncio
async def test_a_crashed_run_in_a_node_the_deploy_renamed_goes_on_from_the_node_the_caller_names(
        crash_kit: Any, sqlite_db: str) -> None:
    """`{}` answers GRAPH_004, advising to name the node to start at; naming it was refused as
    busy (STORAGE_BUSY_001, "resume it with ainvoke({})"): the thread, with a recorded payment in
    it, could not be moved on by the new code at all."""
    crashed = crash_kit.run_until_crash(OLD, "renamed-node", failpoints="after_record:pay=kill", input="pay")
    assert crashed.killed, crashed
    cp = SqliteCheckpointer(sqlite_db)
    app = deploys.build_node_renamed(cp)
    cfg = {"thread_id": "renamed-node"}
    with pytest.raises(GraphError) as refused:
        await app.ainvoke({}, dict(cfg))
    assert refused.value.error_code == "GRAPH_004" and "current_node" in str(refused.value)
    out = await app.ainvoke({"state": {"current_node": "tools_v2"}}, dict(cfg))
    assert out["messages"][-1].text() == "done: paid 42"
    crash_kit.effects.assert_exactly_once("pay")
    await cp.arelease()


@pytest.mark.asyncio
async def test_a_started_at_most_once_call_whose_tool_the_deploy_renamed_is_an_unknown_outcome(
        crash_kit: Any, sqlite_db: str) -> None:
    """The call started (its intent row) and took effect, then the process was killed; the new
    code renamed the tool, so the name had no class but the default (idempotent): the call was
    "run again" as a tool not found, and the model read that it never happened."""
    crashed = crash_kit.run_until_crash(OLD, "renamed-tool", failpoints="after_tool:charge=kill", input="charge it")
    assert crashed.killed, crashed
    cp = SqliteCheckpointer(sqlite_db)
    out = await deploys.build_tool_renamed(cp).ainvoke({}, {"thread_id": "renamed-tool"})
    answer = [m.text() for m in out["messages"] if m.role == "tool"]
    assert len(answer) == 1 and "[TOOL_OUTCOME_UNKNOWN]" in answer[0], answer
    crash_kit.effects.assert_exactly_once("charge")
    await cp.arelease()
