"""Red team (session 9): SIGKILL at random moments (not at failpoints) of a two-round tool turn
(two async tools in parallel, then a sync tool that runs in a thread; every tool sleeps on both
sides of its side effect, so kills land inside tools as well as between commits), on SQLite and
PostgreSQL, resumed in fresh processes (themselves killed now and then) until the turn
completes. The per-kill checks are tests_py/redteam/rounds.py's (a call whose ledger row
committed never runs again; every extra run is a kill that caught the call between its effect
and its ledger row; the thread ends with the uninterrupted run's roles and last text, unique
ids). Added here: every state version of every thread, each exactly once and without gaps.

Seeded (``TENXGRAPH_REDTEAM_SEED``), ``TENXGRAPH_REDTEAM_ROUNDS`` rounds per backend (default 2).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tenxgraph.testing import EffectCounter
from tests_py.redteam.rounds import Call, play, reader

SEED = int(os.environ.get("TENXGRAPH_REDTEAM_SEED", "20261202"))
ROUNDS = int(os.environ.get("TENXGRAPH_REDTEAM_ROUNDS", "2"))
CALLS = [Call("call_1", "charge_card", False, "charged 500 for A1"),
         Call("call_2", "send_receipt", False, "receipt for A1 sent"),
         Call("call_3", "audit_log", False, "logged A1")]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    # A database of this test's own either way: the version check reads every thread of it.
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else str(tmp_path / "kills.db")


async def _versions(db: str, prefix: str) -> dict[str, list[int]]:
    cp = reader(db)
    try:
        out = {}
        for t in await cp.alist_threads({}, limit=10_000):
            tid = str(t.thread_id)
            if tid.startswith(prefix):
                out[tid] = [v for v, _, _ in await cp._native.state_versions(tid, str(t.user_id))]
        return out
    finally:
        await cp.arelease()


def test_random_kills_of_a_two_round_tool_turn(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    kills = play(target="tests_py.kit_agents.slow_support:build", db=db, workdir=tmp_path, env={},
                 text="Charge A1", calls=CALLS, counts=effects.counts, reset=effects.clear, rounds=ROUNDS,
                 seed=SEED + db.startswith("postgres"))
    assert kills >= ROUNDS
    print(f"\n{'postgres' if db.startswith('postgres') else 'sqlite'}: {ROUNDS} rounds, {kills} kills, effects {effects.counts()}")
    versions = asyncio.run(_versions(db, "round-"))
    assert versions
    for tid, vs in versions.items():
        # Kept rows are the newest ones (state_history_limit): consecutive, each once.
        assert sorted(vs) == list(range(min(vs), max(vs) + 1)) and len(vs) == len(set(vs)), (tid, vs)
