"""Failpoints in the core: each point, with `raise` in-process and `kill` in a child process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.exceptions import FailpointError
from tests_py.tool_graphs import call, tool_graph, tool_texts

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "support_agent.py"


def user(text: str) -> Message:
    return Message.text_message(text)


def _app(checkpointer, counts: dict[str, int]):
    async def charge() -> str:
        counts["charge"] = counts.get("charge", 0) + 1
        return "charged"

    return tool_graph(AgentState, [charge], [[call("c1", "charge")]], checkpointer=checkpointer)


async def _ledger_has_charge(checkpointer, cfg) -> bool:
    state = await checkpointer.aget_state(dict(cfg))
    ask = next((m for m in state.context if m.tools_calls), None)
    return ask is not None and await checkpointer.aget_tool_result(cfg, f"{ask.message_id}:c1") is not None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("spec", "ran_before_resume", "recorded", "ran_total"),
    [
        ("before_tool:charge=raise", 0, False, 1),   # never ran: runs once on resume
        ("after_tool:charge=raise", 1, False, 2),    # the window: ran, not recorded, runs again
        ("after_record:charge=raise", 1, True, 1),   # recorded: the resume replays it
    ],
)
async def test_tool_failpoints(checkpointer, make_thread, spec, ran_before_resume, recorded, ran_total) -> None:
    counts: dict[str, int] = {}
    app = _app(checkpointer, counts)
    cfg = {"thread_id": make_thread(), "failpoints": spec}
    with pytest.raises(FailpointError) as e:
        await app.ainvoke({"messages": [user("pay")]}, cfg)
    assert e.value.error_code == "FAILPOINT_001"
    assert counts.get("charge", 0) == ran_before_resume
    assert await _ledger_has_charge(checkpointer, cfg) is recorded
    resume_cfg = {"thread_id": cfg["thread_id"]}
    r = await app.ainvoke({}, resume_cfg)
    assert counts["charge"] == ran_total
    assert tool_texts(r["messages"]) == {"c1": "charged"}


@pytest.mark.asyncio
async def test_in_step_tx_writes_nothing_and_after_step_keeps_the_step(checkpointer, make_thread) -> None:
    counts: dict[str, int] = {}
    app = _app(checkpointer, counts)
    cfg = {"thread_id": make_thread()}
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [user("pay")]}, dict(cfg, failpoints="in_step_tx:model=raise"))
    probe = dict(cfg)
    state = await checkpointer.aget_state(probe)
    assert probe["_checkpoint_version"] == 1, "only the input commit; the model step rolled back"
    assert [m.role for m in state.context] == ["user"]

    cfg2 = {"thread_id": make_thread()}
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [user("pay")]}, dict(cfg2, failpoints="after_step:model=raise"))
    # after_step raised after the model's step committed: the failure was then recorded on top.
    state = await checkpointer.aget_state(dict(cfg2))
    assert [m.role for m in state.context] == ["user", "assistant"]
    r = await app.ainvoke({}, cfg2)  # resumes at the failed point and completes
    assert counts["charge"] == 1 and r["messages"][-1].text() == "done"


@pytest.mark.asyncio
async def test_nth_occurrence_and_mid_stream(checkpointer, make_thread) -> None:
    counts: dict[str, int] = {}
    app = _app(checkpointer, counts)
    cfg = {"thread_id": make_thread(), "failpoints": "after_step:model@2=raise"}
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [user("pay")]}, cfg)
    assert counts["charge"] == 1  # the first model step passed, the tools ran, the second model step fired

    seen = []
    with pytest.raises(FailpointError):
        async for chunk in app.astream({"messages": [user("pay")]}, {"thread_id": make_thread(),
                                                                      "failpoints": "mid_stream:tools=raise"}):
            seen.append(chunk)
    assert any(c.message is not None and c.message.text() == "charged" for c in seen)
    # mid_stream never fires on a non-streamed run
    await app.ainvoke({"messages": [user("pay")]}, {"thread_id": make_thread(), "failpoints": "mid_stream=raise"})


@pytest.mark.asyncio
async def test_bad_failpoint_specs_are_rejected(make_thread) -> None:
    counts: dict[str, int] = {}
    app = _app(None, counts)
    for bad in ["nowhere=kill", "after_tool=explode", "after_tool@0=raise", 42]:
        with pytest.raises(ValueError):
            await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread(), "failpoints": bad})
    assert counts == {}


@pytest.mark.parametrize(("spec", "charges"), [("after_tool:charge_card=kill", 2), ("after_record:charge_card=kill", 1)])
def test_kill_failpoints_in_a_child_process(tmp_path: Path, spec: str, charges: int) -> None:
    """The crash window, exactly: killed after charge_card returned but before its record, the
    charge runs again on resume (at-least-once); killed after the record, it does not."""
    db, effects = tmp_path / "agent.db", tmp_path / "effects.jsonl"
    env = dict(os.environ, SUPPORT_EFFECTS=str(effects), TENXGRAPH_FAILPOINTS=spec)
    first = subprocess.run([sys.executable, str(EXAMPLE), "--run", "--db", str(db)], env=env,
                           capture_output=True, timeout=60)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()
    import sqlite3

    with sqlite3.connect(db) as c:
        recorded = {json.loads(k)[1] for (k,) in c.execute("SELECT tool_call_id FROM tool_executions WHERE 1=1 AND json_extract(result, '$.__kind__') IS NOT 'started'")}
    env.pop("TENXGRAPH_FAILPOINTS")
    resumed = subprocess.run([sys.executable, str(EXAMPLE), "--resume", "--db", str(db)], env=env,
                             capture_output=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr.decode()
    done = [json.loads(x)["tool"] for x in effects.read_text().splitlines() if json.loads(x)["phase"] == "done"]
    assert done.count("charge_card") == charges, done
    # Every call whose ledger row committed before the kill ran exactly once; the others at most
    # twice (they returned, but their record was still in flight when the process died).
    for call_id, tool in [("call_1", "lookup_order"), ("call_2", "charge_card"), ("call_3", "send_receipt")]:
        assert done.count(tool) == 1 if call_id in recorded else 1 <= done.count(tool) <= 2, (tool, done, recorded)
    assert ("call_2" in recorded) is (charges == 1)
