"""SIGKILL at random moments (not at failpoints) of a prebuilt ReactAgent's turn, on SQLite and
PostgreSQL; resumed in fresh processes (which may be killed too) until the turn completes.

Seeded (``TENXGRAPH_REDTEAM_SEED``), a fixed number of rounds per backend. The delay is drawn
over the length of an uninterrupted run measured first in the same way. Checked per round:

- ``charge_card`` (idempotent) took effect exactly once, plus once for every kill that caught it
  after it took effect and before its ledger row committed (seen from the parent right after the
  kill: the effect is there, the ledger has no result);
- ``send_receipt`` (at_most_once) never took effect twice; its tool message is its result only
  when it took effect, and "outcome unknown" (TOOL_OUTCOME_UNKNOWN) when a kill cut it off;
- the turn completes (no resume hangs: each child has a generous timeout) with the uninterrupted
  run's roles and final answer, and unique message ids.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import pytest

from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
from tenxgraph.testing import EffectCounter
from tests_py.redteam.kill_agents import FINAL, AnsweringStandIn
from tests_py.redteam.killer import run_once

TARGET = "tests_py.redteam.kill_agents:build_react"
ROUNDS = 4
MAX_KILLED_RESUMES = 2
SEED = int(os.environ.get("TENXGRAPH_REDTEAM_SEED", "20261201"))


@pytest.fixture(scope="module")
def llm():
    with AnsweringStandIn() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else str(tmp_path / "kills.db")


def _reader(db: str) -> Any:
    return PgCheckpointer(db) if db.startswith("postgres") else SqliteCheckpointer(db)


async def _ledger(cp: Any, tid: str) -> dict[str, str | None]:
    """call id -> ledger status, for the tool calls of the thread's last committed assistant
    message that made some ({} before there is one)."""
    state = await cp.aget_state({"thread_id": tid})
    if state is None:
        return {}
    issuing = next((m for m in reversed(state.context) if m.role == "assistant" and m.tools_calls), None)
    if issuing is None:
        return {}
    return {c["id"]: await cp.aget_tool_status({"thread_id": tid}, f"{issuing.message_id}:{c['id']}")
            for c in issuing.tools_calls}


def _tool_outputs(dicts: list[dict[str, Any]]) -> dict[str, tuple[Any, bool]]:
    out = {}
    for m in dicts:
        for b in m.get("content", []):
            if b.get("type") == "tool_result":
                out[b["call_id"]] = (b.get("output"), bool(b.get("is_error")))
    return out


def test_random_kills_of_a_prebuilt_agent(db: str, llm: AnsweringStandIn, tmp_path: Path,
                                          effects: EffectCounter) -> None:
    env = dict(llm.env)
    reader = _reader(db)
    golden = run_once(tmp_path / "golden", "golden", TARGET, "golden", db, text="Charge A1", kill_after=None, env=env)
    assert golden.result and golden.result["outcome"] == "completed", golden.stderr[-3000:]
    span = max(float(golden.result["finished"]) - float(golden.result["started"]), 0.05)
    golden_roles = [m["role"] for m in golden.result["message_dicts"]]
    assert golden.result["messages"][-1] == FINAL
    rng = random.Random(SEED + (0 if db.startswith("/") else 1))
    kills = 0
    for r in range(ROUNDS):
        effects.clear()
        tid = f"round-{r}"
        windows = 0
        unknown_receipt = False
        text: str | None = "Charge A1"
        attempts = 0
        while True:
            killed_so_far = attempts
            kill = None if killed_so_far > MAX_KILLED_RESUMES or (attempts and rng.random() > 0.35) \
                else rng.uniform(0, span * 1.3)
            before = effects.counts()
            out = run_once(tmp_path / tid, f"a{attempts}", TARGET, tid, db, text=text, kill_after=kill, env=env)
            attempts += 1
            if not out.killed:
                assert out.result is not None, out.stderr[-3000:]
                if out.result["outcome"] == "completed":
                    break
                # A fresh turn that lost its input commit to the kill is simply sent again.
                raise AssertionError(f"round {r}: the run ended in {out.result.get('exception')}\n{out.stderr[-3000:]}")
            kills += 1
            after = effects.counts()
            status = asyncio.run(_ledger(reader, tid))
            state = asyncio.run(reader.aget_state({"thread_id": tid}))
            if state is None:
                continue  # killed before its input commit: the turn is sent again, as a client would
            text = None  # from now on the thread holds the turn: resume it
            if after.get("charge_card", 0) > before.get("charge_card", 0) and status.get("call_1") != "completed":
                windows += 1
            if status.get("call_2") == "started":
                unknown_receipt = True
            assert effects.count("send_receipt") <= 1, f"round {r}: the at-most-once receipt was sent twice"
        ctx = f"round {r} (seed {SEED}): effects {effects.counts()}, windows {windows}"
        assert effects.count("charge_card") == 1 + windows, ctx
        assert effects.count("send_receipt") <= 1, ctx
        # The thread as stored (a resumed run's response holds only what that run produced).
        final = asyncio.run(reader.aget_state({"thread_id": tid}))
        dicts = [m.model_dump(mode="json") for m in final.context]
        assert [m["role"] for m in dicts] == golden_roles, ctx
        assert final.context[-1].text() == FINAL, ctx
        assert str(final.execution_meta.status).endswith("completed"), ctx
        ids = [m["message_id"] for m in dicts]
        assert len(ids) == len(set(ids)), ctx
        outputs = _tool_outputs(dicts)
        receipt, receipt_failed = outputs["call_2"]
        if receipt_failed:
            assert unknown_receipt and "TOOL_OUTCOME_UNKNOWN" in str(receipt), ctx
        else:
            assert receipt == "Receipt sent for A1." and effects.count("send_receipt") == 1, ctx
        assert outputs["call_1"] == ("Charged $5.0 for A1.", False), ctx
    asyncio.run(reader.arelease())
    print(f"{kills} kills in {ROUNDS} rounds")
    assert kills >= ROUNDS // 2, f"only {kills} kills landed in {ROUNDS} rounds: the delays miss the runs"
