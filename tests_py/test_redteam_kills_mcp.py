"""SIGKILL at random moments of a turn whose ToolNode calls an MCP server (tests_py/mcp_kit), on
SQLite and PostgreSQL, resumed until it completes; the checks are tests_py/redteam/rounds.py's,
with the server's own count of the calls that reached it. ``charge_card`` is idempotent here
(the default); tests_py/test_redteam_kills_mcp_at_most_once.py classes it ``at_most_once``.
Rounds: 2 per backend (a child imports fastmcp: seconds each), ``TENXGRAPH_REDTEAM_ROUNDS`` for
more."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests_py.redteam.mcp_server import McpServer, mcp_server
from tests_py.redteam.rounds import Call, play

SEED = int(os.environ.get("TENXGRAPH_REDTEAM_SEED", "20261201"))
ROUNDS = int(os.environ.get("TENXGRAPH_REDTEAM_ROUNDS", "2"))
CHARGED = [{"type": "text", "text": "charged 5", "annotations": None, "meta": None}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServer]:
    with mcp_server(tmp_path_factory.mktemp("mcp")) as s:
        yield s


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else str(tmp_path / "kills.db")


def kill_rounds(db: str, server: McpServer, tmp_path: Path, at_most_once: bool) -> None:
    """The rounds for one backend and one class of ``charge_card``."""
    target = "tests_py.redteam.kill_agents:build_mcp" + ("_at_most_once" if at_most_once else "")
    kills = play(target=target, db=db, workdir=tmp_path, env={"MCP_URL": server.url}, text="pay",
                 calls=[Call("call_1", "charge_card", at_most_once, CHARGED)], counts=server.counts,
                 reset=server.reset, rounds=ROUNDS, exact=False, seed=SEED + 2 * db.startswith("postgres") + at_most_once)
    assert kills >= ROUNDS  # every round had one (play() retries a round its kill missed)


def test_random_kills_of_an_mcp_turn(db: str, server: McpServer, tmp_path: Path) -> None:
    kill_rounds(db, server, tmp_path, at_most_once=False)
