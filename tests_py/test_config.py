"""``tenxgraph.load_config()``: 10xgraph.json as 10xGraph writes it, and a clear ConfigError
(file, key, problem, code) for each thing that can be wrong."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tenxgraph
from tenxgraph.config import ConfigError, load_config
from tenxgraph.core.graph.compiled_graph import CompiledGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer


def project(tmp_path: Path, config: Any, *, agent_code: str | None = None, env: str | None = None) -> Path:
    """A project dir with a uniquely named package (modules are cached per process)."""
    pkg = f"proj_{uuid.uuid4().hex[:8]}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "agent.py").write_text(agent_code if agent_code is not None else f"""
import os
from tenxgraph import StateGraph, AgentState, START, END
from tenxgraph.storage.checkpointer import SqliteCheckpointer

checkpointer = SqliteCheckpointer(os.environ["AGENT_DB"])

def hello(state):
    return "hi"

g = StateGraph(AgentState)
g.add_node("hello", hello)
g.add_edge(START, "hello")
g.add_edge("hello", END)
app = g.compile(checkpointer=checkpointer)
not_a_checkpointer = 42
""")
    if env is not None:
        (tmp_path / ".env").write_text(env)
    text = json.dumps(config).replace("PKG", pkg) if not isinstance(config, str) else config
    path = tmp_path / "10xgraph.json"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv("AGENT_DB", raising=False)
    monkeypatch.delenv("FROM_DOTENV", raising=False)
    before = set(os.environ)
    yield
    # load_env() sets variables in os.environ itself (setdefault), which monkeypatch does not
    # undo: left behind, AGENT_DB pointed later tests' CLI children (test_cli.py inherits
    # os.environ) at this test's database.
    for key in set(os.environ) - before:
        del os.environ[key]


def test_graph_checkpointer_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "agent.db"
    path = project(tmp_path, {"graph": "PKG.agent:app", "checkpointer": "PKG.agent:checkpointer", "env": ".env"},
                   env=f"# comment\nexport AGENT_DB='{db}'\nFROM_DOTENV=\"yes\" \nEMPTY=\n")
    cfg = tenxgraph.load_config(path)
    assert cfg.graph.endswith(".agent:app") and cfg.env == ".env" and cfg.root == tmp_path.resolve()
    cp = cfg.load_checkpointer()
    assert isinstance(cp, SqliteCheckpointer) and cp.db_path == str(db)
    assert os.environ["FROM_DOTENV"] == "yes"
    app = cfg.load_graph()
    assert isinstance(app, CompiledGraph) and app._checkpointer is cp


def test_agent_key_of_10xgraph_and_its_other_keys(tmp_path: Path) -> None:
    path = project(tmp_path, {"agent": "PKG.agent:app", "env": ".env", "auth": "jwt", "redis": "redis://x",
                              "rate_limit": {"enabled": True}, "store": None}, env=f"AGENT_DB={tmp_path / 'a.db'}\n")
    cfg = load_config(path)
    assert cfg.graph is not None and cfg.graph.endswith(":app") and cfg.passthrough["auth"] == "jwt"
    # No checkpointer key: the graph's own checkpointer.
    assert isinstance(cfg.load_checkpointer(), SqliteCheckpointer)


def test_env_does_not_override_variables_already_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_DB", str(tmp_path / "from-env.db"))
    path = project(tmp_path, {"checkpointer": "PKG.agent:checkpointer", "env": ".env"},
                   env=f"AGENT_DB={tmp_path / 'from-file.db'}\n")
    assert load_config(path).load_checkpointer().db_path == str(tmp_path / "from-env.db")


def test_default_path_is_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project(tmp_path, {"checkpointer": "PKG.agent:checkpointer"})
    monkeypatch.chdir(tmp_path)
    assert load_config().path == (tmp_path / "10xgraph.json").resolve()


def err(path: Path | None, call: Any = None) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        cfg = load_config(path)
        if call is not None:
            call(cfg)
    return ei.value


@pytest.mark.parametrize(("config", "key", "code", "problem"), [
    ("{not json", None, "CONFIG_002", "not valid JSON: Expecting property name enclosed in double quotes at line 1, column 2"),
    ("[1, 2]", None, "CONFIG_002", "must be a JSON object, got list"),
    ({"graph": 42}, "graph", "CONFIG_003", "must be a non-empty string, got 42"),
    ({"checkpointer": ""}, "checkpointer", "CONFIG_003", "must be a non-empty string"),
    ({"env": ["a"]}, "env", "CONFIG_003", 'must be a non-empty string, got ["a"]'),
    ({"graph": "graph/agent.py"}, "graph", "CONFIG_003", "is not an import path of the form 'module.path:attribute'"),
    ({"checkpointer": "PKG.agent"}, "checkpointer", "CONFIG_003", "is not an import path"),
    ({"graph": "a:app", "agent": "b:app"}, "agent", "CONFIG_003", "differs from 'graph'"),
    ({"checkpionter": "a:b"}, "checkpionter", "CONFIG_003", "unknown key; did you mean 'checkpointer'?"),
])
def test_file_problems(tmp_path: Path, config: Any, key: str | None, code: str, problem: str) -> None:
    path = project(tmp_path, config)
    e = err(path)
    assert (e.key, e.error_code, e.path) == (key, code, str(path))
    assert problem in e.problem
    assert str(path) in str(e) and (key is None or f"key {key!r}" in str(e)) and code in str(e)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    e = err(tmp_path / "nope.json")
    assert (e.error_code, e.problem) == ("CONFIG_001", "file not found") and "nope.json" in str(e)
    (tmp_path / "dir.json").mkdir()
    assert err(tmp_path / "dir.json").error_code == "CONFIG_001"
    (tmp_path / "latin1.json").write_bytes(b'{"graph": "caf\xe9:x"}')
    assert err(tmp_path / "latin1.json").error_code == "CONFIG_002"


@pytest.mark.parametrize(("config", "agent_code", "key", "code", "problem"), [
    ({"checkpointer": "missing_pkg_xyz.agent:cp"}, None, "checkpointer", "CONFIG_004", "module 'missing_pkg_xyz.agent' not found"),
    ({"checkpointer": "PKG.agent:nope"}, None, "checkpointer", "CONFIG_004", "has no attribute 'nope'"),
    ({"checkpointer": "PKG.agent:cp"}, "import not_installed_dep_xyz\n", "checkpointer", "CONFIG_004",
     "No module named 'not_installed_dep_xyz'"),
    ({"checkpointer": "PKG.agent:cp"}, "raise RuntimeError('boom at import')\n", "checkpointer", "CONFIG_004",
     "RuntimeError: boom at import"),
    ({"checkpointer": "PKG.agent:not_a_checkpointer"}, None, "checkpointer", "CONFIG_005", "is a int, not a tenxgraph checkpointer"),
    ({"graph": "PKG.agent:checkpointer"}, None, "graph", "CONFIG_005", "not a compiled graph"),
])
def test_import_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Any, agent_code: str | None,
                         key: str, code: str, problem: str) -> None:
    monkeypatch.setenv("AGENT_DB", str(tmp_path / "a.db"))
    path = project(tmp_path, config, agent_code=agent_code)
    loader = (lambda c: c.load_graph()) if "graph" in config else (lambda c: c.load_checkpointer())
    e = err(path, loader)
    assert (e.key, e.error_code) == (key, code) and problem in e.problem, str(e)


def test_nothing_to_load(tmp_path: Path) -> None:
    path = project(tmp_path, {"env": ".env"}, env="")
    assert err(path, lambda c: c.load_checkpointer()).problem == "neither 'checkpointer' nor 'graph' is set"
    assert err(path, lambda c: c.load_graph()).key == "graph"


@pytest.mark.parametrize(("env", "problem"), [
    (None, "does not exist"),
    ("GOOD=1\nthis line is wrong\n", ".env:2: expected NAME=value (the line is not shown"),
    ("1BAD=x\n", ".env:1: expected NAME=value"),
    ("A=1\nB=x\0y\n", ".env:2: B holds a NUL character"),
])
def test_env_file_problems(tmp_path: Path, env: str | None, problem: str) -> None:
    path = project(tmp_path, {"checkpointer": "PKG.agent:checkpointer", "env": ".env"}, env=env)
    e = err(path, lambda c: c.load_checkpointer())
    assert (e.key, e.error_code) == ("env", "CONFIG_006") and problem in e.problem, str(e)


def test_unknown_key_that_is_no_typo_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = project(tmp_path, {"checkpointer": "PKG.agent:checkpointer", "dashboard": {"port": 1}})
    with caplog.at_level(logging.WARNING, logger="tenxgraph.config"):
        cfg = load_config(path)
    assert cfg.checkpointer is not None
    assert any("'dashboard' is not used by tenxgraph" in r.getMessage() for r in caplog.records)


def test_an_env_line_is_never_echoed_and_a_bad_file_applies_nothing(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """(session 31) A malformed line (``KEY: sk-...``, or the first line of a file that is not an
    env file at all) was echoed whole in the error, which the CLI prints; a NUL in a value raised
    a bare ValueError after the lines before it were already in os.environ."""
    secret = "sk-live-Sekr3tKEY0123456789"
    monkeypatch.delenv("RT_FIRST", raising=False)
    path = project(tmp_path, {"checkpointer": "PKG.agent:checkpointer", "env": ".env"},
                   env=f"RT_FIRST=1\nOPENAI_API_KEY: {secret}\n")
    e = err(path, lambda c: c.load_env())
    assert e.error_code == "CONFIG_006" and secret not in str(e) and secret not in repr(e.args)
    (path.parent / ".env").write_text("RT_FIRST=1\nB=x\0y\n")
    e = err(path, lambda c: c.load_env())
    assert e.error_code == "CONFIG_006" and "RT_FIRST" not in os.environ


@pytest.mark.parametrize(("config", "key", "code"), [
    ('{"graph": "a:b\\n"}', "graph", "CONFIG_003"),                 # "$" matched before a trailing newline
    ('{"env": "x\\u0000y"}', "env", "CONFIG_003"),                  # a NUL in a path: a bare ValueError
    ('{"store": ' + "[" * 100000 + "]" * 100000 + "}", None, "CONFIG_002"),  # a bare RecursionError
])
def test_malformed_values_are_config_errors(tmp_path: Path, config: str, key: str | None, code: str) -> None:
    path = tmp_path / "10xgraph.json"
    path.write_text(config)
    with pytest.raises(ConfigError) as e:
        load_config(path).load_env()
    assert (e.value.key, e.value.error_code) == (key, code), str(e.value)


def test_a_module_that_exits_at_import_is_a_config_error(tmp_path: Path) -> None:
    path = project(tmp_path, {"checkpointer": "PKG.agent:checkpointer"}, agent_code="raise SystemExit(0)\n")
    e = err(path, lambda c: c.load_checkpointer())
    assert (e.key, e.error_code) == ("checkpointer", "CONFIG_004") and "SystemExit" in e.problem, str(e)
