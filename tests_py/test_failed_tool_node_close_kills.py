"""Red team, commit 195981d under SIGKILL: a child sends the new turn to a thread that failed at
its tool node and is killed at a random moment (inside the close, or inside the retried turn).

Promises defended: no finished tool fires twice, no step is lost, nothing hangs (the thread
takes a `{}` and a new turn afterwards), and the history the model sees stays well formed."""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests_py.redteam.tool_history import check_history
from tests_py.redteam.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests_py" / "redteam"
PY = sys.executable


def child(kind: str, where: str, thread: str, action: str, effects: Path, tmp: Path, *, hang: bool,
          amo: bool, kill_after: float | None = None) -> dict[str, Any] | None:
    ready = tmp / f"ready-{uuid.uuid4().hex}"
    env = dict(os.environ, RT_HANG="1" if hang else "0", RT_AMO="1" if amo else "0", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([PY, str(HERE / "close_child.py"), kind, where, thread, action, str(effects), str(ready)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
    try:
        if kill_after is not None:
            wait_until("child ready", lambda: ready.exists() or proc.poll() is not None, timeout=120)
            time.sleep(kill_after)  # the random moment itself
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode == -signal.SIGKILL:
        return None
    lines = [l for l in out.decode().splitlines() if l.startswith("{")]
    assert lines, err.decode()[-2000:]
    return json.loads(lines[-1])


def killed_in_the_window(cp: Any, thread: str, effects: Path, order: str) -> Counter:
    """The effects of ``order``'s calls that happened in the killed run without their ledger row
    being written: each may happen once more when the turn is resumed."""
    done = Counter(effects.read_text().split("\n")[:-1]) if effects.exists() else Counter()
    cfg = {"thread_id": thread, "user_id": "u1"}
    state = asyncio.run(cp.aget_state(cfg))
    issuing = next((m for m in reversed(state.context) if m.role == "assistant" and m.tools_calls
                    and any(c["id"].endswith(order) for c in m.tools_calls)), None) if state else None
    windows: Counter = Counter()
    for name in ("charge", "ship"):
        effect = f"{name} {order}"
        if not done[effect]:
            continue
        status = None
        if issuing is not None:
            status = asyncio.run(cp.aget_tool_status(cfg, f"{issuing.message_id}:{name}-{order}"))
        if status != "completed":
            windows[effect] = 1
    return windows


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, Any]:
    from tests_py.conftest import make_checkpointer
    if request.param == "sqlite":
        cp = make_checkpointer("sqlite", request, tmp_path)
        return "sqlite", str(tmp_path / "cp.db"), cp
    pg = request.getfixturevalue("tenx_postgres")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    from tenxgraph.storage.checkpointer import PgCheckpointer
    cp = PgCheckpointer(pg.dsn, schema=schema, enforce_user_isolation=False)
    cp.setup()
    return "postgres", f"{pg.dsn}|{schema}", cp


@pytest.mark.parametrize("amo", [False, True], ids=["idempotent", "at_most_once"])
def test_sigkill_during_the_close_or_the_retried_turn_loses_nothing_and_fires_nothing_twice(
        store: Any, tmp_path: Path, amo: bool) -> None:
    kind, where, cp = store
    rng = random.Random(int(os.environ.get("RT_SEED", "18")))
    for r in range(4):
        thread = f"kill-{uuid.uuid4().hex[:8]}"
        effects = tmp_path / f"effects-{r}"
        first = child(kind, where, thread, "turn:o-1", effects, tmp_path, hang=True, amo=amo)
        assert first is not None and first["code"] == "NODE_TIMEOUT_001", first
        delay = rng.uniform(0.0, 0.35)
        child(kind, where, thread, "turn:o-2", effects, tmp_path, hang=False, amo=amo, kill_after=delay)
        windows = Counter() if amo else killed_in_the_window(cp, thread, effects, "o-2")
        # Converge: `{}` then a new turn, each in a fresh process (on_busy=wait past the dead lease).
        res = child(kind, where, thread, "resume", effects, tmp_path, hang=False, amo=amo)
        assert res is not None and (res["ok"] or res.get("code")), res
        res = child(kind, where, thread, "turn:o-3", effects, tmp_path, hang=False, amo=amo)
        assert res is not None and res["ok"], (r, delay, res)
        state = asyncio.run(cp.aget_state({"thread_id": thread, "user_id": "u1"}))
        assert state.execution_meta.status.value == "completed", (r, delay)
        check_history(state.context)
        counts = Counter(effects.read_text().split("\n")[:-1])
        # An idempotent call killed between its effect and its ledger row runs again (the
        # documented window); a call whose row was written never does, nor an at-most-once one.
        twice = {k: v for k, v in counts.items() if v > 1 + windows[k]}
        assert not twice, (r, delay, counts, windows)
        assert counts["charge o-1"] == 1 and counts["charge o-3"] == 1 and counts["ship o-3"] == 1, (r, delay, counts)
        # the user's turns are all there, once each
        users = [m.text() for m in state.context if m.role == "user"]
        assert users.count("o-1") == 1 and users.count("o-3") == 1 and users.count("o-2") <= 1, users
