"""Red team C, session 17: attacks on the fixes of 4af4965 (Postgres deadlines / lock_timeout,
the chore beside the node, interrupt_id, the busy refusal at a tool node, the bare {} that
waited, astream({}) on a finished thread).

Real PostgreSQL (TENXGRAPH_TEST_PG_DSN, from `python -m tenxgraph.testing serve ENV`), real psql
sessions for the competing transactions, effects counted in files. Each test names the promise
it defends; a test that FAILS on the current code is a broken promise (see FINDINGS.md).

Run: .venv/bin/python -m pytest tests_py/test_redteam_session17_fixes.py -p no:cacheprovider -q
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.postgres_server import find_pg_binary
from tenxgraph.utils import interrupt, pending_interrupt

from tests_py.redteam.blackhole import BlackholeAfterBegin
from tests_py.redteam.graphs import agent_loop

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not DSN, reason="needs TENXGRAPH_TEST_PG_DSN (python -m tenxgraph.testing serve ENV)")
PSQL = find_pg_binary("psql") if DSN else "psql"


# --------------------------------------------------------------------------- helpers

def psql(sql: str, timeout: float = 30) -> str:
    res = subprocess.run([PSQL, "-X", "-Atq", "-v", "ON_ERROR_STOP=1", "-d", DSN, "-c", sql],
                         capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"psql failed: {res.stderr.strip()}")
    return res.stdout.strip()


def psql_session(script: str) -> subprocess.Popen[str]:
    """A second client holding a transaction open (a real process, its own backend)."""
    return subprocess.Popen([PSQL, "-X", "-Atq", "-v", "ON_ERROR_STOP=1", "-d", DSN],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def status_of(state: Any) -> str:
    return str(state.execution_meta.status).split(".")[-1].lower()


def new_schema() -> str:
    return f"rc_{uuid.uuid4().hex[:12]}"


def checkpointer(schema: str, **kw: Any) -> PgCheckpointer:
    kw.setdefault("enforce_user_isolation", False)
    cp = PgCheckpointer(DSN, schema=schema, **kw)
    cp.setup()
    return cp


def cfg(thread: str, **kw: Any) -> dict[str, Any]:
    return {"thread_id": thread, "user_id": "u1", **kw}


class Effects:
    """Side effects appended to a file (outside the run's own bookkeeping)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, name: str) -> None:
        with open(self.path, "a") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())

    def count(self, name: str) -> int:
        if not self.path.exists():
            return 0
        return sum(1 for line in self.path.read_text().splitlines() if line == name)


def _call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def tool_graph(effects: Effects, cp: PgCheckpointer, *, interrupt_before: list[str] | None = None,
               hang: bool = False):
    """model asks for `charge` once per user turn, then answers; `charge` records its effect."""

    async def charge(order_id: str) -> str:
        """Charge the order."""
        if hang and order_id == "o-1":  # its backend hangs for this order, not for later ones
            await asyncio.Event().wait()
        effects.record("charge")
        return f"charged {order_id}"

    async def model(state: AgentState) -> Message:
        last = state.context[-1]
        if last.role == "user":
            msg = Message.text_message(f"working on {last.text()}", role="assistant")
            msg.tools_calls = [_call(f"c-{uuid.uuid4().hex[:6]}", "charge", order_id=last.text())]
            return msg
        return Message.text_message("done", role="assistant")

    return agent_loop(model, [charge], cp, interrupt_before=interrupt_before)


def user(text: str) -> dict[str, Any]:
    return {"messages": [Message.text_message(text)]}


# --------------------------------------------------------------------------- 1. lock_timeout

def test_a_turn_during_a_long_prune_waits_for_it_instead_of_failing(tmp_path: Path) -> None:
    """Promise: no step of work is lost; a slow but legit lock wait is not an error.

    `aprune(keep_versions=...)` is ONE transaction over the whole database (docs: "may rightly
    take minutes"); its states rule row-locks every old state row of every thread until COMMIT.
    A live thread's step trims its own history (`DELETE FROM states WHERE version <= v_new -
    state_history_limit`) and so waits for those rows. Before 4af4965 the step waited for the
    prune; with the session-wide `lock_timeout = 5 s` it fails after 5 s with
    STORAGE_TRANSIENT_001 and the turn is lost. The prune is the second session here: prune's own
    states statement (copied from src/store/postgres/prune.rs), held open 8 s as a large prune is.
    """
    schema = new_schema()
    cp = checkpointer(schema, state_history_limit=2)
    effects = Effects(tmp_path / "effects")
    app = tool_graph(effects, cp)
    thread = f"prune-{uuid.uuid4().hex[:8]}"
    for i in range(2):
        out = asyncio.run(app.ainvoke(user(f"o-{i}"), cfg(thread)))
        assert out is not None
    before = asyncio.run(cp.aget_state(cfg(thread)))
    assert status_of(before) == "completed"
    n_before = len(before.context)

    s = f'"{schema}"'
    prune = psql_session("")
    assert prune.stdin is not None
    prune.stdin.write(
        "BEGIN;\n"
        f"WITH d AS (DELETE FROM {s}.states WHERE version <= (SELECT MAX(version) FROM {s}.states s2 "
        f"WHERE s2.thread_id = {s}.states.thread_id) - 1 RETURNING 1) SELECT COUNT(*) FROM d;\n"
        "SELECT pg_sleep(8);\nCOMMIT;\n"
    )
    prune.stdin.close()
    try:
        wait_for(lambda: psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(8)%' "
                              "AND state = 'active'") == "1", 10, "the prune session to hold its row locks")
        started = time.monotonic()
        error: BaseException | None = None
        try:
            asyncio.run(app.ainvoke(user("o-during-prune"), cfg(thread)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            error = exc
        took = time.monotonic() - started
    finally:
        prune.wait(timeout=30)
    assert prune.returncode == 0, prune.stderr.read() if prune.stderr else ""
    after = asyncio.run(cp.aget_state(cfg(thread)))
    assert error is None, (
        f"a turn that met a long prune's row locks failed after {took:.1f} s with "
        f"{type(error).__name__} {getattr(error, 'error_code', None)}: {error}; "
        f"thread now {status_of(after)} with {len(after.context)} messages (was {n_before})"
    )
    assert status_of(after) == "completed"
    assert effects.count("charge") == 3


# --------------------------------------------------------------------------- 2. the bare {} that waited

def test_a_reviewers_go_on_that_waited_behind_a_recovery_check_is_not_silently_dropped(tmp_path: Path) -> None:
    """Promise: nothing is lost. A reviewer approves a static `interrupt_before=["tools"]` gate
    with `ainvoke({})` (10xGraph's way to go on) under `on_busy="wait"`. At that moment another
    worker's recovery check holds the thread's lease for a moment (here: graph._aresume, what
    `arecover` does per thread, held 1.5 s by the `after_lease` failpoint; it writes nothing).
    The fix for item 6 then returns the paused thread as it is: no error, nothing ran, the
    approval is gone. Expected: the approval runs the tools (the holder changed nothing the
    reviewer had not seen), or a typed error tells the reviewer to send it again.
    """
    schema = new_schema()
    cp = checkpointer(schema)
    effects = Effects(tmp_path / "effects")
    app = tool_graph(effects, cp, interrupt_before=["tools"])
    thread = f"gate-{uuid.uuid4().hex[:8]}"
    asyncio.run(app.ainvoke(user("o-1"), cfg(thread)))
    paused = asyncio.run(cp.aget_state(cfg(thread)))
    assert status_of(paused) == "interrupted_before" and effects.count("charge") == 0
    s = f'"{schema}"'

    def lease_held() -> bool:
        return psql(f"SELECT count(*) FROM {s}.tenx_leases WHERE thread_id = '{thread}' AND NOT released "
                    "AND expires_at > clock_timestamp()") == "1"

    async def scenario() -> tuple[Any, Any]:
        check = asyncio.create_task(app._aresume(cfg(thread, on_busy="reject",
                                                      failpoints=f"after_lease:{thread}=delay(1500)")))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, wait_for, lease_held, 10, "the recovery check to hold the lease")
        approval = await app.ainvoke({}, cfg(thread, on_busy="wait", busy_timeout=20))
        return approval, await check

    approval, checked = asyncio.run(scenario())
    assert checked.get("nothing_to_resume"), checked  # the recovery check wrote nothing
    after = asyncio.run(cp.aget_state(cfg(thread)))
    assert effects.count("charge") == 1 and status_of(after) == "completed", (
        f"the reviewer's approval ({{}} under on_busy='wait') returned without error but nothing ran: "
        f"thread still {status_of(after)}, charge ran {effects.count('charge')} times; "
        f"response messages: {[m.text() for m in approval.get('messages', [])]}"
    )


# --------------------------------------------------------------------------- 3. astream({}) vs ainvoke({})

@pytest.mark.parametrize("granularity", ["low", "partial", "full"])
def test_astream_of_a_finished_thread_matches_ainvoke_in_each_granularity(tmp_path: Path, granularity: str) -> None:
    """Item 7: astream({}) on a finished thread yields the last turn, as ainvoke({}) returns it:
    the same message ids, once each, no tool or model run again (effects counted)."""
    cp = checkpointer(new_schema())
    effects = Effects(tmp_path / "effects")
    app = tool_graph(effects, cp)
    thread = f"fin-{uuid.uuid4().hex[:8]}"
    asyncio.run(app.ainvoke(user("o-1"), cfg(thread)))
    invoked = asyncio.run(app.ainvoke({}, cfg(thread)))
    # ainvoke's response also carries the turn's user message (as the first ainvoke's did); a
    # live stream never yields the input, so the reconnecting stream is compared without it.
    want = [str(m.message_id) for m in invoked["messages"] if m.role != "user"]
    assert len(want) >= 3 and len(want) == len(set(want))  # assistant(tool call), tool result(s), answer

    async def stream() -> list[Any]:
        return [c async for c in app.astream({}, cfg(thread), granularity)]

    chunks = asyncio.run(stream())
    got = [str(c.message.message_id) for c in chunks if c.message is not None and str(c.event.value) == "message"]
    assert got == want, (granularity, got, want, [(str(c.event.value), c.data) for c in chunks])
    assert not [c for c in chunks if str(c.event.value) == "error"]
    assert effects.count("charge") == 1


# --------------------------------------------------------------------------- 4. interrupt_id crafted

def test_a_crafted_interrupt_id_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Item 4: `{"resume": v, "interrupt_id": x}` with x an int, a list, a dict, True, another
    thread's pending id: refused, the thread's version and the ledger unchanged; the right id
    goes through once; the same answer retried after it is refused."""
    schema = new_schema()
    cp = checkpointer(schema)
    effects = Effects(tmp_path / "effects")

    async def ask(state: AgentState) -> Message:
        answer = interrupt({"q": "approve?"}, message="approve?")
        if answer == "yes":
            effects.record("approved")
        return Message.text_message(f"answer {answer}", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    app = g.compile(checkpointer=cp)
    t1, t2 = f"ia-{uuid.uuid4().hex[:8]}", f"ib-{uuid.uuid4().hex[:8]}"
    for t in (t1, t2):
        asyncio.run(app.ainvoke(user("hi"), cfg(t)))
    p1 = pending_interrupt(asyncio.run(cp.aget_state(cfg(t1))))
    p2 = pending_interrupt(asyncio.run(cp.aget_state(cfg(t2))))
    assert p1 is not None and p2 is not None
    s = f'"{schema}"'

    def version() -> str:
        return psql(f"SELECT COALESCE(MAX(version), 0) FROM {s}.states WHERE thread_id = '{t1}'")

    v0 = version()
    bad: list[Any] = [p2.id, 12345, [p1.id], {"id": p1.id}, True, str(p1.id) + " "]
    if str(p1.id).isdigit():
        bad.append(int(p1.id))
    for crafted in bad:
        if crafted == p1.id:
            continue  # another thread's id equal to ours: nothing to tell apart
        with pytest.raises(ValueError):
            asyncio.run(app.ainvoke({"resume": "yes", "interrupt_id": crafted}, cfg(t1)))
        assert version() == v0, f"interrupt_id={crafted!r} wrote a version"
    assert effects.count("approved") == 0
    asyncio.run(app.ainvoke({"resume": "yes", "interrupt_id": p1.id}, cfg(t1)))
    assert effects.count("approved") == 1
    with pytest.raises(ValueError):
        asyncio.run(app.ainvoke({"resume": "yes", "interrupt_id": p1.id}, cfg(t1)))
    assert effects.count("approved") == 1


# --------------------------------------------------------------------------- 5. a tool node that fails for good

def test_a_user_whose_tool_node_fails_for_good_can_still_send_a_new_turn(tmp_path: Path) -> None:
    """Item 5: new input is refused (STORAGE_BUSY_001) while a tool node's calls are unanswered,
    and `{}` is the documented way out. A tool whose backend hangs for good (node_timeout every
    time) leaves the thread failed at the tool node; `{}` fails the same way. Can the user ever
    send a new turn? (Typed errors are checked on the way.) Fixed in session 18: the new turn
    answers the failed node's calls first (tests_py/test_failed_tool_node_new_turn.py)."""
    cp = checkpointer(new_schema())
    effects = Effects(tmp_path / "effects")
    app = tool_graph(effects, cp, hang=True)
    thread = f"wedge-{uuid.uuid4().hex[:8]}"
    run_cfg = cfg(thread, node_timeout=0.5)
    with pytest.raises(Exception) as first:
        asyncio.run(app.ainvoke(user("o-1"), run_cfg))
    state = asyncio.run(cp.aget_state(cfg(thread)))
    assert status_of(state) == "error" and state.execution_meta.current_node == "tools", first.value
    with pytest.raises(Exception) as again:
        asyncio.run(app.ainvoke({}, run_cfg))
    assert getattr(again.value, "error_code", None), again.value  # typed
    try:
        asyncio.run(app.ainvoke(user("forget it, something else"), run_cfg))
    except Exception as exc:  # noqa: BLE001
        assert getattr(exc, "error_code", None) == "STORAGE_BUSY_001", exc
        pytest.fail(f"the thread takes no new turn any more: {type(exc).__name__} "
                    f"{getattr(exc, 'error_code', None)}: {exc}")
    state = asyncio.run(cp.aget_state(cfg(thread)))
    roles = [m.role for m in state.context]
    # if the turn went in, it must not sit between the tool calls and their results
    i = max(i for i, m in enumerate(state.context) if m.role == "assistant" and m.tools_calls)
    assert roles[i + 1] == "tool", roles


# --------------------------------------------------------------------------- 6. transactions left unbounded

@pytest.mark.parametrize("op", ["aput_thread", "adelete_message", "aput_messages"])
def test_a_checkpointer_write_whose_transaction_meets_a_blackhole_ends_in_bounded_time(op: str) -> None:
    """Promise: nothing hangs. 4af4965 says every statement has a client deadline; statements of
    a transaction run on `&mut *tx`, outside `Conns`' bound, so each transaction must be wrapped
    in `PgStore::bounded`. `put_messages` is; `put_thread` (aput_thread) and `delete_message`
    (adelete_message) are not. The network blackholes right after their BEGIN: with a 2 s
    deadline the call must end with a typed error within 2 x 2 s (+ slack)."""
    from urllib.parse import urlsplit

    from tenxgraph.utils.thread_info import ThreadInfo

    parts = urlsplit(DSN)
    proxy = BlackholeAfterBegin(parts.hostname or "127.0.0.1", parts.port or 5432)
    schema = new_schema()
    thread = f"bh-{uuid.uuid4().hex[:8]}"
    try:
        cp = PgCheckpointer(proxy.dsn_for(DSN, f"rc_bh_{op}"), schema=schema, enforce_user_isolation=False,
                            pool_config={"max_size": 1, "timeout": 2.0, "command_timeout": 2.0, "lock_timeout": 1.0})
        cp.setup()
        cfg1 = cfg(thread)
        msg = Message.text_message("hello", message_id="m-1")
        asyncio.run(cp.aput_messages(cfg1, [msg]))
        calls = {
            "aput_thread": lambda: cp.aput_thread(cfg1, ThreadInfo(thread_id=thread, thread_name="renamed", user_id="u1")),
            "adelete_message": lambda: cp.adelete_message(cfg1, "m-1"),
            "aput_messages": lambda: cp.aput_messages(cfg1, [Message.text_message("more", message_id="m-2")]),
        }

        async def attempt() -> tuple[str, float, Any]:
            proxy.armed = True
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(calls[op](), 15)
                return "ok", time.monotonic() - t0, None
            except asyncio.TimeoutError:
                return "caller_timeout", time.monotonic() - t0, None
            except Exception as exc:  # noqa: BLE001
                return "error", time.monotonic() - t0, exc

        outcome, took, exc = asyncio.run(attempt())
        assert proxy.tripped.is_set(), "the blackhole never started (no statement after BEGIN)"
        assert outcome != "caller_timeout", (
            f"BROKEN (nothing hangs): {op} waited {took:.1f} s on a statement inside its transaction "
            "with a 2 s deadline configured, until the caller's own wait_for ended it")
        assert outcome == "error" and getattr(exc, "error_code", None) == "STORAGE_TRANSIENT_001", (outcome, exc)
        assert took < 4 + 3, took
    finally:
        proxy.stop()


@pytest.mark.parametrize("granularity", ["low", "full"])
def test_a_new_turn_streamed_on_a_finished_thread_yields_each_message_once(tmp_path: Path, granularity: str) -> None:
    """Item 7 must not fire for a turn that runs: the stream of a new turn on a completed thread
    yields its own messages (each message id once) and not the previous turn again."""
    cp = checkpointer(new_schema())
    effects = Effects(tmp_path / "effects")
    app = tool_graph(effects, cp)
    thread = f"fin2-{uuid.uuid4().hex[:8]}"
    first = asyncio.run(app.ainvoke(user("o-1"), cfg(thread)))
    old = {str(m.message_id) for m in first["messages"]}

    async def stream() -> list[Any]:
        return [c async for c in app.astream(user("o-2"), cfg(thread), granularity)]

    chunks = asyncio.run(stream())
    ids = [str(c.message.message_id) for c in chunks
           if c.message is not None and str(c.event.value) == "message" and not c.message.delta]
    assert not old & set(ids), ("the previous turn was streamed again", ids)
    assert len(ids) == len(set(ids)), ids
    assert effects.count("charge") == 2
