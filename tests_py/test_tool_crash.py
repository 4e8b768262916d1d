"""SIGKILL after charge_card returned while send_receipt is still running; resume in a new process.

Uses the README's example agent (examples/support_agent.py) as the child process.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "support_agent.py"


def _effects(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _ledger_keys(db: Path) -> list[str]:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            return [r[0] for r in c.execute("SELECT tool_call_id FROM tool_executions WHERE 1=1 AND json_extract(result, '$.__kind__') IS NOT 'started'")]
    except sqlite3.Error:
        return []


@pytest.mark.parametrize(("first", "then"), [("invoke", "invoke"), ("stream", "invoke"), ("stream", "stream")])
def test_sigkill_between_parallel_tools_replays_only_the_unfinished_one(tmp_path: Path, first: str, then: str) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.jsonl"
    env = dict(os.environ, SUPPORT_EFFECTS=str(effects))
    child = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--run", "--db", str(db), "--hang-in", "send_receipt"]
        + (["--stream"] if first == "stream" else []),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            keys = _ledger_keys(db)
            hanging = any(e["phase"] == "hanging" for e in _effects(effects))
            if hanging and any(json.loads(k)[1] == "call_2" for k in keys):
                break
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
            assert time.monotonic() < deadline, "child never reached the kill point"
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    done_before = [e["tool"] for e in _effects(effects) if e["phase"] == "done"]
    assert sorted(done_before) == ["charge_card", "lookup_order"]
    assert not any(json.loads(k)[1] == "call_3" for k in _ledger_keys(db)), "send_receipt never returned"

    resumed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--resume", "--db", str(db)] + (["--stream"] if then == "stream" else []),
        env=env, capture_output=True, timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr.decode()
    done = [e["tool"] for e in _effects(effects) if e["phase"] == "done"]
    assert done.count("charge_card") == 1 and done.count("lookup_order") == 1, done
    assert done.count("send_receipt") == 1, done
    starts = [e["tool"] for e in _effects(effects) if e["phase"] == "start"]
    assert starts.count("send_receipt") == 2  # the unfinished call ran again, from its start

    # The model saw exactly one result per call id.
    with sqlite3.connect(db) as c:
        rows = [json.loads(r[0]) for r in c.execute("SELECT message_data FROM messages ORDER BY seq")]
    results = [b["call_id"] for m in rows if m["role"] == "tool" for b in m["content"] if b["type"] == "tool_result"]
    assert sorted(results) == ["call_1", "call_2", "call_3"], results
    assert rows[-1]["content"][0]["text"] == "Done: charged and emailed."
    out = resumed.stdout.decode()
    assert "charged 129.00 USD for order 4821" in out
