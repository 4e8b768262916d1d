"""A turn of ours run with ``durable_checkpoint_every_step=False`` and SIGKILLed inside its tool
node once ``charge``'s ledger row committed (red-team, session 43).

Nothing of the turn but its input is committed: the model's message with the calls is not. The
run that takes it over (``arecover()``, or ``{}``, with the default, durable configuration) runs
the model again, and a model that derives its ids (here: from the thread; a cached response does
the same) makes the same message. A tool node skips the ledger lookup for a message a node of its
own run made; that skip fired ``charge`` a second time. A run that takes over an unfinished one
now always looks up: ``charge`` is answered from the ledger, ``email`` runs once.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tenxgraph.storage.checkpointer import PgCheckpointer
from tests_py.crash_agents import legacy_tool_agent as agent
from tests_py.real_10xgraph_writer import USER, Writer

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]


@pytest.mark.parametrize("how", ["arecover", "ainvoke"])
async def test_a_nondurable_turn_killed_after_a_recorded_tool_is_not_charged_again(
        tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    monkeypatch.setenv(agent.AGENT_DIR_ENV, str(tmp_path))
    w = Writer(sys.executable, tenx_postgres, pg_dsn, tenx_redis.url, tmp_path)  # tenxgraph writes
    thread = f"nd-{uuid.uuid4().hex[:10]}"
    w.run_to_completion(thread)
    left = w.crash_in_tool_node(thread, nondurable=True, turn=2, ours=True)
    assert [s["meta"]["status"] for s in left["states"]][-1] == "running"
    assert left["states"][-1]["meta"]["current_node"] != "tools", "the nondurable turn committed a step"
    before = [e["effect"] for e in w.effects()]
    # (The two tools of a node run concurrently: either may record first.)
    assert (before[0], sorted(before[1:3]), before[3:]) == ("model", ["charge", "email"], ["model", "model", "charge"])

    monkeypatch.setenv(agent.TURN_ENV, "2")
    (tmp_path / "email.release").write_text("go")
    cp = PgCheckpointer(pg_dsn, redis_url=tenx_redis.url)
    try:
        app = agent.build(cp)
        cfg = {"thread_id": thread, "user_id": USER}
        if how == "arecover":
            # The killed run's lease lapses after its ttl: until then the pass skips the thread.
            for _ in range(300):
                report = await app.arecover()
                assert report.failed == []
                if report.resumed:
                    break
                await asyncio.sleep(0.1)
            assert [(r.thread_id, r.status) for r in report.resumed] == [(thread, "completed")]
        else:
            await app.ainvoke({}, config=cfg)  # waits for the lease (on_busy="wait")
        after = [e["effect"] for e in w.effects()][len(before):]
        assert after == ["model", "email", "model"], f"charge fired again: {after}"
        state = await cp.aget_state(cfg)
        assert state.execution_meta.status.value == "completed"
        assert [m.role for m in state.context][-5:] == ["user", "assistant", "tool", "tool", "assistant"]
    finally:
        await cp.arelease()


async def test_a_takeover_that_failed_in_the_model_leaves_the_retry_looking_up(
        tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The takeover fails in the model (a provider error) and commits ``error`` without the
    model's message; the retry loaded ``error``, not ``running``, skipped the lookup and charged
    again (red-team, session 43, pass 2)."""
    monkeypatch.setenv(agent.AGENT_DIR_ENV, str(tmp_path))
    w = Writer(sys.executable, tenx_postgres, pg_dsn, tenx_redis.url, tmp_path)
    thread = f"ndf-{uuid.uuid4().hex[:10]}"
    w.run_to_completion(thread)
    w.crash_in_tool_node(thread, nondurable=True, turn=2, ours=True)
    before = [e["effect"] for e in w.effects()]
    monkeypatch.setenv(agent.TURN_ENV, "2")
    (tmp_path / "email.release").write_text("go")
    (tmp_path / "model.fail").write_text("503")
    cp = PgCheckpointer(pg_dsn, redis_url=tenx_redis.url)
    try:
        app = agent.build(cp)
        cfg = {"thread_id": thread, "user_id": USER}
        with pytest.raises(Exception, match="503"):
            await app.ainvoke({}, config=cfg)
        assert (await cp.aget_state(cfg)).execution_meta.status.value == "error"
        await app.ainvoke({}, config=cfg)
        after = [e["effect"] for e in w.effects()][len(before):]
        assert after == ["model", "email", "model"], f"charge fired again: {after}"
    finally:
        await cp.arelease()


async def test_an_approval_killed_mid_tool_then_asked_again_does_not_charge_twice(
        tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``interrupt_before=["model"]``: the reviewer's nondurable ``{}`` runs the model and
    ``charge`` and is killed in ``email``. The takeover pauses at the gate again (the row says
    ``interrupted_before``), and the second approval made the same message, skipped the lookup
    and charged again (red-team, session 43, pass 2)."""
    monkeypatch.setenv(agent.AGENT_DIR_ENV, str(tmp_path))
    w = Writer(sys.executable, tenx_postgres, pg_dsn, tenx_redis.url, tmp_path)
    thread = f"ndi-{uuid.uuid4().hex[:10]}"
    assert w.run_to_completion(thread, INTERRUPT_BEFORE="model")["status"] == "interrupted_before"
    w.crash_in_tool_node(thread, nondurable=True, mode="resume", ours=True, INTERRUPT_BEFORE="model")
    before = [e["effect"] for e in w.effects()]
    assert before == ["model", "charge"], before
    (tmp_path / "email.release").write_text("go")
    cp = PgCheckpointer(pg_dsn, redis_url=tenx_redis.url)
    try:
        app = agent.build(cp, interrupt_before=["model"])
        cfg = {"thread_id": thread, "user_id": USER}
        statuses = []
        for _ in range(4):  # the takeover, then an approval at each gate, until the turn ends
            await app.ainvoke({}, config=cfg)
            statuses.append((await cp.aget_state(cfg)).execution_meta.status.value)
            if statuses[-1] == "completed":
                break
        after = [e["effect"] for e in w.effects()][len(before):]
        assert after == ["model", "email", "model"], f"charge fired again: {after}"
        assert (await cp.aget_state(cfg)).execution_meta.status.value == "completed"
    finally:
        await cp.arelease()
