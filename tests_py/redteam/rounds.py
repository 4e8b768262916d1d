"""Rounds of random-moment SIGKILLs of one turn, resumed until it completes, with the checks of
the three promises (tests_py/test_redteam_kills_*.py).

Per round: a fresh thread (odd rounds run through ``astream``); the first child is killed at a delay drawn over the length of an
uninterrupted run; each resume is killed too with probability ``resume_kill_p`` (at most
``max_killed`` of them), the last one runs to the end. After every kill the parent reads, from
the database, the ledger status of the tool calls of the thread's committed issuing message.

- an idempotent call took effect exactly once, plus once per kill that caught it after it took
  effect and before its result was recorded (``windows``; with a server's count, at most once
  more per kill while it was issued and not recorded); once its ledger row was seen, never again;
- an at-most-once call never took effect twice; its tool message is its result only when it
  took effect, and TOOL_OUTCOME_UNKNOWN only when a kill left its intent row without a result;
- the thread ends completed with the uninterrupted run's roles and last text, ids unique.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenxgraph.core.state import Message
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer
from tenxgraph.testing.postgres_server import find_pg_binary
from tenxgraph.testing.crash import _import_target
from tests_py.redteam.killer import run_once


@dataclass
class Call:
    """A tool call the turn makes: its id in the issuing message and the effect it counts."""
    call_id: str
    effect: str
    at_most_once: bool
    result: Any  # the tool message's output when it ran


def reader(db: str) -> Any:
    return PgCheckpointer(db) if db.startswith("postgres") else SqliteCheckpointer(db)


async def ledger(cp: Any, tid: str) -> dict[str, str | None]:
    state = await cp.aget_state({"thread_id": tid})
    if state is None:
        return {}
    issuing = next((m for m in reversed(state.context) if m.role == "assistant" and m.tools_calls), None)
    if issuing is None:
        return {}
    return {c["id"]: await cp.aget_tool_status({"thread_id": tid}, f"{issuing.message_id}:{c['id']}")
            for c in issuing.tools_calls}


def labelled(db: str, name: str) -> str:
    """``db`` with the child's own ``application_name``, so its server backends can be found."""
    if not db.startswith("postgres"):
        return db
    parts = urllib.parse.urlsplit(db)
    query = urllib.parse.parse_qsl(parts.query) + [("application_name", name)]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def wait_backends_gone(db: str, name: str, timeout: float = 120.0) -> None:
    """Waits until no server backend of the killed child ``name`` is left. A client killed
    while its COMMIT (or a one-statement write) was on its way still commits on the server, after
    the process is gone: reading the thread before its backend ends can see the thread without
    that commit, and the round would then send as new a turn the thread already holds."""
    if not db.startswith("postgres"):
        return
    query = f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'"
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run([find_pg_binary("psql"), "-X", "-Atq", "-d", db, "-c", query],
                             env={**os.environ, "PGCONNECT_TIMEOUT": "10"}, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip() == "0":
            return
        assert time.monotonic() < deadline, f"the killed child's backends never ended: {out.stdout}{out.stderr}"
        time.sleep(0.05)  # polled: the server notices the closed socket on its own


def outputs(context: list[Any]) -> dict[str, tuple[Any, bool]]:
    out = {}
    for m in context:
        for b in m.content:
            if getattr(b, "type", None) == "tool_result":
                out[b.call_id] = (b.output, bool(getattr(b, "is_error", False)))
    return out


def _same_text(final: str, gold: str) -> bool:
    """The scripted model writes the tool outputs it saw as JSON. A resumed run on PostgreSQL saw
    them as jsonb gives them back, a dict's keys in jsonb's own order (docs/differences.md): the
    same text but for that order (CI of sessions 23 and 25: one round each, a result answered
    from the ledger). Lists, values and every other text must match exactly."""
    if final == gold:
        return True
    try:
        return bool(json.loads(final) == json.loads(gold))
    except ValueError:
        return False


async def _golden(target: str, cp: Any, env: dict[str, str], text: str) -> float:
    """The uninterrupted run, in this process (a child's start-up costs seconds): its length."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        app = _import_target(target)(cp)
        started = time.perf_counter()
        await app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": "golden"})
        return max(time.perf_counter() - started, 0.05)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def play(*, target: str, db: str, workdir: Path, env: dict[str, str], text: str, calls: list[Call],
         counts: Callable[[], dict[str, int]], reset: Callable[[], None], rounds: int, seed: int,
         resume_kill_p: float = 0.3, max_killed: int = 2, exact: bool = True) -> int:
    """Plays ``rounds`` rounds; returns how many kills landed inside a run. ``exact``: ``counts``
    is written by the killed process itself before a tool returns (an EffectCounter), so a kill's
    window is seen exactly; False for a count kept by a server."""
    cp = reader(db)
    span = asyncio.run(_golden(target, cp, env, text))
    gold = asyncio.run(cp.aget_state({"thread_id": "golden"}))
    gold_roles, gold_last = [m.role for m in gold.context], gold.context[-1].text()
    rng = random.Random(seed)
    kills = 0
    try:
        for r in range(rounds):
            streamed = r % 2 == 1  # every other round through astream, kills and resumes alike
            scale = 1.3
            for redo in range(4):
                # A round whose first run finished before its kill tested nothing: again, on a new
                # thread, with the delay drawn over a shorter span (the child ran faster).
                reset()
                tid = f"round-{r}-{redo}"
                windows = {c.call_id: 0 for c in calls}
                open_kills = {c.call_id: 0 for c in calls}  # kills with the call issued, not recorded
                done_at: dict[str, int] = {}  # the count when its ledger row was first seen
                cut_off: set[str] = set()
                turn: str | None = text
                attempt = killed = 0
                while True:
                    kill = rng.uniform(0, span * scale) if attempt == 0 or (
                        killed <= max_killed and rng.random() < resume_kill_p) else None
                    before = counts()
                    child = f"tenx-kill-{tid}-a{attempt}"
                    out = run_once(workdir / tid, f"a{attempt}", target, tid, labelled(db, child), text=turn,
                                   kill_after=kill, env=env, stream=streamed)
                    attempt += 1
                    if not out.killed:
                        assert out.result is not None and out.result["outcome"] == "completed", (
                            f"round {r}: {out.result and out.result.get('exception')}\n{out.stderr[-3000:]}")
                        break
                    wait_backends_gone(db, child)
                    kills += 1
                    killed += 1
                    after = counts()
                    status = asyncio.run(ledger(cp, tid))
                    if asyncio.run(cp.aget_state({"thread_id": tid})) is None:
                        continue  # killed before its input commit: the client sends the turn again
                    turn = None  # the thread holds the turn now: resume it
                    for c in calls:
                        if status.get(c.call_id) == "completed":
                            done_at.setdefault(c.call_id, after.get(c.effect, 0))
                        elif c.call_id in status:
                            open_kills[c.call_id] += 1
                            if after.get(c.effect, 0) > before.get(c.effect, 0):
                                windows[c.call_id] += 1
                        if status.get(c.call_id) == "started":
                            cut_off.add(c.call_id)
                        if c.at_most_once:
                            assert counts().get(c.effect, 0) <= 1, f"round {r}: at-most-once {c.effect} ran twice"
                if killed:
                    break
                scale *= 0.5
            assert killed, f"round {r}: no kill landed inside a run in 4 tries"
            ctx = (f"round {r} ({tid}, seed {seed}): effects {counts()}, windows {windows}, open kills "
                   f"{open_kills}, recorded at {done_at}, cut off {cut_off}")
            final = asyncio.run(cp.aget_state({"thread_id": tid}))
            assert str(final.execution_meta.status).endswith("completed"), ctx
            assert [m.role for m in final.context] == gold_roles, ctx
            ids = [m.message_id for m in final.context]
            assert len(ids) == len(set(ids)), ctx
            got = outputs(final.context)
            n = counts()
            for c in calls:
                output, failed = got[c.call_id]
                if c.at_most_once:
                    assert n.get(c.effect, 0) <= 1, ctx
                    if failed:
                        assert c.call_id in cut_off and "TOOL_OUTCOME_UNKNOWN" in str(output), ctx
                    else:
                        assert output == c.result and n.get(c.effect, 0) == 1, ctx
                else:
                    if exact:
                        assert n.get(c.effect, 0) == 1 + windows[c.call_id], ctx
                    else:
                        # Counted by a server: a call in flight at a kill may be counted after the
                        # parent looked, so only the bound is exact.
                        assert 1 <= n.get(c.effect, 0) <= 1 + open_kills[c.call_id], ctx
                    if c.call_id in done_at:  # recorded: never ran again
                        assert n.get(c.effect, 0) == done_at[c.call_id], ctx
                    assert (output, failed) == (c.result, False), ctx
            if all(not c.at_most_once for c in calls) or not cut_off:
                assert _same_text(final.context[-1].text(), gold_last), (
                    f"{ctx}; final {final.context[-1].text()!r}, gold {gold_last!r}")
    finally:
        asyncio.run(cp.arelease())
    return kills
