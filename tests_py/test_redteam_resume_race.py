"""Red team (session 9): a run SIGKILLed mid-turn (after its ``charge_card`` result was recorded,
the lease still held by the dead process) is resumed by three processes at the same moment (a
file barrier, ``tenxgraph.testing.race``), under ``on_busy="reject"`` and ``"wait"``. Exactly one
run finishes the turn; under ``reject`` the others get ``ThreadBusyError`` ``STORAGE_BUSY_002``
or find the turn finished; under ``wait`` all complete. ``charge_card`` (recorded before the
kill) never runs again, the other calls at most once more (the kill's window), and the thread
holds the uninterrupted turn. SQLite and Postgres, 3 rounds each."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
from tenxgraph.testing import CrashKit, EffectCounter

T = "tests_py.kit_agents.support:build"
USER = {"messages": [{"role": "user", "content": [{"type": "text", "text": "charge order 4821"}]}]}
ROLES = ["user", "assistant", "tool", "tool", "tool", "assistant"]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "race.db") if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


@pytest.mark.parametrize("on_busy", ["reject", "wait"])
def test_three_processes_resume_a_crashed_turn_at_once(db: str, tmp_path: Path, effects: EffectCounter,
                                                       on_busy: str) -> None:
    kit = CrashKit(tmp_path / "kit", db=db, effects=effects)
    cp = PgCheckpointer(db) if db.startswith("postgresql://") else SqliteCheckpointer(db)
    for rnd in range(3):
        effects.clear()
        tid = f"resume-race-{on_busy}-{rnd}"
        assert kit.run_until_crash(T, tid, failpoints="after_record:charge_card=kill", input=USER).killed
        killed = effects.counts()
        results = kit.race(T, tid, inputs=[{}, {}, {}], workers=3,
                           config={"on_busy": on_busy, "busy_timeout": 30})
        outcomes = [(r.outcome, r.error_code) for r in results]
        assert ("completed", None) in outcomes, outcomes
        allowed = {("completed", None)} | ({("error", "STORAGE_BUSY_002")} if on_busy == "reject" else set())
        assert set(outcomes) <= allowed, outcomes
        counts = effects.counts()
        assert counts["charge_card"] == killed["charge_card"] == 1, (rnd, killed, counts)
        for name in ("lookup_order", "send_receipt"):
            assert 1 <= counts.get(name, 0) <= killed.get(name, 0) + 1, (rnd, killed, counts)
        state = asyncio.run(cp.aget_state({"thread_id": tid}))
        assert str(state.execution_meta.status).endswith("completed")
        assert [m.role for m in state.context] == ROLES, [m.role for m in state.context]
        ids = [m.message_id for m in state.context]
        assert len(ids) == len(set(ids))
