"""The ``tenxgraph`` command, run as a subprocess (``python -m tenxgraph``) against a real SQLite
file and a real throwaway PostgreSQL: every command with its table and ``--json`` output, exit
codes, unknown threads and calls, bad stores, and no password in any output."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import BaseCheckpointer, PgCheckpointer, SqliteCheckpointer
from tenxgraph.utils import interrupt
from tests_py.tool_graphs import call, tool_graph

BACKENDS = ["sqlite", "postgres"]


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, script: bool = False) -> Result:
    # AGENT_DB: the projects these tests write name their database in their own .env, which
    # loses to a variable already set (a leftover in this process must not choose it).
    base = {k: v for k, v in os.environ.items() if k not in ("TENXGRAPH_DSN", "AGENT_DB")}
    base.update(env or {})
    exe = [str(Path(sys.executable).parent / "tenxgraph")] if script else [sys.executable, "-m", "tenxgraph"]
    p = subprocess.run([*exe, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=base)
    return Result(p.returncode, p.stdout, p.stderr)


@dataclass
class Store:
    kind: str
    args: list[str]
    cp: BaseCheckpointer
    cwd: Path

    def run(self, *args: str, **kw: Any) -> Result:
        return cli(*args, *self.args, cwd=self.cwd, **kw)


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        path = tmp_path / "cli.db"
        cp: BaseCheckpointer = SqliteCheckpointer(path)
        cp.setup()  # the file the CLI reads: a checkpointer creates it on first use
        args = ["--sqlite", str(path)]
    else:
        dsn = request.getfixturevalue("pg_dsn")
        cp = PgCheckpointer(dsn)  # the application's default: user isolation on
        args = ["--dsn", dsn]
    yield Store(request.param, args, cp, tmp_path)
    asyncio.run(cp.arelease())


def user(text: str) -> Message:
    return Message.text_message(text)


def one_node(fn: Any, cp: BaseCheckpointer, name: str = "step") -> Any:
    g = StateGraph(AgentState)
    g.add_node(name, fn)
    g.add_edge(START, name)
    g.add_edge(name, END)
    return g.compile(checkpointer=cp)


async def _populate(cp: BaseCheckpointer) -> None:
    async def charge(amount: int) -> str:
        return f"charged {amount}"

    app = tool_graph(AgentState, [charge], [[call("c1", "charge", {"amount": 5}), call("c2", "charge", {"amount": 7})]],
                     checkpointer=cp)
    await app.ainvoke({"messages": [user("pay twice")]}, {"thread_id": "done-1", "user_id": "alice"})

    async def ask(state: AgentState) -> str:
        return str(interrupt({"amount": 42}, message="Refund $42?"))

    await one_node(ask, cp, "ask").ainvoke({"messages": [user("refund")]}, {"thread_id": "paused-1", "user_id": "bob"})

    async def crash(state: AgentState) -> str:
        raise RuntimeError("model unavailable")

    with pytest.raises(Exception):
        await one_node(crash, cp).ainvoke({"messages": [user("hi")]}, {"thread_id": "failed-1", "user_id": "alice"})


@pytest.fixture
def filled(store: Store) -> Store:
    asyncio.run(_populate(store.cp))
    return store


# -- threads list ----------------------------------------------------------------------------

def test_threads_list_table_and_json(filled: Store) -> None:
    r = filled.run("threads", "list")
    assert r.rc == 0, r.err
    header, *lines = r.out.strip().splitlines()
    assert header.split()[:3] == ["THREAD", "USER", "STATUS"]
    by_id = {line.split()[0]: line.split() for line in lines}
    assert set(by_id) == {"done-1", "paused-1", "failed-1"}
    assert by_id["done-1"][1:3] == ["alice", "completed"]
    assert by_id["paused-1"][2] == "interrupted_before" and by_id["failed-1"][2] == "error"

    rows = filled.run("--json", "threads", "list").json()
    assert {r["thread_id"]: (r["user_id"], r["status"], r["current_node"]) for r in rows} == {
        "done-1": ("alice", "completed", "model"),  # the last node that ran, as in 10xGraph
        "paused-1": ("bob", "interrupted_before", "ask"),
        "failed-1": ("alice", "error", "step"),
    }
    assert all(isinstance(r["version"], int) and r["updated_at"].endswith("Z") for r in rows)


def test_threads_list_filters(filled: Store) -> None:
    ids = lambda *a: sorted(r["thread_id"] for r in filled.run("threads", "list", "--json", *a).json())  # noqa: E731
    assert ids("--user", "alice") == ["done-1", "failed-1"]
    assert ids("--status", "interrupted_before") == ["paused-1"]
    assert ids("--status", "completed", "--user", "bob") == []
    assert ids("--since", "1h") == ["done-1", "failed-1", "paused-1"]
    assert ids("--since", "2999-01-01") == []
    assert len(ids("--limit", "2")) == 2
    shown = filled.run("threads", "list", "--status", "error", "--progress")
    assert shown.rc == 0 and "scanned 3 threads, 1 match" in shown.err
    bad = filled.run("threads", "list", "--status", "sleeping")
    assert bad.rc == 2 and "invalid choice" in bad.err
    bad = filled.run("threads", "list", "--since", "yesterday")
    assert bad.rc == 2 and "expected an age like 30m" in bad.err
    bad = filled.run("threads", "list", "--limit", "0")
    assert bad.rc == 2 and "positive integer" in bad.err


# -- threads show / messages -------------------------------------------------------------------

def test_threads_show(filled: Store) -> None:
    r = filled.run("threads", "show", "done-1")
    assert r.rc == 0, r.err
    fields = dict(line.split(None, 1) if "  " not in line else [s.strip() for s in line.split("  ", 1)]
                  for line in r.out.split("\n\n")[0].splitlines())
    assert fields["status"] == "completed" and fields["user"] == "alice" and fields["lease"] == "none"
    assert "versions (newest first):" in r.out

    d = filled.run("threads", "show", "done-1", "--json").json()
    assert (d["status"], d["current_node"], d["step"], d["lease"]) == ("completed", "model", 3, None)
    versions = [v["version"] for v in d["versions"]]
    assert versions == sorted(versions, reverse=True) and versions[0] == d["version"]
    assert [v["status"] for v in d["versions"]][0] == "completed" and d["versions"][-1]["status"] == "running"

    p = filled.run("threads", "show", "paused-1", "--json").json()
    assert p["pending_interrupt"]["value"] == {"amount": 42} and p["pending_interrupt"]["message"] == "Refund $42?"
    assert "pending interrupt" in filled.run("threads", "show", "paused-1").out

    f = filled.run("threads", "show", "failed-1", "--json").json()
    assert f["status"] == "error" and "model unavailable" in f["error"]


def test_threads_messages(filled: Store) -> None:
    msgs = filled.run("threads", "messages", "done-1", "--json").json()
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    assert msgs[0]["content"][0]["text"] == "pay twice"
    r = filled.run("threads", "messages", "done-1")
    assert r.rc == 0 and "charge(c1), charge(c2)" in r.out and "charged 5" in r.out
    last = filled.run("threads", "messages", "done-1", "--limit", "1", "--json").json()
    assert [m["role"] for m in last] == ["assistant"] and last[0]["content"][0]["text"] == "done"


@pytest.mark.parametrize("command", [["threads", "show"], ["threads", "messages"], ["ledger"], ["stop"]])
def test_unknown_thread_is_exit_3(filled: Store, command: list[str]) -> None:
    r = filled.run(*command, "no-such-thread")
    assert r.rc == 3 and "thread 'no-such-thread' not found" in r.err and r.out == ""
    r = filled.run(*command, "no-such-thread", "--json")
    assert r.rc == 3 and r.out == ""


# -- ledger ----------------------------------------------------------------------------------

def test_ledger_lists_calls_with_tool_status_time_and_size(filled: Store) -> None:
    rows = filled.run("ledger", "done-1", "--json").json()
    assert [(json.loads(r["key"])[1], r["tool"], r["status"]) for r in rows] == [
        ("c1", "charge", "completed"), ("c2", "charge", "completed")]
    assert all(r["result_bytes"] > 50 and r["recorded_at"].endswith("Z") for r in rows)
    table = filled.run("ledger", "done-1")
    assert table.rc == 0 and table.out.split()[:5] == ["KEY", "TOOL", "STATUS", "RECORDED", "RESULT"]
    assert table.out.count("charge") == 2


def test_ledger_shows_a_started_call_and_its_tool(filled: Store) -> None:
    # An intent record (a call that started and never recorded a result) as the ledger keeps it.
    cfg = {"thread_id": "done-1", "user_id": "alice"}
    asyncio.run(filled.cp.aput_tool_result(cfg, "m-9:c9", {"__kind__": "started", "tool": "send_email", "run_id": "r"}))
    rows = {r["key"]: r for r in filled.run("ledger", "done-1", "--json").json()}
    assert (rows["m-9:c9"]["tool"], rows["m-9:c9"]["status"]) == ("send_email", "started")
    one = filled.run("ledger", "done-1", "--call", "m-9:c9")
    assert one.rc == 0 and one.out == "started: no result recorded\n"


def test_ledger_call_prints_a_raw_value_as_json(filled: Store) -> None:
    cfg = {"thread_id": "done-1", "user_id": "alice"}
    asyncio.run(filled.cp.aput_tool_result(cfg, "m-8:c8", {"__kind__": "raw", "value": {"total": 7}}))
    one = filled.run("ledger", "done-1", "--call", "m-8:c8")
    assert one.rc == 0 and json.loads(one.out) == {"total": 7}


def test_ledger_call_prints_the_recorded_result(filled: Store) -> None:
    by_id = filled.run("ledger", "done-1", "--call", "c2")
    assert by_id.rc == 0, by_id.err
    # What the tool returned, as the user wrote it: not the ledger's internal envelope.
    assert by_id.out == "charged 7\n"
    key = next(r["key"] for r in filled.run("ledger", "done-1", "--json").json() if json.loads(r["key"])[1] == "c1")
    full = filled.run("ledger", "done-1", "--call", key, "--json").json()
    assert "__kind__" not in json.dumps(full)
    assert (full["key"], full["status"], full["result"], full["is_error"]) == (key, "completed", "charged 5", False)
    assert full["message"]["role"] == "tool" and full["message"]["content"][0]["output"] == "charged 5"
    missing = filled.run("ledger", "done-1", "--call", "c404")
    assert missing.rc == 3 and "call 'c404' has no ledger row in thread 'done-1'" in missing.err and key in missing.err
    empty = filled.run("ledger", "paused-1")
    assert empty.rc == 0 and "no ledger rows" in empty.err


# -- migrate and stop ------------------------------------------------------------------------

def test_migrate_prints_the_schema_version(store: Store) -> None:
    first = store.run("migrate", "--json").json()
    assert isinstance(first["schema_version"], int) and first["schema_version"] >= 1
    assert store.run("migrate", "--json").json()["schema_version"] == first["schema_version"]
    text = store.run("migrate", "--progress")
    assert text.rc == 0 and f"schema version {first['schema_version']}" in text.out and "applying" in text.err


def test_migrate_creates_a_new_sqlite_file_and_reads_refuse_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "new" / "fresh.db"
    r = cli("threads", "list", "--sqlite", str(path), cwd=tmp_path)
    assert r.rc == 4 and "no SQLite database at" in r.err and not path.exists()
    r = cli("migrate", "--sqlite", str(path), "--json", cwd=tmp_path)
    assert r.rc == 0 and r.json()["schema_version"] >= 1 and path.exists()
    assert cli("threads", "list", "--sqlite", str(path), "--json", cwd=tmp_path).json() == []


def test_stop_ends_a_running_run(store: Store) -> None:
    started = threading.Event()

    async def wait(state: AgentState) -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    app = one_node(wait, store.cp, "wait")
    outcome: dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        outcome["result"] = app.invoke({"messages": [user("go")]},
                                       {"thread_id": "busy-1", "user_id": "carol", "run_id": "run-busy"}, "full")
        outcome["secs"] = time.monotonic() - t0

    worker = threading.Thread(target=run)
    worker.start()
    try:
        assert started.wait(30)
        shown = store.run("threads", "show", "busy-1", "--json").json()
        assert (shown["status"], shown["current_node"]) == ("running", "wait")
        # The running run holds the thread's lease.
        assert shown["lease"]["holder"] == "run-busy" and shown["lease"]["expires_in"] > 0
        assert "lease         run-busy (token " in store.run("threads", "show", "busy-1").out
        # Another user's key is read by no run of the owner: said so, not "it stops" (red-team,
        # session 35). The CLI's own store does not isolate users, so the request is written.
        other = store.run("stop", "busy-1", "--user", "mallory")
        assert other.rc == 0 and "a run of user 'mallory'" in other.out, other.err
        assert "the owner's own run does not read this request" in other.out
        assert store.run("threads", "show", "busy-1", "--json").json()["status"] == "running"
        r = store.run("stop", "busy-1")
        assert r.rc == 0 and "stop requested for the run on thread 'busy-1'" in r.out, r.err
        worker.join(30)
        assert not worker.is_alive()
    finally:
        worker.join(60)
    meta = outcome["result"]["state"].execution_meta
    assert meta.interrupt_reason == "stop_requested" and outcome["secs"] < 30
    again = store.run("stop", "busy-1", "--json").json()
    assert again == {"thread_id": "busy-1", "user_id": "carol", "status": "interrupted_after", "stop_requested": False}
    assert "is not running" in store.run("stop", "busy-1").out


# -- bad stores, config, entry points ----------------------------------------------------------

def test_bad_sqlite_file_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    r = cli("threads", "list", "--sqlite", str(junk), cwd=tmp_path)
    assert r.rc == 4 and f"cannot open sqlite:{junk}" in r.err and "Traceback" not in r.err


def test_bad_dsn_is_a_clear_error_without_the_password(tenx_postgres: Any, tmp_path: Path) -> None:
    secret = "Sup3r-Secret-pw"
    refused = cli("threads", "list", "--dsn", f"postgresql://app:{secret}@127.0.0.1:1/x", "-v", cwd=tmp_path)
    assert refused.rc == 4 and "unreachable" in refused.err and "app:***@127.0.0.1:1" in refused.err
    user_part = tenx_postgres.dsn.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]
    no_db = tenx_postgres.dsn_for("no_such_db").replace(f"://{user_part}@", f"://{user_part}:{secret}@", 1)
    assert secret in no_db
    r = cli("threads", "list", "--dsn", no_db, "-v", cwd=tmp_path)
    assert r.rc == 4 and "no_such_db" in r.err
    malformed = cli("threads", "list", "--dsn", f"postgresql://app:{secret}@host:notaport/db", cwd=tmp_path)
    assert malformed.rc == 4 and "invalid" in malformed.err.lower()
    not_url = cli("threads", "list", "--dsn", f"host=db password={secret}", cwd=tmp_path)
    assert not_url.rc == 2 and "postgresql:// URL" in not_url.err
    from_env = cli("threads", "list", cwd=tmp_path, env={"TENXGRAPH_DSN": f"postgresql://app:{secret}@127.0.0.1:1/x"})
    assert from_env.rc == 4
    for res in (refused, r, malformed, not_url, from_env):
        assert secret not in res.out + res.err


def test_password_is_not_printed_on_success(tenx_postgres: Any, pg_dsn: str, tmp_path: Path) -> None:
    secret = "An0ther-Secret"
    user_part = pg_dsn.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]
    with_pw = pg_dsn.replace(f"://{user_part}@", f"://{user_part}:{secret}@", 1)
    assert secret in with_pw
    r = cli("migrate", "--dsn", with_pw, "-v", cwd=tmp_path)
    assert r.rc == 0 and f"{user_part}:***@" in r.out and secret not in r.out + r.err


def test_no_store_and_two_stores_are_usage_errors(tmp_path: Path) -> None:
    r = cli("threads", "list", cwd=tmp_path)
    assert r.rc == 2 and "no store given" in r.err
    r = cli("threads", "list", "--sqlite", "a.db", "--dsn", "postgresql://x@h/db", cwd=tmp_path)
    assert r.rc == 2 and "give one of" in r.err
    r = cli(cwd=tmp_path)
    assert r.rc == 2 and "usage: tenxgraph" in r.err


def _project(tmp_path: Path, config: dict[str, Any], db: Path) -> Path:
    (tmp_path / "graph").mkdir(exist_ok=True)
    (tmp_path / "graph" / "__init__.py").write_text("")
    (tmp_path / "graph" / "deps.py").write_text(
        "import os\nfrom tenxgraph.storage.checkpointer import SqliteCheckpointer\n"
        "checkpointer = SqliteCheckpointer(os.environ['AGENT_DB'])\n")
    (tmp_path / ".env").write_text(f"AGENT_DB={db}\n")
    (tmp_path / "10xgraph.json").write_text(json.dumps(config))
    return tmp_path / "10xgraph.json"


def test_store_from_10xgraph_json(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    asyncio.run(_populate(SqliteCheckpointer(db)))
    config = _project(tmp_path, {"agent": "graph.deps:checkpointer", "checkpointer": "graph.deps:checkpointer",
                                 "env": ".env", "auth": None}, db)
    # Found in the current directory, or named with --config from anywhere.
    here = cli("threads", "list", "--json", cwd=tmp_path)
    assert here.rc == 0, here.err
    assert {r["thread_id"] for r in here.json()} == {"done-1", "paused-1", "failed-1"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert cli("ledger", "done-1", "--json", "--config", str(config), cwd=elsewhere).json()[0]["tool"] == "charge"


def test_bad_10xgraph_json_is_exit_5_naming_file_and_key(tmp_path: Path) -> None:
    config = _project(tmp_path, {"checkpointer": "graph.deps:nothing_here", "env": ".env"}, tmp_path / "x.db")
    r = cli("threads", "list", cwd=tmp_path)
    assert r.rc == 5 and str(config) in r.err and "key 'checkpointer'" in r.err and "no attribute 'nothing_here'" in r.err
    config.write_text("{not json")
    r = cli("threads", "list", "--config", str(config), cwd=tmp_path)
    assert r.rc == 5 and "not valid JSON" in r.err and "line 1" in r.err
    r = cli("threads", "list", "--config", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert r.rc == 5 and "missing.json: file not found" in r.err


def test_console_script_and_module_are_the_same_command(filled: Store) -> None:
    a = filled.run("threads", "list", "--json")
    b = cli("threads", "list", "--json", *filled.args, cwd=filled.cwd, script=True)
    assert a.rc == b.rc == 0 and a.json() == b.json()
    assert "Exit codes" in cli("--help", cwd=filled.cwd, script=True).out


def test_prune_keeps_paused_threads_and_reports_what_it_removed(store: Store) -> None:
    async def ask(state: AgentState) -> str:
        return f"answer: {interrupt('approve?')}"

    app = one_node(ask, store.cp, "ask")
    app.invoke({"messages": [user("finished")]}, {"thread_id": "done-1", "user_id": "dave"})
    app.invoke({"resume": "yes"}, {"thread_id": "done-1", "user_id": "dave"})
    app.invoke({"messages": [user("waiting")]}, {"thread_id": "paused-1", "user_id": "dave"})
    rules = ("--older-than", "0s", "--ledger-ttl", "0", "--keep-versions", "1")
    dry = store.run("prune", *rules, "--dry-run", "--json")
    assert dry.rc == 0, dry.err
    real = store.run("prune", *rules, "--json")
    assert real.rc == 0, real.err
    assert dry.json() == {**real.json(), "dry_run": True}
    assert real.json()["threads"] == 1 and real.json()["state_versions"] >= 1
    assert store.run("threads", "show", "done-1").rc == 3
    paused = store.run("threads", "show", "paused-1", "--json").json()
    assert paused["status"] == "interrupted_before" and paused["pending_interrupt"] is not None
    text = store.run("prune", "--keep-versions", "1")
    assert text.rc == 0 and text.out.startswith("removed: ") and "ledger rows" in text.out
    assert app.invoke({"resume": "ok"}, {"thread_id": "paused-1", "user_id": "dave"})["messages"]


@pytest.mark.parametrize("args", [(), ("--older-than", "soon"), ("--ledger-ttl", "-5m"), ("--keep-versions", "0")])
def test_prune_refuses_bad_rules(store: Store, args: tuple[str, ...]) -> None:
    r = store.run("prune", *args)
    assert r.rc == 2 and r.err.strip(), (r.rc, r.out, r.err)


# -- no password in any output, whatever the DSN looks like ------------------------------------

# Each secret has distinctive pieces on both sides of its special character: a redaction that
# stops at the first `@` or at the space prints the second piece.
AT_SECRET = "Sup3rAt@Secr3tAt"
SPACE_SECRET = "Sup3rSp Secr3tSp"
BAD_DSNS = {
    # (DSN, exit code): 2 for a value the CLI refuses before opening, 4 for an unreachable store.
    "one-slash": ("postgres:/app:Sl4shSecr3t@127.0.0.1:1/x", 2),
    "one-slash-at-sign": (f"postgresql:/app:{AT_SECRET}@127.0.0.1:1/x", 2),
    "at-sign": (f"postgresql://app:{AT_SECRET}@127.0.0.1:1/x", 4),
    "space": (f"postgresql://app:{SPACE_SECRET}@127.0.0.1:1/x", 4),
    "key-value": ("host=127.0.0.1 port=1 user=app password=KvSecr3tPw", 2),
    "key-value-quoted": (f"host=127.0.0.1 port=1 user=app password='{SPACE_SECRET}'", 2),
    "query-string": ("postgresql://app@127.0.0.1:1/x?sslmode=disable&password=QsSecr3tPw", 4),
}


def secret_pieces(dsn: str) -> list[str]:
    """The password of ``dsn`` and each piece of it around ``@`` and spaces."""
    if "password=" in dsn:
        secret = dsn.split("password=", 1)[1].strip("'")
    else:
        secret = dsn.split(":/", 1)[1].lstrip("/").rsplit("@", 1)[0].split(":", 1)[1]
    return [secret, *(p for p in re.split(r"[@ ]", secret) if p)]


def assert_no_secret(dsn: str, *results: Result) -> None:
    for res in results:
        text = res.out + res.err
        for piece in secret_pieces(dsn):
            assert piece not in text, f"{piece!r} printed:\n{text}"


@pytest.mark.parametrize("name", list(BAD_DSNS))
def test_a_bad_dsn_password_is_printed_on_no_path(name: str, tmp_path: Path) -> None:
    dsn, rc = BAD_DSNS[name]
    runs = {
        "error": cli("threads", "list", "--dsn", dsn, cwd=tmp_path),
        "verbose": cli("threads", "show", "t-1", "--dsn", dsn, "-v", cwd=tmp_path),
        "json": cli("ledger", "t-1", "--dsn", dsn, "--json", "--progress", cwd=tmp_path),
        "migrate": cli("migrate", "--dsn", dsn, "-v", "--json", cwd=tmp_path),
        "env": cli("threads", "list", "-v", cwd=tmp_path, env={"TENXGRAPH_DSN": dsn}),
    }
    for mode, res in runs.items():
        assert res.rc == rc, (mode, res)
        assert "Traceback" not in res.err and "tenxgraph: error:" in res.err, (mode, res)
    assert_no_secret(dsn, *runs.values())
    # The message still says what is wrong.
    if rc == 2:
        assert "postgresql:// URL" in runs["error"].err
    else:
        assert "unreachable" in runs["error"].err


def test_usage_errors_that_echo_arguments_hide_the_password(tmp_path: Path) -> None:
    dsn = f"postgresql://app:{SPACE_SECRET}@db.example/x"
    stray = cli("threads", "list", dsn, cwd=tmp_path)  # the DSN without --dsn
    assert stray.rc == 2 and "unrecognized arguments" in stray.err
    as_command = cli(dsn, "threads", "list", cwd=tmp_path)
    assert as_command.rc == 2 and "invalid choice" in as_command.err
    bad_value = cli("threads", "list", "--sqlite", "x.db", "--connect-timeout", f"password={AT_SECRET}", cwd=tmp_path)
    assert bad_value.rc == 2 and "--connect-timeout" in bad_value.err
    assert_no_secret(dsn, stray, as_command)
    assert_no_secret(f"password={AT_SECRET}", bad_value)


def test_a_password_with_at_sign_or_space_is_not_printed_on_success(pg_dsn: str, tmp_path: Path) -> None:
    user_part = pg_dsn.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]
    for secret in (AT_SECRET, SPACE_SECRET):
        dsn = pg_dsn.replace(f"://{user_part}@", f"://{user_part}:{secret}@", 1)
        migrated = cli("migrate", "--dsn", dsn, "-v", "--json", cwd=tmp_path)
        assert migrated.rc == 0, migrated.err
        assert migrated.json()["store"].startswith(f"postgresql://{user_part}:***@")
        listed = cli("threads", "list", "-v", cwd=tmp_path, env={"TENXGRAPH_DSN": dsn})
        missing = cli("threads", "show", "no-such-thread", "--dsn", dsn, "-v", cwd=tmp_path)
        assert listed.rc == 0 and missing.rc == 3, (listed, missing)
        assert_no_secret(dsn, migrated, listed, missing)


def test_a_password_in_a_10xgraph_json_project_is_not_printed(tmp_path: Path) -> None:
    dsn = f"postgres:/app:{AT_SECRET}@127.0.0.1:1/x"
    (tmp_path / "graph").mkdir()
    (tmp_path / "graph" / "__init__.py").write_text("")
    (tmp_path / "graph" / "deps.py").write_text(f"raise RuntimeError('cannot reach {dsn}')\n")
    (tmp_path / "10xgraph.json").write_text(json.dumps({"checkpointer": "graph.deps:checkpointer"}))
    r = cli("threads", "list", "-v", cwd=tmp_path)
    assert r.rc == 5 and "graph.deps" in r.err, r
    assert_no_secret(dsn, r)


# -- a reader that goes away ---------------------------------------------------------------

@pytest.mark.parametrize("argv", [["--help"], ["threads", "list"], ["--json", "threads", "list"]])
def test_a_closed_pipe_ends_quietly_without_a_traceback(tmp_path: Path, argv: list[str]) -> None:
    """`tenxgraph ... | head`: once the reader has gone, the command stops with 141 (what a
    shell shows for a writer killed by SIGPIPE) and prints no BrokenPipeError traceback."""
    db = tmp_path / "agent.db"
    asyncio.run(SqliteCheckpointer(str(db)).asetup())
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write gets EPIPE
    try:
        proc = subprocess.run([str(Path(sys.executable).parent / "tenxgraph"), "--sqlite", str(db), *argv],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 141, proc.stderr


@pytest.mark.parametrize("args", [
    ["prune", "--keep-versions", "99999999999999999999999", "--dry-run"],
    ["threads", "list", "--limit", str(2**63)],
    ["--connect-timeout", "inf", "threads", "list"],
    ["--connect-timeout", "nan", "threads", "list"],
], ids=["keep-versions-past-64-bits", "limit-past-64-bits", "timeout-inf", "timeout-nan"])
def test_an_argument_out_of_range_is_a_usage_error(store: Store, args: list[str]) -> None:
    # Helper red-team, session 30: an OverflowError ("unexpected", exit 1) or a Rust panic.
    r = store.run(*args)
    assert r.rc == 2 and "tenxgraph" in r.err and "error:" in r.err, r
    assert "Traceback" not in r.err and "panicked" not in r.err, r.err


@pytest.mark.parametrize("args", [
    ["threads", "list", "--since", "1000000d"],
    ["threads", "list", "--since", "99999999999h"],
    ["--connect-timeout", "1e300", "threads", "list"],
], ids=["since-before-year-1", "since-huge-hours", "timeout-1e300"])
def test_an_extreme_but_meaningful_argument_is_answered(filled: Store, args: list[str]) -> None:
    # An age before the calendar's first day is every thread (was a traceback); a connect
    # timeout of 1e300 s is clamped as every timeout is (was a Rust panic on Postgres).
    r = filled.run(*args, "--json")
    assert r.rc == 0 and "Traceback" not in r.err and "panicked" not in r.err, r
    assert len(r.json()) == len(filled.run("threads", "list", "--json").json()) > 0


def test_a_pool_timeout_past_any_duration_is_clamped_not_a_panic(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn, pool_config={"timeout": float("inf")}, cache_ttl=1e300)
    try:
        assert cp.list_threads({"user_id": "nobody"}) == []
    finally:
        asyncio.run(cp.arelease())
