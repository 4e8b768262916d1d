"""SIGKILL in the middle of a node, then resume in a fresh process (SQLite)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


from tests_py.crash_agents.three_steps import Ticket, open_checkpointer


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the child processes keep the thread: a SQLite file or a Postgres database."""
    if request.param == "sqlite":
        return str(tmp_path / "agent.db")
    return request.getfixturevalue("pg_dsn")

AGENT = Path(__file__).parent / "crash_agents" / "three_steps.py"


def _env(effects: Path, hang_in: str | None) -> dict[str, str]:
    env = dict(os.environ, TENX_EFFECTS=str(effects), PYTHONPATH=str(AGENT.parent))
    env.pop("TENX_HANG_IN", None)
    if hang_in:
        env["TENX_HANG_IN"] = hang_in
    return env


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {text!r}")


def test_sigkill_mid_node_resumes_at_that_node_in_a_new_process(tmp_path: Path, db: str) -> None:
    effects = tmp_path / "effects.log"
    child = subprocess.Popen(
        [sys.executable, str(AGENT), "start", db, "t-crash"],
        env=_env(effects, hang_in="b"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(effects, "hanging:b", child)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL

    # What the dead process left: node a committed, b in flight.
    cp = open_checkpointer(db)
    cp.bind_state_type(Ticket)
    state = cp.get_state({"thread_id": "t-crash"})
    assert state is not None
    assert state.execution_meta.current_node == "b"
    assert str(state.execution_meta.status) == "running"
    assert state.visited == ["a"]

    resumed = subprocess.run(
        [sys.executable, str(AGENT), "resume", db, "t-crash"],
        env=_env(effects, hang_in=None),
        capture_output=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr.decode()
    out = json.loads(resumed.stdout.decode().strip().splitlines()[-1])
    assert out["visited"] == ["a", "b", "c"]
    assert out["status"] == "completed"
    assert out["step"] == 3
    log = effects.read_text().split()
    assert log.count("end:a") == 1, log  # the completed step did not run again
    assert log.count("start:b") == 2, log  # the node in flight ran again, once
    assert log.count("end:b") == 1 and log.count("end:c") == 1, log

    final = open_checkpointer(db).list_messages({"thread_id": "t-crash"})
    texts = [m.text() for m in final]
    assert texts == ["open a ticket", "a done", "b done", "c done"], texts


def test_resume_of_a_finished_thread_runs_nothing(tmp_path: Path, db: str) -> None:
    effects = tmp_path / "effects.log"
    first = subprocess.run(
        [sys.executable, str(AGENT), "start", db, "t-done"],
        env=_env(effects, None), capture_output=True, timeout=60,
    )
    assert first.returncode == 0, first.stderr.decode()
    assert json.loads(first.stdout.decode().splitlines()[-1])["visited"] == ["a", "b", "c"]
    # {} on a completed thread runs nothing and returns the stored result (10xGraph 0.10 ran the
    # whole graph again; "finish this thread if it is not finished" must be safe to retry).
    again = subprocess.run(
        [sys.executable, str(AGENT), "resume", db, "t-done"],
        env=_env(effects, None), capture_output=True, timeout=60,
    )
    assert again.returncode == 0, again.stderr.decode()
    assert json.loads(again.stdout.decode().splitlines()[-1])["visited"] == ["a", "b", "c"]


@pytest.mark.parametrize("hang_in", ["a", "c"])
def test_kill_at_first_and_last_node(tmp_path: Path, hang_in: str, db: str) -> None:
    effects = tmp_path / "effects.log"
    child = subprocess.Popen(
        [sys.executable, str(AGENT), "start", db, "t"], env=_env(effects, hang_in),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        _wait_for(effects, f"hanging:{hang_in}", child)
    finally:
        child.kill()
        child.wait(timeout=10)
    # The user's message was committed before the first node ran: nothing is lost.
    msgs = open_checkpointer(db).list_messages({"thread_id": "t"})
    assert msgs[0].text() == "open a ticket"
    resumed = subprocess.run(
        [sys.executable, str(AGENT), "resume", db, "t"], env=_env(effects, None), capture_output=True, timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert json.loads(resumed.stdout.decode().splitlines()[-1])["visited"] == ["a", "b", "c"]
    log = effects.read_text().split()
    assert all(log.count(f"end:{n}") == 1 for n in "abc"), log
