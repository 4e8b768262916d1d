"""``tenxgraph recover``, run as a subprocess against a real SQLite file and a real throwaway
PostgreSQL: the three ways to name the graph (a factory(checkpointer) with a store option, a
compiled graph, a factory(), the graph of 10xgraph.json), the report as a table and as JSON,
exit 1 when a resume fails, and every usage error with its exit code."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import FailpointError
from tenxgraph.testing import EffectCounter
from tests_py.crash_agents.lease_agent import open_db
from tests_py.crash_agents.recovery_agent import build

ROOT = Path(__file__).resolve().parent.parent
FACTORY = "tests_py.crash_agents.recovery_agent:build"


def cli(*args: str, cwd: Path, effects: EffectCounter) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TENXGRAPH_DSN"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TENXGRAPH_EFFECTS"] = str(effects.path)
    return subprocess.run([sys.executable, "-m", "tenxgraph", "recover", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


def _die(db: str, threads: list[str]) -> None:
    """Each thread's run dies after its model step committed: running at the tool node."""
    app = build(open_db(db))

    async def go() -> None:
        for t in threads:
            with pytest.raises(FailpointError):
                await app.ainvoke({"messages": [Message.text_message(f"charge order {t[-1]}")]},
                                  {"thread_id": t, "failpoints": "after_step:model=raise"})
        await app.aclose()

    asyncio.run(go())


def _status(db: str, thread: str) -> str:
    return str(open_db(db).get_state({"thread_id": thread}).execution_meta.status)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, sqlite_db: str) -> tuple[str, list[str]]:
    if request.param == "sqlite":
        return sqlite_db, ["--sqlite", sqlite_db]
    dsn = request.getfixturevalue("pg_dsn")
    return dsn, ["--dsn", dsn]


def test_recover_with_a_factory_and_a_store(store: tuple[str, list[str]], effects: EffectCounter,
                                            tmp_path: Path) -> None:
    db, opts = store
    _die(db, ["cli-1", "cli-2"])
    r = cli("--graph", FACTORY, *opts, "--json", cwd=ROOT, effects=effects)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert sorted((x["thread_id"], x["status"]) for x in report["resumed"]) == [("cli-1", "completed"),
                                                                                ("cli-2", "completed")]
    assert report["skipped"] == [] and report["failed"] == []
    assert {t: _status(db, t) for t in ("cli-1", "cli-2")} == {"cli-1": "completed", "cli-2": "completed"}
    assert effects.counts() == {"lookup_order": 2, "charge_card": 2, "send_receipt": 2}
    again = cli("--graph", FACTORY, *opts, cwd=ROOT, effects=effects)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "0 resumed, 0 skipped, 0 failed"


def test_a_failed_resume_exits_1_and_is_listed(sqlite_db: str, effects: EffectCounter) -> None:
    _die(sqlite_db, ["fail-1"])
    r = cli("--graph", "tests_py.crash_agents.recovery_agent:build_broken", "--sqlite", sqlite_db, cwd=ROOT,
            effects=effects)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stdout.strip().splitlines()
    assert lines[0].split() == ["THREAD", "USER", "OUTCOME", "STATUS", "DETAIL"]
    assert lines[1].split()[:4] == ["fail-1", "anonymous", "failed", "error"]
    assert "NodeError: [NODE_001] Error in node 'tools'" in lines[1]
    assert lines[-1] == "0 resumed, 0 skipped, 1 failed"
    # The whole error in the JSON report; the thread failed for good, so the next pass is empty.
    _die(sqlite_db, ["fail-2"])
    j = cli("--graph", "tests_py.crash_agents.recovery_agent:build_broken", "--sqlite", sqlite_db, "--json",
            cwd=ROOT, effects=effects)
    assert j.returncode == 1, j.stderr
    failed = json.loads(j.stdout)["failed"]
    assert [(f["thread_id"], f["error_code"], f["status"]) for f in failed] == [("fail-2", "NODE_001", "error")]
    assert "the payment provider is down" in failed[0]["error"]


def _app_module(tmp_path: Path, db: str) -> None:
    (tmp_path / "app_mod.py").write_text(
        "from tenxgraph.storage.checkpointer import SqliteCheckpointer\n"
        "from tests_py.crash_agents.recovery_agent import build\n"
        f"app = build(SqliteCheckpointer({db!r}))\n"
        "def make():\n    return app\n"
        "async def make_async():\n    return app\n"
        "not_a_graph = 42\n"
        "def make_own(checkpointer):\n    return app\n"
    )


@pytest.mark.parametrize("how", ["compiled", "factory", "async-factory", "config"])
def test_recover_with_the_graph_of_a_module_or_10xgraph_json(how: str, sqlite_db: str, effects: EffectCounter,
                                                             tmp_path: Path) -> None:
    _app_module(tmp_path, sqlite_db)
    _die(sqlite_db, ["mod-1"])
    args = {"compiled": ["--graph", "app_mod:app"], "factory": ["--graph", "app_mod:make"],
            "async-factory": ["--graph", "app_mod:make_async"], "config": []}[how]
    if how == "config":
        (tmp_path / "10xgraph.json").write_text(json.dumps({"graph": "app_mod:app"}))
    r = cli(*args, "--json", cwd=tmp_path, effects=effects)
    assert r.returncode == 0, r.stderr
    assert [(x["thread_id"], x["status"]) for x in json.loads(r.stdout)["resumed"]] == [("mod-1", "completed")]
    assert _status(sqlite_db, "mod-1") == "completed"


USAGE = [
    ([], "recover needs the graph to resume threads with"),
    (["--graph", "no colon"], "--graph must be an import path like 'myapp.agent:app'"),
    (["--graph", "no_such_module_xyz:app"], "importing 'no_such_module_xyz' failed: ModuleNotFoundError"),
    (["--graph", "app_mod:missing"], "module 'app_mod' has no attribute 'missing'"),
    (["--graph", "app_mod:not_a_graph"], "is a int, not a compiled graph or a factory"),
    (["--graph", FACTORY], "takes a checkpointer: give --sqlite, --dsn or --config"),
    (["--graph", "app_mod:app", "--sqlite", "{db}"], "is a compiled graph with its own checkpointer"),
    (["--graph", "app_mod:make", "--sqlite", "{db}"], "takes no checkpointer (it builds its own)"),
    # A factory of one argument that builds its own store (a path factory handed the checkpointer
    # did so): it recovered another database and said "0 resumed" (docs helper, session 41).
    (["--graph", "app_mod:make_own", "--sqlite", "{db}"], "does not use the checkpointer it was given"),
    (["--graph", "app_mod:app", "--concurrency", "0"], "expected a positive integer"),
    (["--graph", "app_mod:app", "--limit", "x"], "expected a positive integer"),
]


@pytest.mark.parametrize("args,message", USAGE, ids=[" ".join(a) or "no-graph" for a, _ in USAGE])
def test_usage_errors_exit_2_and_touch_nothing(args: list[str], message: str, sqlite_db: str,
                                               effects: EffectCounter, tmp_path: Path) -> None:
    _app_module(tmp_path, sqlite_db)
    _die(sqlite_db, ["u-1"])
    r = cli(*[a.replace("{db}", sqlite_db) for a in args], cwd=tmp_path, effects=effects)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert _status(sqlite_db, "u-1") == "running"
    assert effects.counts() == {}


def test_a_bad_10xgraph_json_exits_5(sqlite_db: str, effects: EffectCounter, tmp_path: Path) -> None:
    (tmp_path / "10xgraph.json").write_text(json.dumps({"graph": "nowhere_xyz:app"}))
    r = cli(cwd=tmp_path, effects=effects)
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "[CONFIG_004]" in r.stderr and "nowhere_xyz" in r.stderr
