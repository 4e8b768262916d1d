"""A process killed after it committed the client's answer to a remote-tool pause (or a retry after
a routing error), before the next node's step: the committed state named the paused node as the
one to run, so the resume ran the tool node again on the client's results: `NODE_002` "the last
message has no tool calls", the thread in `error` for good, every `{}` and recovery pass failing
the same way (red-team, session 34). The input commit now says that the run routes on from that
node (`routing_pending`), and a resume does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.testing import EffectCounter, run_until_crash
from tests_py.crash_agents import remote_answer_agent as agent

TARGET = "tests_py.crash_agents.remote_answer_agent:build"


@pytest.mark.asyncio
@pytest.mark.parametrize("failpoint", ["after_step:__input__=kill", "in_step_tx:model=kill"])
async def test_a_crash_after_the_clients_answer_is_committed_resumes_at_the_next_node(
    tmp_path: Path, effects: EffectCounter, failpoint: str
) -> None:
    db = tmp_path / "remote.db"
    cp = SqliteCheckpointer(str(db))
    app = agent.build(cp)
    config = {"thread_id": "t-remote"}
    try:
        paused = await app.ainvoke({"messages": [agent.Message.text_message("paste it")]}, config,
                                   response_granularity="full")
        assert paused["state"].execution_meta.interrupt_reason == "remote_tool_call"
    finally:
        await cp.arelease()
    crash = run_until_crash(TARGET, "t-remote", db=db, input={"messages": [agent.answer()]},
                            failpoints=failpoint, timeout=60)
    assert crash.killed, (crash.stdout, crash.stderr)

    cp = SqliteCheckpointer(str(db))
    try:
        result = await agent.build(cp).ainvoke({}, config)
        assert result["messages"][-1].text() == "done: CLIP"
        state = await cp.aget_state(config)
        assert state.execution_meta.status.value == "completed"
        assert state.execution_meta.interrupt_reason is None
        assert [m.role for m in state.context] == ["user", "assistant", "tool", "tool", "assistant"]
        effects.assert_exactly_once("add")
    finally:
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_crash_in_the_retry_after_a_routing_error_routes_again_instead_of_running_the_node(
    tmp_path: Path, effects: EffectCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool node's router fails: the thread is `error`, `routing_failed` at the tool node, whose
    step is committed. The retry `{}` is killed after its input commit: the next `{}` ran the tool
    node again on its own results (NODE_002, for good)."""
    db = tmp_path / "reroute.db"
    flag = tmp_path / "route-fails"
    flag.write_text("")
    monkeypatch.setenv(agent.ROUTE_FAILS_ENV, str(flag))
    config = {"thread_id": "t-reroute"}
    cp = SqliteCheckpointer(str(db))
    app = agent.build(cp)
    try:
        with pytest.raises(Exception, match="router bug"):
            await app.ainvoke({"messages": [agent.Message.text_message("add them")]}, config)
        failed = await cp.aget_state(config)
        assert (failed.execution_meta.status.value, failed.execution_meta.interrupt_reason) == ("error", "routing_failed")
    finally:
        await cp.arelease()
    flag.unlink()  # the router is fixed
    crash = run_until_crash(TARGET, "t-reroute", db=db, input={}, failpoints="after_step:__input__=kill", timeout=60)
    assert crash.killed, (crash.stdout, crash.stderr)

    cp = SqliteCheckpointer(str(db))
    try:
        result = await agent.build(cp).ainvoke({}, config)
        state = await cp.aget_state(config)
        assert state.execution_meta.status.value == "completed", state.execution_meta
        assert result["messages"][-1].text().startswith("done: ")
        effects.assert_exactly_once("add")
    finally:
        await cp.arelease()
