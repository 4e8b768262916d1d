"""Red team B: SIGKILL at random moments (not at failpoints) in human-in-the-loop and multi-worker
flows, real processes, real SIGKILL, effects counted outside the processes (EffectCounter:
O_APPEND + flock + fsync per effect). The agent is tests_py/hitl_agent.py: one assistant
message with four calls (a sync lookup, an async notify, an async refund that asks for approval
and a sync wire that asks and is declined), optionally a static interrupt_before=["tools"], wire
optionally at_most_once, through ainvoke or astream (low / partial / full).

Seeded: TENXGRAPH_REDTEAM_SEED (default 20261203), TENXGRAPH_REDTEAM_ROUNDS rounds per backend
(default 2). Run from /work/main:

    .venv/bin/python -m pytest tests_py/test_redteam_hitl_kills.py -p no:cacheprovider -q -s
"""

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
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import hitl_agent  # noqa: E402
from tenxgraph.testing import EffectCounter  # noqa: E402
from tenxgraph.testing._children import child_env  # noqa: E402
from tenxgraph.utils import pending_interrupt  # noqa: E402
from tests_py.redteam.rounds import labelled, ledger, reader, wait_backends_gone  # noqa: E402

SEED = int(os.environ.get("TENXGRAPH_REDTEAM_SEED", "20261203"))
ROUNDS = int(os.environ.get("TENXGRAPH_REDTEAM_ROUNDS", "2"))
AGENT = HERE / "hitl_agent.py"
START_TIMEOUT = 120.0
RUN_TIMEOUT = 120.0
EFFECT_OF = {"l1": "lookup", "n1": "notify", "r1": "refund", "w1": "wire"}


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else str(tmp_path / "hitl.db")


# --------------------------------------------------------------------------- children


class Child:
    def __init__(self, workdir: Path, label: str, spec: dict[str, Any], env: dict[str, str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.label = label
        self.ready = workdir / f"{label}.ready"
        self.result_path = workdir / f"{label}.result.json"
        self.err_path = workdir / f"{label}.stderr"
        spec = {**spec, "ready": str(self.ready), "result": str(self.result_path)}
        spec_path = workdir / f"{label}.spec.json"
        spec_path.write_text(json.dumps(spec))
        self._err = open(self.err_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, str(AGENT), str(spec_path)], env=child_env(env=env),
                                     stdout=subprocess.DEVNULL, stderr=self._err, cwd=str(HERE))

    def wait_file(self, path: Path, timeout: float = START_TIMEOUT) -> bool:
        """Polls for a file the child touches (its start-up takes seconds); False if it exited."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                return path.exists()
            assert time.monotonic() < deadline, f"{self.label}: {path.name} never appeared"
            time.sleep(0.002)
        return True

    def kill_after(self, delay: float) -> None:
        if self.wait_file(self.ready) and self.proc.poll() is None:
            time.sleep(delay)  # the random moment itself, not a wait for something
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)

    def kill_now(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

    def finish(self) -> tuple[bool, dict[str, Any] | None]:
        try:
            rc = self.proc.wait(timeout=RUN_TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._err.close()
        killed = rc == -signal.SIGKILL
        result = json.loads(self.result_path.read_text()) if self.result_path.exists() else None
        if not killed and result is None:
            raise AssertionError(f"{self.label} exited {rc} without a result:\n{self.err_path.read_text()[-4000:]}")
        return killed, result

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")[-4000:]


def variant_env(effects: EffectCounter, *, static: bool = False, amo: bool = False, simple: bool = False,
                **more: str) -> dict[str, str]:
    env = {"TENXGRAPH_EFFECTS": str(effects.path), "HITL_STATIC": "1" if static else "0",
           "HITL_WIRE_AMO": "1" if amo else "0", "HITL_SIMPLE": "1" if simple else "0"}
    env.update(more)
    return env


def status_of(state: Any) -> str | None:
    return None if state is None else str(state.execution_meta.status).split(".")[-1].lower()


def state_of(db: str, tid: str) -> Any:
    async def go() -> Any:
        cp = reader(db)
        try:
            return await cp.aget_state({"thread_id": tid})
        finally:
            await cp.arelease()

    return asyncio.run(go())


def statuses(db: str, tid: str) -> dict[str, str | None]:
    async def go() -> dict[str, str | None]:
        cp = reader(db)
        try:
            return await ledger(cp, tid)
        finally:
            await cp.arelease()

    return asyncio.run(go())


def versions(db: str, tid: str) -> list[int]:
    async def go() -> list[int]:
        cp = reader(db)
        try:
            return [v for v, _, _ in await cp._native.state_versions(tid, "anonymous")]
        finally:
            await cp.arelease()

    return asyncio.run(go())


def well_formed(context: list[Any]) -> str | None:
    """Every assistant message with tool calls is followed, at once, by one tool result per call
    (a context that ends with the calls still unanswered is a run under way: not flagged)."""
    for i, m in enumerate(context):
        if m.role == "assistant" and m.tools_calls:
            want = [c.get("id") for c in m.tools_calls]
            got = []
            ended = True
            for n in context[i + 1:]:
                if n.role != "tool":
                    ended = False
                    break
                got += list(hitl_agent.tool_outputs([n]))
            if sorted(got) != sorted(want) and not (ended and set(got) <= set(want)):
                return f"message {i} asked for {want}, followed by results for {got}: {[x.role for x in context]}"
    return None


def golden(db: str, tmp_path: Path, *, static: bool, amo: bool = False) -> tuple[float, Any]:
    """The flow never killed, in this process: its length and its final state."""
    effects = EffectCounter(tmp_path / "golden-effects.jsonl")
    env = variant_env(effects, static=static, amo=amo)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    tid = f"golden-{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(hitl_agent.child({"db": db, "thread_id": tid + "-warm", "mode": "flow"}))
        effects.clear()
        started = time.perf_counter()
        report = asyncio.run(hitl_agent.child({"db": db, "thread_id": tid, "mode": "flow"}))
        span = time.perf_counter() - started
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert report["outcome"] == "ok", report
    assert effects.counts() == {"lookup": 1, "notify": 1, "refund": 1}, effects.counts()
    return span, state_of(db, tid)


def streamed(chunks: Path) -> list[dict[str, Any]]:
    if not chunks.exists():
        return []
    out = []
    for line in chunks.read_bytes().split(b"\n")[:-1]:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


# --------------------------------------------------------------------------- 1 + 3 + 4: random kills


def test_random_kills_across_pauses_answers_and_tools(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    """Each round: one thread through the whole HITL flow (static review, two approvals, sync +
    async tools in the same node), the client process SIGKILLed at a random moment, then resumed
    by fresh processes (now and then two at once, or killed again) until the thread completes.
    Checked after every kill and at the end: the three promises, the answers, the stream."""
    seed = SEED + (1 if db.startswith("postgres") else 0)
    rng = random.Random(seed)
    span, gold = golden(db, tmp_path, static=True)
    gold_roles = [m.role for m in gold.context]
    gold_texts = [m.text() for m in gold.context]
    print(f"\n[{'pg' if db.startswith('postgres') else 'sqlite'}] seed {seed}, golden flow {span:.2f}s")
    kills = 0
    report = []
    for r in range(ROUNDS):
        static, amo = r % 2 == 0, (r // 2) % 2 == 1
        stream = [None, "low", "partial", "full"][(r + (seed % 4)) % 4]
        env = variant_env(effects, static=static, amo=amo)
        scale = 1.3
        for redo in range(4):
            effects.clear()
            tid = f"r{r}-{redo}-{uuid.uuid4().hex[:6]}"
            chunks = tmp_path / f"{tid}.chunks.jsonl"
            windows = dict.fromkeys(EFFECT_OF, 0)
            done_at: dict[str, int] = {}
            cut_off: set[str] = set()
            attempt = killed = 0
            log = []
            while True:
                st = state_of(db, tid)
                if attempt > 0 and status_of(st) == "running" and rng.random() < 0.3:
                    # Two fresh processes resume the crashed run at once.
                    on_busy = rng.choice(["reject", "wait"])
                    bar = tmp_path / f"{tid}-bar{attempt}"
                    bar.mkdir()
                    pair = [Child(tmp_path / tid, f"pair{attempt}-{i}", {
                        "db": db, "thread_id": tid, "mode": "resume_running", "stream": stream, "chunks": str(chunks),
                        "config": {"on_busy": on_busy, "busy_timeout": 30},
                        "barrier": {"dir": str(bar), "index": i, "workers": 2}}, env) for i in range(2)]
                    before = effects.counts()
                    outs = [c.finish()[1] for c in pair]
                    codes = sorted((o["outcome"], (o.get("error") or {}).get("code")
                                    or ("paused" if "paused at interrupt" in (o.get("error") or {}).get("message", "") else None))
                                   for o in outs)
                    log.append(f"pair({on_busy}): {codes}")
                    # The second may find the thread paused at the next interrupt() by the first:
                    # its {} is refused ("Resume it with {'resume': value}"), nothing written.
                    allowed = {("ok", None), ("error", "STORAGE_BUSY_002"), ("error", "paused")}
                    assert set(codes) <= allowed and ("ok", None) in codes, (seed, r, tid, outs)
                    after = effects.counts()
                    for cid, name in EFFECT_OF.items():
                        if cid in done_at:
                            assert after.get(name, 0) == before.get(name, 0), (seed, r, tid, cid, "ran again")
                    attempt += 1
                    continue
                kill = rng.uniform(0, span * scale) if attempt == 0 or (killed <= 2 and rng.random() < 0.35) else None
                before = effects.counts()
                name = f"tenx-hitl-{tid}-a{attempt}"
                child = Child(tmp_path / tid, f"a{attempt}", {
                    "db": labelled(db, name), "thread_id": tid, "mode": "flow", "stream": stream,
                    "chunks": str(chunks), "reconnect": kill is None}, env)
                if kill is not None:
                    child.kill_after(kill)
                was_killed, result = child.finish()
                attempt += 1
                if not was_killed:
                    assert result["outcome"] == "ok", (seed, r, tid, result, child.stderr())
                    log.append("completed")
                    break
                wait_backends_gone(db, name)
                marks = [c for c in streamed(chunks) if c.get("pid") == child.proc.pid]
                in_run = any("begin" in c for c in marks) and "end" not in marks[-1]
                if not in_run:
                    log.append(f"killed at {kill:.3f}s outside a run (before its first or after its last)")
                    if status_of(state_of(db, tid)) == "completed":
                        break
                    continue
                kills += 1
                killed += 1
                after = effects.counts()
                status = statuses(db, tid)
                st = state_of(db, tid)
                log.append(f"killed at {kill:.3f}s: thread {status_of(st)}"
                           f"{' pending ' + pending_interrupt(st).key if st is not None and pending_interrupt(st) else ''},"
                           f" ledger {status}, effects {after}")
                for cid, ename in EFFECT_OF.items():
                    if status.get(cid) == "completed":
                        done_at.setdefault(cid, after.get(ename, 0))
                    elif after.get(ename, 0) > before.get(ename, 0):
                        windows[cid] += 1
                    if status.get(cid) == "started":
                        cut_off.add(cid)
                # Promise: every streamed message a crash could undo is not shown (docs/concepts.md,
                # Streaming): what the killed process streamed is durable.
                if stream:
                    durable = {str(m.message_id) for m in (st.context if st else [])}
                    for c in streamed(chunks):
                        if c.get("pid") != result_pid(child) or "id" not in c or c.get("delta"):
                            continue
                        if c.get("status") == "invoking_graph":
                            continue  # the caller's own input, echoed before its commit
                        if c.get("role") == "tool" and c.get("results"):
                            [cid] = list(c["results"])
                            assert c["id"] in durable or status.get(cid) == "completed", (
                                seed, r, tid, "streamed a tool result a crash undid", c, status)
                        else:
                            assert c["id"] in durable, (seed, r, tid, "streamed a message a crash undid", c)
            if killed:
                break
            scale *= 0.5
        assert killed, f"round {r}: no kill landed inside a run in 4 tries"
        ctx = f"seed {seed} round {r} ({tid}, static={static}, amo={amo}, stream={stream}): " + "; ".join(log)
        final = state_of(db, tid)
        n = effects.counts()
        ctx += f"\n effects {n}, windows {windows}, recorded at {done_at}, cut off {cut_off}"
        assert status_of(final) == "completed", ctx
        assert [m.role for m in final.context] == gold_roles, ctx
        ids = [str(m.message_id) for m in final.context]
        assert len(ids) == len(set(ids)), ctx
        assert well_formed(final.context) is None, ctx
        # The approvals: refund ran only with its own approval, wire never, no answer misapplied.
        assert n.get("misapplied", 0) == 0, ctx + f"\n{effects.all('misapplied')}"
        assert n.get("wire", 0) == 0, ctx
        assert all(e.data["answer"] == hitl_agent.APPROVE_REFUND for e in effects.all("refund")), ctx
        for cid, ename in EFFECT_OF.items():
            if ename == "wire":
                continue
            assert n.get(ename, 0) == 1 + windows[cid], ctx + f"\n {cid} ran outside a kill window"
            if cid in done_at:
                assert n.get(ename, 0) == done_at[cid], ctx + f"\n {cid} ran again after its ledger row"
        if not (amo and "w1" in cut_off):
            assert [m.text() for m in final.context] == gold_texts, ctx
        vs = versions(db, tid)
        assert sorted(vs) == list(range(min(vs), max(vs) + 1)) and len(vs) == len(set(vs)), (ctx, vs)
        if stream:
            got = streamed(chunks)
            # The final answer reaches a streaming client: the one that finished the thread, or the
            # last one, which reconnected with {} (observed, not asserted here: see
            # test_astream_of_a_finished_thread_yields_its_answer).
            final_seen = any(c.get("id") == ids[-1] for c in got)
            report.append(f"round {r} stream={stream}: final message streamed: {final_seen}")
            shown: dict[str, int] = {}
            for c in got:
                if "id" in c and not c.get("delta") and c.get("status") != "invoking_graph":
                    shown[c["id"]] = shown.get(c["id"], 0) + 1
            again = {k: v for k, v in shown.items() if v > 1}
            report.append(f"round {r} stream={stream}: {len(again)} message id(s) streamed more than once "
                          f"({sorted(again.values())})")
        report.append(ctx)
    print("\n".join(report))
    print(f"kills: {kills}")
    assert kills >= ROUNDS


def result_pid(child: Child) -> int:
    return child.proc.pid


def result_pid_of(workdir: Path) -> int | None:
    """The pid of the child that completed the flow (its result file says so)."""
    done = None
    for p in sorted(workdir.glob("a*.result.json"), key=lambda p: p.stat().st_mtime):
        r = json.loads(p.read_text())
        if r.get("outcome") == "ok" and r.get("status") == "completed":
            done = r["pid"]
    return done


# --------------------------------------------------------------------------- 1: the answer


def _to_pause(db: str, tmp_path: Path, tid: str, env: dict[str, str], until_key: str) -> None:
    """Drives the thread with single sends until it waits at ``until_key``."""
    for i in range(6):
        st = state_of(db, tid)
        p = pending_interrupt(st) if st is not None else None
        if p is not None and p.key == until_key:
            return
        inp = hitl_agent.next_input(st)
        c = Child(tmp_path / tid, f"drive{i}", {"db": db, "thread_id": tid, "mode": "once",
                                                "input": json.loads(json.dumps(inp, default=lambda o: o.model_dump(mode="json")))}, env)
        killed, res = c.finish()
        assert not killed and res["outcome"] == "ok", (res, c.stderr())
    raise AssertionError(f"never paused at {until_key}")


def test_a_retried_approval_is_not_applied_to_the_next_question(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    """The client sends "approve the refund"; the process approves it, runs the refund and stores
    the next pause (the wire's question), and is SIGKILLed before the client hears back (here: by
    a file the refund's effect line appears in, then the pause commit). The client retries its
    answer, as after any lost response. The retry must be refused (it answers a question that
    is no longer pending); it must not become the answer to the wire's question."""
    env = variant_env(effects)
    tid = f"retry-{uuid.uuid4().hex[:8]}"
    _to_pause(db, tmp_path, tid, env, "tool:r1:0")
    # The answer names the question it answers (`interrupt_id`, docs/concepts.md "Interrupts").
    answer = {"resume": hitl_agent.APPROVE_REFUND, "interrupt_id": pending_interrupt(state_of(db, tid)).id}
    first = Child(tmp_path / tid, "answer", {"db": db, "thread_id": tid, "mode": "once", "input": answer}, env)
    # Kill once the wire's question is stored (the thread's pending interrupt moved to w1).
    deadline = time.monotonic() + RUN_TIMEOUT
    while first.proc.poll() is None:
        st = state_of(db, tid)
        p = pending_interrupt(st) if st is not None else None
        if p is not None and p.tool_call_id == "w1":
            first.kill_now()
            break
        assert time.monotonic() < deadline
        time.sleep(0.01)  # polled: the child's progress is read from the database
    first.finish()
    st = state_of(db, tid)
    assert pending_interrupt(st).tool_call_id == "w1", "the first answer was not applied"
    assert effects.count("refund") == 1
    retry = Child(tmp_path / tid, "retry", {"db": db, "thread_id": tid, "mode": "once", "input": answer}, env)
    _, res = retry.finish()
    print(f"\nretry outcome: {res.get('outcome')} {res.get('error')}; effects {effects.counts()}")
    assert effects.count("misapplied") == 0 and effects.count("wire") == 0, (
        f"the retried refund approval was taken as the wire's answer: {effects.all('misapplied')} "
        f"{effects.all('wire')}; retry: {res}")
    assert res["outcome"] == "error", res


def test_two_workers_answer_the_same_question_at_once(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    """Two API workers get the same "approve the refund" (a client retry landing on another worker
    while the first is still at it), with on_busy="wait". The refund is approved once; the second
    must not become the answer to the wire's question that the first one's run stores."""
    env = variant_env(effects)
    tid = f"pair-{uuid.uuid4().hex[:8]}"
    _to_pause(db, tmp_path, tid, env, "tool:r1:0")
    bar = tmp_path / "bar"
    bar.mkdir()
    answer = {"resume": hitl_agent.APPROVE_REFUND, "interrupt_id": pending_interrupt(state_of(db, tid)).id}
    pair = [Child(tmp_path / tid, f"w{i}", {"db": db, "thread_id": tid, "mode": "once",
                                           "input": answer,
                                           "config": {"on_busy": "wait", "busy_timeout": 30},
                                           "barrier": {"dir": str(bar), "index": i, "workers": 2}}, env)
            for i in range(2)]
    outs = [c.finish()[1] for c in pair]
    print(f"\noutcomes: {[(o['outcome'], o.get('error')) for o in outs]}; effects {effects.counts()}")
    assert effects.count("refund") == 1
    assert effects.count("misapplied") == 0 and effects.count("wire") == 0, (
        f"one worker's refund approval answered the wire's question: {effects.all('misapplied')}; {outs}")


# --------------------------------------------------------------------------- 2: stop and new turns


@pytest.mark.parametrize("how", ["stop-then-turn", "stop-and-preempt", "review-then-turn"])
def test_stop_in_a_tool_node_then_a_new_turn(db: str, tmp_path: Path, effects: EffectCounter, how: str) -> None:
    """A run is inside its tool node (notify hangs after its effect; lookup, sync, runs beside it).
    Another process stops it (astop); a new turn arrives, after the stop has ended the run
    (default on_busy) or at once with on_busy="interrupt". ("review-then-turn": no stop; the thread
    waits at a static interrupt_before=["tools"] and the reviewer sends a new message instead of
    approving.) The new user message must not land between the assistant's tool calls and their
    results (docs/concepts.md: that is why new input for a crashed run is refused), and the
    thread must stay usable: ``{}`` finishes it, and the next turn completes."""
    tid = f"stop-{uuid.uuid4().hex[:8]}"
    hang = tmp_path / "hang"
    first = {"messages": [hitl_agent.Message.text_message("o-1").model_dump(mode="json")]}
    static = how == "review-then-turn"
    env = variant_env(effects, simple=True, static=static)
    a = Child(tmp_path / tid, "a", {"db": db, "thread_id": tid, "mode": "once", "input": first},
              variant_env(effects, simple=True, static=static, HITL_HANG=str(hang)))
    if not static:
        assert a.wait_file(hang), a.stderr()
        assert asyncio.run(_stop(db, tid))["running"] is True
    turn = {"messages": [hitl_agent.Message.text_message("o-2").model_dump(mode="json")]}
    if how == "stop-and-preempt":
        c = Child(tmp_path / tid, "c", {"db": db, "thread_id": tid, "mode": "once", "input": turn,
                                        "config": {"on_busy": "interrupt", "busy_timeout": 30}}, env)
        _, rc = c.finish()
        killed, ra = a.finish()
    else:
        killed, ra = a.finish()
        assert not killed and ra["status"] == ("interrupted_before" if static else "interrupted_after"), ra
        c = Child(tmp_path / tid, "c", {"db": db, "thread_id": tid, "mode": "once", "input": turn}, env)
        _, rc = c.finish()
    problems = []
    st = state_of(db, tid)
    roles = [m.role for m in st.context]
    print(f"\n{how}: new turn -> {rc.get('outcome')} {rc.get('error')}; thread {status_of(st)} {roles}")
    if well_formed(st.context) is not None:
        problems.append(f"the new turn landed between the tool calls and their results: {well_formed(st.context)}; "
                        f"new turn: {rc.get('error')}; thread {status_of(st)}")
    # The thread stays usable: finish what is there, then one more turn completes.
    fin = Child(tmp_path / tid, "fin", {"db": db, "thread_id": tid, "mode": "once", "input": {}}, env)
    _, rf = fin.finish()
    if rf["outcome"] != "ok" or rf["status"] != "completed":
        problems.append(f"ainvoke({{}}) cannot finish the thread: {rf.get('error')}, thread {rf.get('status')}")
    more = Child(tmp_path / tid, "more", {"db": db, "thread_id": tid, "mode": "once",
                                          "input": {"messages": [hitl_agent.Message.text_message("o-4").model_dump(mode="json")]}}, env)
    _, rm = more.finish()
    # With the static review gate, the next turn's tool calls wait at it again.
    if rm["outcome"] != "ok" or rm["status"] != ("interrupted_before" if static else "completed"):
        problems.append(f"the next turn fails too: {rm.get('error')}, thread {rm.get('status')}")
    st = state_of(db, tid)
    print(f"  then: {{}} -> {rf.get('outcome')} {rf.get('error')}; next turn -> {rm.get('outcome')} {rm.get('error')}; "
          f"thread {status_of(st)} {[m.role for m in st.context]}; effects {effects.counts()}")
    assert not problems, "\n".join(problems)


def test_random_stop_kill_and_new_turn(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    """A turn in a child; at random moments another process stops it, a third sends a new turn
    (on_busy random), and the first is SIGKILLed (each with some probability). Then the thread is
    finished by fresh processes. Checked: the context stays well formed, the new turn is stored
    once when it was accepted and not at all when refused, a recorded call never runs again, each
    call's effect at most once per kill that caught it, every version once."""
    seed = SEED + 7 + (1 if db.startswith("postgres") else 0)
    rng = random.Random(seed)
    env = variant_env(effects, simple=True, HITL_SLOW="0.4")  # the tool node lasts ~0.45 s
    span = 0.6
    problems = []
    for r in range(ROUNDS):
        effects.clear()
        tid = f"sr{r}-{uuid.uuid4().hex[:6]}"
        name = f"tenx-stop-{tid}"
        a = Child(tmp_path / tid, "a", {"db": labelled(db, name), "thread_id": tid, "mode": "once",
                                        "input": {"messages": [hitl_agent.Message.text_message(f"t1-{r}").model_dump(mode="json")]}}, env)
        assert a.wait_file(a.ready)
        events = []
        t0 = time.monotonic()
        plan = sorted([(rng.uniform(0, span), "stop")] * (rng.random() < 0.6)
                      + [(rng.uniform(0, span), "turn")] * (rng.random() < 0.8)
                      + [(rng.uniform(0, span), "kill")] * (rng.random() < 0.6))
        c = None
        on_busy = rng.choice(["reject", "wait", "interrupt"])
        for at, what in plan:
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            if what == "stop":
                asyncio.run(_stop(db, tid))
            elif what == "turn":
                c = Child(tmp_path / tid, "c", {"db": db, "thread_id": tid, "mode": "once",
                                                "input": {"messages": [hitl_agent.Message.text_message(f"t2-{r}").model_dump(mode="json")]},
                                                "config": {"on_busy": on_busy, "busy_timeout": 10}}, env)
            else:
                a.kill_now()
            events.append(f"{what}@{at:.2f}")
        killed_a, ra = a.finish()
        if killed_a:
            wait_backends_gone(db, name)
        rc = c.finish()[1] if c is not None else None
        ctx = f"seed {seed} round {r} {tid} on_busy={on_busy} {events}: a={'killed' if killed_a else ra and (ra.get('outcome'), ra.get('error'), ra.get('status'))} c={rc and (rc.get('outcome'), rc.get('error'))}"
        st = state_of(db, tid)
        if st is not None and well_formed(st.context) is not None:
            problems.append(ctx + f"\n  ill-formed after the race: {well_formed(st.context)}")
        fin = Child(tmp_path / tid, "fin", {"db": db, "thread_id": tid, "mode": "flow", "text": f"t1-{r}"}, env)
        _, rf = fin.finish()
        st = state_of(db, tid)
        texts = [m.text() for m in st.context if m.role == "user"] if st else []
        if rf["outcome"] != "ok" or rf.get("status") != "completed":
            problems.append(ctx + f"\n  the thread could not be finished: {rf.get('error')} {[m.role for m in st.context]}")
            continue
        if well_formed(st.context) is not None:
            problems.append(ctx + f"\n  ill-formed at the end: {well_formed(st.context)}")
        accepted = rc is not None and rc["outcome"] == "ok"
        if texts.count(f"t2-{r}") != (1 if accepted else 0):
            problems.append(ctx + f"\n  the new turn is stored {texts.count(f't2-{r}')} times, accepted={accepted}: {texts}")
        for e in ("lookup", "notify"):
            for order in (f"t1-{r}", f"t2-{r}"):
                k = sum(1 for x in effects.all(e) if x.data.get("order_id") == order)
                limit = (1 if order in texts else 0) + (1 if killed_a and order == f"t1-{r}" else 0)
                if k > limit:
                    problems.append(ctx + f"\n  {e}({order}) ran {k} times (limit {limit})")
        vs = versions(db, tid)
        if not (sorted(vs) == list(range(min(vs), max(vs) + 1)) and len(vs) == len(set(vs))):
            problems.append(ctx + f"\n  versions {vs}")
        print(ctx)
    assert not problems, "\n".join(problems)


async def _stop(db: str, tid: str) -> dict[str, Any]:
    cp = hitl_agent.open_checkpointer(db)
    app = hitl_agent.build(cp)
    try:
        return await app.astop({"thread_id": tid})
    finally:
        await app.aclose()


# --------------------------------------------------------------------------- 3: sync tool mid-effect


def test_kill_while_the_sync_tool_is_mid_effect(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    """lookup (sync, in a thread) has taken effect and is still running; notify (async) beside it
    has returned (its ledger row written at once: a sibling was still running). SIGKILL then.
    The resume must answer notify from the ledger and may run lookup again (the window)."""
    tid = f"mid-{uuid.uuid4().hex[:8]}"
    mid = tmp_path / "mid"
    name = f"tenx-mid-{tid}"
    a = Child(tmp_path / tid, "a", {"db": labelled(db, name), "thread_id": tid, "mode": "once",
                                    "input": {"messages": [hitl_agent.Message.text_message("o-5").model_dump(mode="json")]}},
              variant_env(effects, simple=True, HITL_SYNC_MID=str(mid)))
    assert a.wait_file(mid), a.stderr()
    # notify returns ~40 ms after it starts; lookup now sleeps 0.5 s: wait for notify's row.
    deadline = time.monotonic() + 30
    while statuses(db, tid).get("n1") != "completed":
        assert a.proc.poll() is None and time.monotonic() < deadline, "notify's row never appeared"
        time.sleep(0.01)  # polled: read from the database
    a.kill_now()
    assert a.finish()[0]
    wait_backends_gone(db, name)
    assert effects.counts() == {"lookup": 1, "notify": 1}, effects.counts()
    fin = Child(tmp_path / tid, "fin", {"db": db, "thread_id": tid, "mode": "flow", "text": "o-5"},
                variant_env(effects, simple=True))
    _, rf = fin.finish()
    assert rf["outcome"] == "ok" and rf["status"] == "completed", rf
    assert effects.count("notify") == 1, effects.counts()
    assert effects.count("lookup") == 2, effects.counts()  # the window: ran, never recorded
    st = state_of(db, tid)
    assert well_formed(st.context) is None
    assert st.context[-1].text() == "done: l1=found o-5 | n1=notified o-5"


# --------------------------------------------------------------------------- 4: streaming


def test_astream_of_a_finished_thread_yields_its_answer(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    """A streaming client whose process (or connection) died right after the run's last commit
    never got the final message; it reconnects with ``astream({}, config)``. ``ainvoke({})`` on a
    finished thread "runs nothing and returns the stored thread whole" (its last turn); the same
    call through astream must hand that answer over too (contract 5: every path the same)."""
    env = variant_env(effects, simple=True)
    tid = f"fin-{uuid.uuid4().hex[:8]}"
    a = Child(tmp_path / tid, "a", {"db": db, "thread_id": tid, "mode": "flow", "text": "o-9"}, env)
    _, ra = a.finish()
    assert ra["outcome"] == "ok" and ra["status"] == "completed", ra
    final = state_of(db, tid).context[-1]
    seen = {}
    for mode in ("low", "full"):
        chunks = tmp_path / f"{mode}.jsonl"
        c = Child(tmp_path / tid, f"re-{mode}", {"db": db, "thread_id": tid, "mode": "once", "input": {},
                                                 "stream": mode, "chunks": str(chunks)}, env)
        _, rc = c.finish()
        assert rc["outcome"] == "ok", rc
        seen[mode] = [x.get("id") for x in streamed(chunks) if "id" in x]
    inv = Child(tmp_path / tid, "inv", {"db": db, "thread_id": tid, "mode": "once", "input": {}}, env)
    assert inv.finish()[1]["outcome"] == "ok"
    print(f"\nfinal {final.message_id}: streamed ids per mode {seen}; effects {effects.counts()}")
    assert effects.counts() == {"lookup": 1, "notify": 1}
    for mode, ids in seen.items():
        assert str(final.message_id) in ids, f"astream({{}}) ({mode}) of the finished thread did not yield its answer: {ids}"


# --------------------------------------------------------------------------- 1: the static review gate


def test_two_recovery_resumes_do_not_pass_the_review_gate(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    """The graph has interrupt_before=["tools"]: a human reviews the model's tool calls. The
    process dies right after the turn's input commit (SIGKILL at the failpoint
    ``after_step:__input__``), so the thread is ``running`` at the model step. Two workers do what
    the docs and the STORAGE_BUSY_001 message say, ``ainvoke({}, config)``, at once, with
    on_busy="wait". One finishes the crashed step and the thread waits at the review; the other
    must not take its ``{}`` as the reviewer's approval and run the tools."""
    env = variant_env(effects, simple=True, static=True)
    tid = f"gate-{uuid.uuid4().hex[:8]}"
    first = Child(tmp_path / tid, "a", {"db": db, "thread_id": tid, "mode": "once",
                                        "input": {"messages": [hitl_agent.Message.text_message("o-6").model_dump(mode="json")]}},
                  {**env, "TENXGRAPH_FAILPOINTS": "after_step:__input__=kill"})
    assert first.finish()[0], first.stderr()
    assert status_of(state_of(db, tid)) == "running"
    bar = tmp_path / "bar"
    bar.mkdir()
    # Whichever worker takes the lease first holds it 3 s before it loads the thread, so the other
    # really asks while it is held and waits. Without it, on a loaded machine the first could
    # finish its whole recovery before the second started: that second `{}` then reaches a
    # thread paused at the review with no holder, where it is the reviewer's "go on" (CI,
    # session 22: the test failed so, once).
    hold = {**env, "TENXGRAPH_FAILPOINTS": f"after_lease:{tid}=delay(3000)"}
    pair = [Child(tmp_path / tid, f"w{i}", {"db": db, "thread_id": tid, "mode": "once", "input": {},
                                           "config": {"on_busy": "wait", "busy_timeout": 30},
                                           "barrier": {"dir": str(bar), "index": i, "workers": 2}}, hold)
            for i in range(2)]
    outs = [c.finish()[1] for c in pair]
    st = state_of(db, tid)
    print(f"\noutcomes {[(o['outcome'], o.get('error'), o.get('status')) for o in outs]}; thread {status_of(st)}; "
          f"effects {effects.counts()}")
    assert effects.counts() == {}, f"the tools ran without the reviewer: {effects.counts()}, thread {status_of(st)}"
    assert status_of(st) == "interrupted_before"
