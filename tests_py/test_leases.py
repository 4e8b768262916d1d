"""One writer per thread (leases with fencing tokens), busy-thread policies, intent records and
side-effect classes, and retention that respects the ledger. Real processes, real SQLite and
PostgreSQL; side effects counted outside the processes (``EffectCounter``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph, metrics
from tenxgraph.core.exceptions import LeaseLostError, StaleStateError, ThreadBusyError
from tenxgraph.testing import CrashKit, EffectCounter
from tenxgraph.testing.crash import child_env
from tenxgraph.utils.interrupt import interrupt, pending_interrupt
from tenxgraph.utils.tool_decorator import tool
from tests_py.crash_agents.lease_agent import DONE, open_db
from tests_py.tool_graphs import call, tool_graph, tool_texts

AGENT = Path(__file__).resolve().parent / "crash_agents" / "lease_agent.py"
TOOLS = ("lookup_order", "charge_card", "send_receipt")


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return sqlite_db if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


def _spawn(args: list[str], effects: EffectCounter, **env: str) -> subprocess.Popen[str]:
    full_env = child_env(env={"TENXGRAPH_EFFECTS": str(effects.path), **env})
    return subprocess.Popen([sys.executable, str(AGENT), *args], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)


def _result(p: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-4000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


def _by_round(effects: EffectCounter) -> dict[int, list[tuple[str, int, Any]]]:
    rounds: dict[int, list[tuple[str, int, Any]]] = {}
    for e in effects.all():
        rounds.setdefault(int(e.data["order_id"]), []).append((e.name, e.pid, e.data.get("key")))
    return rounds


# --------------------------------------------------------------------------- two processes, 100 rounds

ROUNDS = 100


@pytest.mark.parametrize("on_busy", ["reject", "wait"])
def test_two_processes_start_the_same_thread_at_once(db: str, effects: EffectCounter, tmp_path: Path,
                                                     on_busy: str) -> None:
    """Each round both workers send a turn to a fresh thread at the same moment (file barrier).
    reject: exactly one runs, the other gets ThreadBusyError before any of its tools fire (the
    winner holds its lease until the loser's turn has ended, so they overlap whatever the load). wait:
    both turns complete, one after the other, every tool once per turn."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    workers = {w: _spawn(["rounds", db, w, str(barrier), str(ROUNDS), on_busy], effects, LEASE_TURN_SLEEP="0.03")
               for w in ("a", "b")}
    out = {w: _result(p) for w, p in workers.items()}
    pid_of = {w: o["pid"] for w, o in out.items()}
    per_round = _by_round(effects)
    for r in range(ROUNDS):
        outcomes = {w: out[w]["rounds"][r]["outcome"] for w in out}
        ran = per_round.get(r, [])
        if on_busy == "reject":
            assert sorted(outcomes.values()) == ["ThreadBusyError/STORAGE_BUSY_002", "completed"], (r, outcomes)
            winner = next(w for w, o in outcomes.items() if o == "completed")
            # Counted outside the processes: every tool once, all by the winner.
            assert sorted(name for name, _, _ in ran) == sorted(TOOLS), (r, ran)
            assert {pid for _, pid, _ in ran} == {pid_of[winner]}, (r, ran)
        else:
            assert set(outcomes.values()) == {"completed"}, (r, outcomes)
            assert sorted(name for name, _, _ in ran) == sorted(TOOLS * 2), (r, ran)
            keys = [k for name, _, k in ran if name == "charge_card"]
            assert len(set(keys)) == 2, (r, ran)  # two turns, two distinct charges
    if on_busy == "wait":
        # One after the other: each thread holds two whole turns, never interleaved.
        cp = open_db(db)
        for r in range(0, ROUNDS, 7):
            state = cp.get_state({"thread_id": f"round-{r}"})
            roles = [m.role for m in state.context]
            assert roles == ["user", "assistant", "tool", "tool", "tool", "assistant"] * 2, (r, roles)


# --------------------------------------------------------------------------- a frozen worker


def test_a_frozen_worker_is_fenced_after_another_takes_over(db: str, effects: EffectCounter, tmp_path: Path) -> None:
    """Worker A holds the thread with a 1 s lease and is frozen (SIGSTOP) inside its model node;
    B waits for the lease, takes over and completes the run; A is resumed (SIGCONT): every write
    it then attempts is refused, nothing of it reaches the database, no tool runs twice."""
    marker = tmp_path / "a-in-model"
    a = _spawn(["run", db, "t-frozen", json.dumps({"lease_ttl": 1}), "charge order 7"], effects,
               LEASE_MODEL_SLEEP="2", LEASE_MODEL_MARKER=str(marker))
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert a.poll() is None and time.monotonic() < deadline, a.communicate()[1] if a.poll() is not None else "timeout"
        time.sleep(0.01)
    os.kill(a.pid, signal.SIGSTOP)
    try:
        b = _spawn(["run", db, "t-frozen", json.dumps({"on_busy": "wait", "busy_timeout": 20, "lease_ttl": 1})], effects)
        b_out = _result(b)
        assert b_out["outcome"] == "completed" and b_out["messages"][-1] == DONE, b_out
        cp = open_db(db)
        before = cp.get_state({"thread_id": "t-frozen"})
        version_before = before.execution_meta.model_dump()
        n_messages = len(cp.list_messages({"thread_id": "t-frozen"}))
    finally:
        os.kill(a.pid, signal.SIGCONT)
    a_out = _result(a)
    assert a_out["outcome"] == "LeaseLostError/STORAGE_FENCED_001", a_out
    after = cp.get_state({"thread_id": "t-frozen"})
    assert after.execution_meta.model_dump() == version_before
    assert len(cp.list_messages({"thread_id": "t-frozen"})) == n_messages
    counts = effects.counts()
    assert counts == {t: 1 for t in TOOLS}, counts
    assert {e.pid for e in effects.all()} == {b.pid}


# --------------------------------------------------------------------------- the intent window


WINDOW = "after_tool:charge_card=kill"  # charge_card returned; its result never reached the ledger


def test_idempotent_tool_in_the_window_is_run_again(crash_kit: CrashKit, db: str) -> None:
    target = "tests_py.crash_agents.lease_agent:build_idempotent"
    assert crash_kit.run_until_crash(target, "t-win", failpoints=WINDOW, db=db, input="charge order 9").killed
    resumed = crash_kit.resume(target, "t-win", db=db)
    assert resumed.status == "completed" and resumed.last == DONE
    assert crash_kit.effects.count("charge_card") == 2  # at-least-once: the same idempotency key twice
    assert len(crash_kit.effects.distinct("charge_card", "key")) == 1


def test_at_most_once_tool_in_the_window_is_not_run_again(crash_kit: CrashKit, db: str) -> None:
    target = "tests_py.crash_agents.lease_agent:build_at_most_once"
    assert crash_kit.run_until_crash(target, "t-win", failpoints=WINDOW, db=db, input="charge order 9").killed
    resumed = crash_kit.resume(target, "t-win", db=db)
    assert resumed.status == "completed"
    assert crash_kit.effects.count("charge_card") == 1
    charge = next(m for m in resumed.message_dicts if m.get("role") == "tool"
                  and (m.get("metadata") or {}).get("function_name") == "charge_card")
    text = json.dumps(charge)
    assert "TOOL_OUTCOME_UNKNOWN" in text and "outcome" in text and "is unknown" in text, text
    # Its idempotent siblings ran in parallel: once, or twice when the kill came before their record.
    assert 1 <= crash_kit.effects.count("lookup_order") <= 2 and 1 <= crash_kit.effects.count("send_receipt") <= 2


@pytest.mark.parametrize(("answer", "charges"), [({"result": "charged: checked by a human"}, 1), ("retry", 2)])
def test_at_most_once_with_on_unknown_interrupt_pauses_for_a_human(crash_kit: CrashKit, db: str, answer: Any,
                                                                   charges: int) -> None:
    target = "tests_py.crash_agents.lease_agent:build_interrupt"
    assert crash_kit.run_until_crash(target, "t-win", failpoints=WINDOW, db=db, input="charge order 9").killed
    paused = crash_kit.resume(target, "t-win", db=db)
    assert paused.status == "interrupted_before", paused
    assert crash_kit.effects.count("charge_card") == 1
    cp = open_db(db)
    question = pending_interrupt(cp.get_state({"thread_id": "t-win"}))
    assert question is not None and question.reason == "tool_outcome_unknown"
    assert question.value["tool"] == "charge_card" and question.value["idempotency_key"].startswith("tenx-")
    done = crash_kit.resume(target, "t-win", db=db, input={"resume": answer})
    assert done.status == "completed" and done.last == DONE
    assert crash_kit.effects.count("charge_card") == charges
    if charges == 1:
        assert "charged: checked by a human" in json.dumps(done.message_dicts)


# --------------------------------------------------------------------------- in-process policies


class Counter(AgentState):
    count: int = 0


async def _until(check: Any, what: str, timeout: float = 60.0) -> None:
    """Polls ``await check()`` until true: the event a test waits for (a lease taken, a step
    committed) is in another task, and a loaded machine may take seconds to get there."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.005)


async def _lease_held(checkpointer: Any, tid: str) -> None:
    async def held() -> bool:
        lease = await checkpointer.aget_lease({"thread_id": tid})
        return lease is not None and not lease["released"]
    await _until(held, f"the first run takes the lease of {tid}")


def _looping_app(checkpointer: Any, steps: int, pause: float) -> Any:
    async def work(state: Counter) -> Counter:
        await asyncio.sleep(pause)
        state.count += 1
        return state

    g = StateGraph(Counter)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_conditional_edges("work", lambda s: END if s.count >= steps else "work", {"work": "work", END: END})
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
async def test_on_busy_interrupt_stops_the_holder_at_its_next_step(checkpointer: Any, make_thread: Any) -> None:
    app = _looping_app(checkpointer, steps=40, pause=0.05)
    tid = make_thread()
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("start")]},
                                            {"thread_id": tid, "recursion_limit": 100}, response_granularity="full"))
    await _lease_held(checkpointer, tid)
    second = await app.ainvoke({"messages": [Message.text_message("new input")]},
                               {"thread_id": tid, "on_busy": "interrupt", "busy_timeout": 10, "recursion_limit": 100},
                               response_granularity="full")
    got = await first
    assert got["state"].execution_meta.status == "interrupted_after"
    assert got["state"].execution_meta.interrupt_reason == "preempted"
    stopped_at = got["state"].count
    assert 0 < stopped_at < 40
    assert second["state"].execution_meta.status == "completed" and second["state"].count == 40
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert [m.text() for m in stored.context] == ["start", "new input"]


@pytest.mark.asyncio
async def test_preemption_waits_until_the_tool_calls_are_answered(checkpointer: Any, make_thread: Any) -> None:
    """The safe point is never between an assistant's tool calls and their results."""
    ran: list[str] = []

    async def lookup(q: str) -> str:
        ran.append(q)
        return f"found {q}"

    slow_app = tool_graph(AgentState, [lookup], [[call("c1", "lookup", {"q": "a"})]], checkpointer=checkpointer)
    tid = make_thread()
    first = asyncio.create_task(slow_app.ainvoke({"messages": [Message.text_message("one")]},
                                                 {"thread_id": tid, "failpoints": "after_step:model=delay(3000)"},
                                                 response_granularity="full"))

    async def calls_committed() -> bool:  # the model's tool calls are committed; the tools have not run
        state = await checkpointer.aget_state({"thread_id": tid})
        return state is not None and len(state.context) >= 2
    await _until(calls_committed, "the model step's commit")
    second = await slow_app.ainvoke({"messages": [Message.text_message("two")]},
                                    {"thread_id": tid, "on_busy": "interrupt"}, response_granularity="full")
    got = await first
    assert got["state"].execution_meta.interrupt_reason == "preempted"
    assert ran == ["a", "a"]  # the first turn's call, then the second turn's
    roles = [m.role for m in second["state"].context]
    assert roles[:4] == ["user", "assistant", "tool", "user"], roles


@pytest.mark.asyncio
async def test_lease_loss_failpoint_fences_the_holder(checkpointer: Any, make_thread: Any) -> None:
    """`lease_renew=raise` skips renewals (a partition): the lease expires, a waiting resume takes
    over and finishes; the old holder's commit is refused with LeaseLostError."""
    before = metrics.snapshot()
    # The holder's first step waits until the takeover is over, so its commit comes after its
    # lease lapsed (1 s; on SQLite plus the 10 s a renewal may wait for the file's write lock,
    # sqlite/lease.rs) and another run took the thread.
    release = asyncio.Event()

    async def work(state: Counter, config: dict[str, Any]) -> Counter:
        if config["run_id"] == "holder":
            await release.wait()
        state.count += 1
        return state

    g = StateGraph(Counter)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_conditional_edges("work", lambda s: END if s.count >= 2 else "work", {"work": "work", END: END})
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread()
    holder = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("go")]},
                                             {"thread_id": tid, "lease_ttl": 1.0, "failpoints": "lease_renew=raise",
                                              "run_id": "holder"}))
    await _lease_held(checkpointer, tid)
    with pytest.raises(ThreadBusyError) as busy:
        await app.ainvoke({}, {"thread_id": tid})
    assert busy.value.error_code == "STORAGE_BUSY_002" and busy.value.context["lease_token"] >= 1
    taken = await app.ainvoke({}, {"thread_id": tid, "on_busy": "wait", "busy_timeout": 30},
                              response_granularity="full")
    release.set()
    assert taken["state"].execution_meta.status == "completed" and taken["state"].count == 2
    with pytest.raises(LeaseLostError) as lost:
        await holder
    assert lost.value.error_code == "STORAGE_FENCED_001"
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.count == 2 and stored.execution_meta.status == "completed"
    after = metrics.snapshot()
    assert after["tenxgraph.lease.fenced_writes"] > before["tenxgraph.lease.fenced_writes"]
    assert after["tenxgraph.lease.busy_rejections"] > before["tenxgraph.lease.busy_rejections"]
    lease = await checkpointer.aget_lease({"thread_id": tid})
    assert lease is not None and lease["released"] and lease["token"] >= 2


@pytest.mark.asyncio
async def test_a_lease_just_taken_is_never_taken_over_by_this_process(checkpointer: Any, make_thread: Any) -> None:
    """The holder has taken its lease and not loaded yet (`after_lease` delay): a second run of the
    same process must see a live holder and be refused, not take it for dead and steal it (two
    concurrent runs of one process once both committed, the first then fenced)."""
    app = _looping_app(checkpointer, steps=1, pause=0.0)
    tid = make_thread()
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("go")]},
                                            {"thread_id": tid, "failpoints": f"after_lease:{tid}=delay(3000)"},
                                            response_granularity="full"))
    await _lease_held(checkpointer, tid)
    taken = await checkpointer.aget_lease({"thread_id": tid})
    assert taken is not None and not taken["released"]
    with pytest.raises(ThreadBusyError) as busy:
        await app.ainvoke({"messages": [Message.text_message("also go")]}, {"thread_id": tid})
    assert busy.value.error_code == "STORAGE_BUSY_002" and busy.value.context["lease_token"] == taken["token"]
    done = await first
    assert done["state"].execution_meta.status == "completed" and done["state"].count == 1
    lease = await checkpointer.aget_lease({"thread_id": tid})
    assert lease is not None and lease["token"] == taken["token"] and lease["released"]


@pytest.mark.asyncio
async def test_a_run_that_dies_right_after_taking_its_lease_leaves_it_to_the_next_run(
    checkpointer: Any, make_thread: Any
) -> None:
    from tenxgraph.core.exceptions import FailpointError

    app = _looping_app(checkpointer, steps=1, pause=0.0)
    tid = make_thread()
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [Message.text_message("go")]},
                          {"thread_id": tid, "failpoints": f"after_lease:{tid}=raise"})
    held = await checkpointer.aget_lease({"thread_id": tid})
    assert held is not None and held["token"] > 0 and not held["released"]
    # The holder was a run of this process that no longer runs: taken over now, not in lease_ttl.
    started = time.monotonic()
    done = await app.ainvoke({"messages": [Message.text_message("go again")]}, {"thread_id": tid},
                             response_granularity="full")
    assert time.monotonic() - started < 2.0
    assert done["state"].execution_meta.status == "completed" and done["state"].count == 1
    lease = await checkpointer.aget_lease({"thread_id": tid})
    assert lease is not None and lease["token"] > held["token"] and lease["released"]


@pytest.mark.asyncio
async def test_a_cancelled_run_frees_the_thread_at_once(checkpointer: Any, make_thread: Any) -> None:
    app = _looping_app(checkpointer, steps=3, pause=0.2)
    tid = make_thread()
    task = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("go")]},
                                           {"thread_id": tid, "lease_ttl": 60}))

    async def input_committed() -> bool:
        return await checkpointer.aget_state({"thread_id": tid}) is not None
    await _until(input_committed, "the run's input commit")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = time.monotonic()
    done = await app.ainvoke({}, {"thread_id": tid}, response_granularity="full")
    assert done["state"].count == 3
    assert time.monotonic() - started < 5  # not the 60 s lease: this process knows it holds nothing


class _PayCancelsItsRun:
    """A turn whose ``pay`` cancels its own run as it returns (the client leaves then), beside
    ``slow``, whose cancellation takes as long as ``unwind()``: the cancelled run records
    ``pay``'s result only after that. ``ran_again`` is set if ``pay`` runs a second time."""

    def __init__(self, checkpointer: Any, thread: str, unwind: Any) -> None:
        self.effects: dict[str, int] = {}
        self.unwinding, self.ran_again = asyncio.Event(), asyncio.Event()
        self.cfg = {"thread_id": thread}
        self._task: asyncio.Future[Any] | None = None
        cancelled_once = False

        async def pay(idempotency_key: str) -> str:
            self.effects["pay"] = self.effects.get("pay", 0) + 1
            if self.effects["pay"] > 1:
                self.ran_again.set()
            else:
                assert self._task is not None
                self._task.cancel()
            return "paid"

        async def slow(idempotency_key: str) -> str:
            nonlocal cancelled_once
            if cancelled_once:
                return "slow done"
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled_once = True
                self.unwinding.set()
                await unwind()
                raise
            return "never"

        self.app = tool_graph(AgentState, [slow, pay], [[call("c1", "slow"), call("c2", "pay")]],
                              checkpointer=checkpointer)

    def start(self) -> asyncio.Future[Any]:
        self._task = asyncio.ensure_future(self.app.ainvoke({"messages": [Message.text_message("go")]}, dict(self.cfg)))
        return self._task


@pytest.mark.asyncio
@pytest.mark.parametrize("on_busy", ["wait", "reject"])
async def test_a_resume_beside_a_cancelled_run_waits_for_its_late_ledger_writes(
        checkpointer: Any, make_thread: Any, on_busy: str) -> None:
    """``pay`` returns as its run is cancelled (the run's future drops its ledger write); its
    sibling ``slow`` takes a while to unwind, so the cancelled run's ``record_finished_tools``
    writes ``pay``'s result only after it. A resume of this process, started as the cancel
    lands, must wait for that write: red-team of session 23 (a stream dropped without
    ``aclose()`` beside a waiting resume) saw it take the thread at once and fire ``pay`` again.
    With ``"reject"`` (the caller's own retry) it must not be refused by its own cancelled run."""
    let_go = asyncio.Event()
    run = _PayCancelsItsRun(checkpointer, make_thread("settle"),
                            lambda: asyncio.wait_for(let_go.wait(), 4))  # under record_finished_tools' 5 s
    app, cfg, effects, ran_again = run.app, run.cfg, run.effects, run.ran_again
    task = run.start()
    await asyncio.wait_for(run.unwinding.wait(), 60)
    retry = asyncio.ensure_future(app.ainvoke({}, {**cfg, "on_busy": on_busy}))
    # Before the fix the retry ran pay again here; give it the time to (or to be refused).
    again = asyncio.ensure_future(ran_again.wait())
    await asyncio.wait({retry, again}, timeout=1.5, return_when=asyncio.FIRST_COMPLETED)
    again.cancel()
    assert not retry.done(), f"the retry did not wait for the cancelled run: {retry.exception() if retry.done() else ''}"
    let_go.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 60)
    done = await asyncio.wait_for(retry, 60)
    assert tool_texts(done["messages"])["c2"] == "paid"
    assert effects == {"pay": 1}, f"pay returned before the cancel and ran again on the resume: {effects}"


@pytest.mark.asyncio
async def test_a_sync_invoke_that_blocks_the_loop_of_a_cancelled_run_says_why_it_is_busy(
        checkpointer: Any, make_thread: Any) -> None:
    """A sync ``invoke()`` made inside a coroutine right after cancelling a run there: the
    cancelled run records its returned tools on this loop, which the sync call blocks, so it waits
    ``busy_timeout`` in vain. The error must say so (it read "another execution holds it", naming
    no one), and nothing may run twice: the async retry after it finds ``pay`` recorded."""
    run = _PayCancelsItsRun(checkpointer, make_thread("settle-sync"), lambda: asyncio.sleep(0.05))
    app, cfg, effects = run.app, run.cfg, run.effects
    task = run.start()
    await asyncio.wait_for(run.unwinding.wait(), 60)
    with pytest.raises(ThreadBusyError) as err:
        app.invoke({}, {**cfg, "busy_timeout": 0.3})  # blocks this loop: on purpose
    assert err.value.error_code == "STORAGE_BUSY_003"
    assert "cancelled" in str(err.value) and "ainvoke" in str(err.value), str(err.value)
    assert err.value.context.get("settling") is True, err.value.context
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 60)
    done = await asyncio.wait_for(app.ainvoke({}, dict(cfg)), 60)
    assert tool_texts(done["messages"])["c2"] == "paid"
    assert effects == {"pay": 1}, effects


@pytest.mark.asyncio
@pytest.mark.parametrize("started", [False, True], ids=["before-the-tool-started", "while-the-tool-ran"])
async def test_an_at_most_once_call_its_cancelled_run_never_started_runs_on_resume(
        checkpointer: Any, make_thread: Any, started: bool) -> None:
    """The run is cancelled after the tool node committed the call's intent row ("started") but
    before the tool was handed over (a stream left then: red-team of session 23 saw 1-3 such calls
    in 25-40 rounds). The call never ran, so the resume runs it; it used to answer it with
    ``TOOL_OUTCOME_UNKNOWN``, and the payment the model asked for was never made. A call that did
    start when the run was cancelled still reads as unknown and is not run again."""
    effects: dict[str, int] = {}
    entered = asyncio.Event()

    @tool(side_effects="at_most_once")
    async def pay() -> str:
        effects["pay"] = effects.get("pay", 0) + 1
        entered.set()
        if started and effects["pay"] == 1:
            await asyncio.sleep(3600)
        return "paid"

    app = tool_graph(AgentState, [pay], [[call("c1", "pay")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("unstarted")}
    # Held just before the call is handed to the tool, after its intent row is committed.
    first = {**cfg, "failpoints": "before_tool:pay=delay(120000)"} if not started else dict(cfg)
    task = asyncio.ensure_future(app.ainvoke({"messages": [Message.text_message("pay")]}, first))

    async def intent_written() -> bool:
        state = await checkpointer.aget_state(cfg)
        if state is None or not state.context or not state.context[-1].tools_calls:
            return False
        key = f"{state.context[-1].message_id}:c1"
        return await checkpointer.aget_tool_status(cfg, key) == "started"
    await _until(intent_written, "the call's intent row")
    if started:
        await asyncio.wait_for(entered.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    done = await asyncio.wait_for(app.ainvoke({}, cfg), 60)
    text = str(tool_texts(done["messages"])["c1"])
    if started:
        assert effects == {"pay": 1} and "TOOL_OUTCOME_UNKNOWN" in text, (effects, text)
    else:
        assert effects == {"pay": 1} and text == "paid", (effects, text)


@pytest.mark.asyncio
async def test_streams_left_early_never_leave_an_unstarted_at_most_once_call_unknown(
        checkpointer: Any, make_thread: Any) -> None:
    """A stream left at its second event (``aclose()``), then ``ainvoke({})``, 40 times: wherever
    the run was cut off, an at-most-once call whose tool never ran is run by the resume, and none
    runs twice. Red-team of session 24: 10-22 of 40 read ``TOOL_OUTCOME_UNKNOWN`` though ``pay``
    never ran (the cancelled run read its ledger before its in-flight intent commit landed, or the
    tool task it had handed over was cancelled before it began)."""
    ran: dict[str, int] = {}

    @tool(side_effects="at_most_once")
    async def pay(config: dict) -> str:
        ran[config["thread_id"]] = ran.get(config["thread_id"], 0) + 1
        return "paid"

    async def lookup() -> str:
        await asyncio.sleep(0.01)
        return "looked"

    app = tool_graph(AgentState, [pay, lookup], [[call("c_pay", "pay"), call("c_look", "lookup")]],
                     checkpointer=checkpointer)
    unknown = []
    for n in range(40):
        tid = make_thread(f"left-{n}")
        stream = app.astream({"messages": [Message.text_message("go", message_id=f"{tid}-m")]}, {"thread_id": tid})
        seen = 0
        async for _ in stream:
            seen += 1
            if seen >= 2:
                break
        await stream.aclose()
        done = await asyncio.wait_for(app.ainvoke({}, {"thread_id": tid, "on_busy": "wait"}), 60)
        answer = str(tool_texts(done["messages"]).get("c_pay") or tool_texts(
            (await checkpointer.aget_state({"thread_id": tid})).context).get("c_pay"))
        assert ran.get(tid, 0) <= 1, f"round {n}: pay ran twice"
        if ran.get(tid, 0) == 0:
            unknown.append((n, answer[:60]))
    assert not unknown, f"pay never ran, yet the resume did not run it: {unknown}"


# --------------------------------------------------------------------------- side-effect classes


@pytest.mark.asyncio
async def test_at_most_once_fails_closed_when_the_ledger_cannot_be_read(tmp_path: Path, make_thread: Any) -> None:
    import sqlite3

    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    counts: dict[str, int] = {}

    @tool(side_effects="at_most_once")
    async def pay() -> str:
        counts["pay"] = counts.get("pay", 0) + 1
        return "paid"

    async def look() -> str:
        counts["look"] = counts.get("look", 0) + 1
        return "looked"

    db = tmp_path / "broken.db"
    cp = SqliteCheckpointer(db)
    app = tool_graph(AgentState, [pay, look], [[call("c1", "pay"), call("c2", "look")]], checkpointer=cp)
    cp.setup()
    with sqlite3.connect(db) as c:
        c.execute("DROP TABLE tool_executions")
    r = await app.ainvoke({"messages": [Message.text_message("x")]}, {"thread_id": make_thread()})
    texts = tool_texts(r["messages"])
    assert "pay" not in counts and counts["look"] == 1
    assert "TOOL_LEDGER_UNAVAILABLE" in str(texts["c1"]) and texts["c2"] == "looked"


@pytest.mark.asyncio
async def test_pure_tools_never_touch_the_ledger(checkpointer: Any, make_thread: Any) -> None:
    @tool(side_effects="pure")
    async def add(a: int, b: int) -> int:
        return a + b

    app = tool_graph(AgentState, [add], [[call("c1", "add", {"a": 1, "b": 2})]], checkpointer=checkpointer)
    tid = make_thread()
    r = await app.ainvoke({"messages": [Message.text_message("x")]}, {"thread_id": tid})
    assert tool_texts(r["messages"]) == {"c1": "3"}
    ask = next(m for m in r["messages"] if m.tools_calls)
    assert await checkpointer.aget_tool_status({"thread_id": tid}, f"{ask.message_id}:c1") is None


# --------------------------------------------------------------------------- retention


@pytest.mark.asyncio
async def test_pruning_under_a_pending_interrupt_keeps_the_run_resumable(checkpointer: Any, make_thread: Any) -> None:
    counts: dict[str, int] = {}

    async def charge() -> str:
        counts["charge"] = counts.get("charge", 0) + 1
        return "charged"

    async def confirm() -> str:
        answer = interrupt({"question": "send it?"})
        return f"confirmed: {answer}"

    app = tool_graph(AgentState, [charge, confirm], [[call("c1", "charge"), call("c2", "confirm")]],
                     checkpointer=checkpointer)
    paused_id, done_id = make_thread(), make_thread()
    done = await app.ainvoke({"messages": [Message.text_message("old")]}, {"thread_id": done_id},
                            response_granularity="full")
    assert done["state"].execution_meta.status == "interrupted_before"
    await app.ainvoke({"resume": "yes"}, {"thread_id": done_id})  # finished: prunable
    await app.ainvoke({"messages": [Message.text_message("pay")]}, {"thread_id": paused_id})
    assert counts["charge"] == 2
    dry = await checkpointer.aprune(keep_versions=1, finished_older_than=0, ledger_ttl=0, dry_run=True)
    report = await checkpointer.aprune(keep_versions=1, finished_older_than=0, ledger_ttl=0)
    assert dry == {**report, "dry_run": True}
    assert report["threads"] == 1 and report["ledger_rows"] >= 2 and report["state_versions"] >= 1
    assert await checkpointer.aget_state({"thread_id": done_id}) is None
    paused = await checkpointer.aget_state({"thread_id": paused_id})
    assert pending_interrupt(paused) is not None
    r = await app.ainvoke({"resume": "yes"}, {"thread_id": paused_id})
    assert tool_texts(r["messages"]) == {"c1": "charged", "c2": "confirmed: yes"}
    assert counts["charge"] == 2  # the sibling that finished before the pause was not run again


@pytest.mark.asyncio
async def test_a_deleted_thread_takes_its_free_lease_row_along_and_its_id_runs_again(
    checkpointer: Any, make_thread: Any
) -> None:
    """Before, the lease row outlived aclean_thread and aprune on every backend (a row, or ~1.4 KB
    of an in-memory store, per thread ever deleted). Now it goes with its thread, and the id used
    again gets a token above the old ones (tokens come from one counter per store)."""
    app = _looping_app(checkpointer, steps=1, pause=0.0)
    tid, pruned = make_thread("deleted"), make_thread("pruned")
    for t in (tid, pruned):
        await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": t})
    first = await checkpointer.aget_lease({"thread_id": tid})
    assert first is not None and first["released"]
    await checkpointer.aclean_thread({"thread_id": tid})
    assert await checkpointer.aget_lease({"thread_id": tid}) is None
    again = await app.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": tid},
                              response_granularity="full")
    assert again["state"].count == 1 and [m.text() for m in again["state"].context] == ["again"]
    lease = await checkpointer.aget_lease({"thread_id": tid})
    assert lease is not None and lease["released"] and lease["token"] > first["token"]
    report = await checkpointer.aprune(finished_older_than=0)
    assert report["threads"] >= 2 and isinstance(report["cache_entries"], int), report
    for t in (tid, pruned):
        assert await checkpointer.aget_lease({"thread_id": t}) is None
        assert await checkpointer.aget_state({"thread_id": t}) is None


@pytest.mark.asyncio
async def test_a_thread_deleted_while_its_run_holds_the_lease_loses_the_row_when_the_run_ends(
    checkpointer: Any, make_thread: Any
) -> None:
    """aclean_thread keeps a held lease row (its run is still fenced). Until session 21 that run's
    release then marked the row released and nothing ever deleted it: one row per thread deleted
    mid-run. Now the release deletes it; the run itself ends with STORAGE_FENCED_001 (until
    session 23 STORAGE_CONFLICT_001, as if another run had written the thread) and writes
    nothing back, as before."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def fast(state: AgentState) -> Message:
        return Message.text_message("fast", role="assistant")

    async def slow(state: AgentState) -> Message:
        entered.set()
        await release.wait()
        return Message.text_message("late", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("a", fast)
    g.add_node("b", slow)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("deleted-mid-run")}
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("hi")]}, cfg))
    await asyncio.wait_for(entered.wait(), 30)
    held = await checkpointer.aget_lease(cfg)
    assert held is not None and not held["released"]
    await checkpointer.aclean_thread(cfg)
    assert (await checkpointer.aget_lease(cfg))["token"] == held["token"]  # still fenced
    release.set()
    with pytest.raises(LeaseLostError, match="thread was deleted"):
        await asyncio.wait_for(run, 30)
    assert await checkpointer.aget_lease(cfg) is None
    assert await checkpointer.aget_state(cfg) is None
    r = await app.ainvoke({"messages": [Message.text_message("again")]}, cfg)  # the id runs again
    release.set()
    assert [m.text() for m in r["messages"]][-1] == "late"
    lease = await checkpointer.aget_lease(cfg)
    assert lease is not None and lease["released"] and lease["token"] > held["token"]


@pytest.mark.asyncio
async def test_a_thread_deleted_while_its_tool_runs_stays_deleted(checkpointer: Any, make_thread: Any) -> None:
    """Until session 21 the tool's ledger record, written when it returned, created the deleted
    thread again on every backend: alist_threads listed it, with the tool's result and no state,
    and its lease row stayed. Now a run's ledger write needs its thread: the run ends with a typed
    storage error, and nothing of the thread is left."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def charge(order_id: str) -> str:
        """Charges an order."""
        entered.set()
        await release.wait()
        return f"charged {order_id}"

    app = tool_graph(AgentState, [charge], [[call("c1", "charge", {"order_id": "o:1"})]], checkpointer=checkpointer)
    await _delete_mid_run(checkpointer, app, entered, release, {"thread_id": make_thread("deleted-mid-tool")})


async def _delete_mid_run(checkpointer: Any, app: Any, entered: asyncio.Event, release: asyncio.Event,
                          cfg: dict[str, Any]) -> None:
    """Deletes the thread while the run's node waits at ``entered``, lets the node go on, and
    checks the run ends as fenced with nothing of the thread left."""
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("pay")]}, cfg))
    await asyncio.wait_for(entered.wait(), 30)
    await checkpointer.aclean_thread(cfg)
    release.set()
    with pytest.raises(LeaseLostError, match="thread was deleted") as raised:
        await asyncio.wait_for(run, 30)
    assert raised.value.error_code == "STORAGE_FENCED_001"
    assert await checkpointer.aget_state(cfg) is None
    assert await checkpointer.aget_thread(cfg) is None
    assert cfg["thread_id"] not in [t.thread_id for t in await checkpointer.alist_threads({})]
    assert await checkpointer.aget_lease(cfg) is None


def _gated_model_app(checkpointer: Any) -> tuple[Any, asyncio.Event, asyncio.Event]:
    """A one-node graph whose node reports it started and waits until the test releases it."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def model(state: AgentState) -> AgentState:
        entered.set()
        await release.wait()
        return state

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=checkpointer), entered, release


@pytest.mark.asyncio
async def test_a_thread_deleted_while_its_model_node_runs_ends_the_run_as_fenced(checkpointer: Any,
                                                                                 make_thread: Any) -> None:
    """The step write of a run whose thread was deleted under it is refused like its ledger
    writes: LeaseLostError (the run no longer has a thread to own). Until session 23 a node
    without tools ended with StaleStateError "expected version 1, found 0", as if another run
    had written the thread, and a tool node with LeaseLostError."""
    app, entered, release = _gated_model_app(checkpointer)
    await _delete_mid_run(checkpointer, app, entered, release, {"thread_id": make_thread("deleted-mid-model")})


@pytest.mark.asyncio
async def test_a_state_cleared_under_a_run_is_still_a_stale_write(checkpointer: Any, make_thread: Any) -> None:
    """The other side of the rule above: aclear_state keeps the thread (its row, lease, ledger),
    so the run's next write finds another writer's change, StaleStateError, and the thread stays."""
    app, entered, release = _gated_model_app(checkpointer)
    cfg = {"thread_id": make_thread("cleared-mid-model")}
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("hi")]}, cfg))
    await asyncio.wait_for(entered.wait(), 30)
    await checkpointer.aclear_state(cfg)
    release.set()
    with pytest.raises(StaleStateError) as raised:
        await asyncio.wait_for(run, 30)
    assert raised.value.error_code == "STORAGE_CONFLICT_001"
    assert await checkpointer.aget_thread(cfg) is not None


_RESUME_ELSEWHERE = """
import asyncio, json, sys
from tenxgraph import END, START, AgentState, Message, StateGraph
from tests_py.crash_agents.lease_agent import open_db

async def main(db, tid):
    cp = open_db(db)
    async def model(state: AgentState) -> Message:
        return Message.text_message("resumed", role="assistant")
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    try:
        r = await g.compile(checkpointer=cp).ainvoke({}, {"thread_id": tid, "on_busy": "reject"})
        print(json.dumps({"outcome": "completed", "last": r["messages"][-1].text()}))
    except Exception as exc:
        print(json.dumps({"outcome": f"{type(exc).__name__}/{getattr(exc, 'error_code', None)}"}))
    await cp.arelease()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.asyncio
async def test_a_cancelled_run_frees_its_thread_for_other_processes_at_once(db: str, make_thread: Any) -> None:
    """A run cancelled by its caller (``task.cancel()`` of its ``ainvoke``) while its node ran:
    its lease row is released right away, so another process resumes the thread at once, even
    with ``on_busy="reject"``. Until session 23 only this process saw the thread free; the row
    stayed held (this process is alive) until ``lease_ttl``, and another process was refused
    (red-team: 190 of 252 cancelled runs' rows still held after every run had returned)."""
    cp = open_db(db)
    app, entered, _ = _gated_model_app(cp)
    tid = make_thread("cancelled")
    cfg = {"thread_id": tid, "lease_ttl": 120}
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("hi")]}, cfg))
    await asyncio.wait_for(entered.wait(), 30)
    held = await cp.aget_lease(cfg)
    assert held is not None and not held["released"]
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    deadline = time.monotonic() + 30  # a quarter of the lease's time
    while not (await cp.aget_lease(cfg))["released"]:
        assert time.monotonic() < deadline, "the cancelled run's lease is still held"
        await asyncio.sleep(0.05)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RESUME_ELSEWHERE, db, tid, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-4000:]
    assert json.loads(out.decode().strip().splitlines()[-1]) == {"outcome": "completed", "last": "resumed"}
    lease = await cp.aget_lease(cfg)
    assert lease["released"] and lease["token"] > held["token"]
    await cp.arelease()


# --------------------------------------------------------------------------- bad input


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", [{"on_busy": "sometimes"}, {"on_busy": None}, {"lease_ttl": 0}, {"lease_ttl": "5"},
                                 {"busy_timeout": True}, {"busy_timeout": -1}, {"lease_ttl": float("nan")}])
async def test_bad_lease_settings_are_refused_before_anything_is_written(checkpointer: Any, make_thread: Any,
                                                                          bad: dict[str, Any]) -> None:
    app = _looping_app(checkpointer, steps=1, pause=0)
    tid = make_thread()
    with pytest.raises(ValueError, match="on_busy|lease_ttl|busy_timeout"):
        await app.ainvoke({"messages": [Message.text_message("x")]}, {"thread_id": tid, **bad})
    assert await checkpointer.aget_state({"thread_id": tid}) is None
    assert await checkpointer.aget_lease({"thread_id": tid}) is None


def test_bad_side_effect_declarations_are_refused() -> None:
    with pytest.raises(ValueError, match="on_unknown"):
        tool(on_unknown="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only applies"):
        tool(side_effects="idempotent", on_unknown="interrupt")


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", [{"keep_versions": 0}, {"keep_versions": 1.5}, {"ledger_ttl": -1},
                                 {"finished_older_than": "old"}, {"finished_older_than": float("nan")},
                                 {"ledger_ttl": float("inf")}])
async def test_bad_prune_rules_are_refused(checkpointer: Any, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        await checkpointer.aprune(**bad)
