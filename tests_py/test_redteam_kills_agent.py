"""SIGKILL at random moments (not at failpoints) of a prebuilt ReactAgent's turn, on SQLite and
PostgreSQL, resumed in fresh processes (themselves killed at random now and then) until the turn
completes; the checks are tests_py/redteam/rounds.py's. The model is a stateless OpenAI stand-in
(the same request always gets the same answer), so a model call a kill repeated shifts nothing.
Seeded (``TENXGRAPH_REDTEAM_SEED``), 2 rounds per backend (``TENXGRAPH_REDTEAM_ROUNDS``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tenxgraph.testing import EffectCounter
from tests_py.redteam.kill_agents import AnsweringStandIn
from tests_py.redteam.rounds import Call, play

SEED = int(os.environ.get("TENXGRAPH_REDTEAM_SEED", "20261201"))
ROUNDS = int(os.environ.get("TENXGRAPH_REDTEAM_ROUNDS", "2"))
CALLS = [Call("call_1", "charge_card", False, "Charged $5.0 for A1."),
         Call("call_2", "send_receipt", True, "Receipt sent for A1.")]


@pytest.fixture(scope="module")
def llm():
    with AnsweringStandIn() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else str(tmp_path / "kills.db")


def test_random_kills_of_a_prebuilt_react_agent(db: str, llm: AnsweringStandIn, tmp_path: Path,
                                                effects: EffectCounter) -> None:
    kills = play(target="tests_py.redteam.kill_agents:build_react", db=db, workdir=tmp_path, env=dict(llm.env),
                 text="Charge A1", calls=CALLS, counts=effects.counts, reset=effects.clear, rounds=ROUNDS,
                 seed=SEED + db.startswith("postgres"))
    assert kills >= ROUNDS  # every round had one (play() retries a round its kill missed)
