"""tenxgraph.testing's crash kit: EffectCounter, run_until_crash / resume, race, the fixtures.

The graph under test is tests_py/kit_agents/support.py (``build(checkpointer)``): a scripted model
asks for lookup_order, charge_card and send_receipt in one message; each tool records its effect
in the test's EffectCounter ($TENXGRAPH_EFFECTS), charge_card with its idempotency key.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tenxgraph.core.exceptions import FailpointError
from tenxgraph.testing import (
    EFFECTS_ENV,
    FAILPOINTS_ENV,
    CrashKit,
    EffectCounter,
    parse_failpoints,
    resume,
    run_until_crash,
)
from tenxgraph.testing.crash import child_env
from tests_py.kit_agents.support import DONE

TARGET = "tests_py.kit_agents.support:build"
TOOLS = ("lookup_order", "charge_card", "send_receipt")
DOCS = Path(__file__).resolve().parent.parent / "docs" / "testing-kit.md"


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    """The database the kit's children share: a SQLite file, or a fresh Postgres database."""
    return sqlite_db if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


# --------------------------------------------------------------------------- EffectCounter

_RECORDER = textwrap.dedent("""
    import sys
    from tenxgraph.testing import EffectCounter
    counter = EffectCounter.from_env()
    for i in range(int(sys.argv[1])):
        counter.record("tick", worker=sys.argv[2], seq=i)
    counter.record("done:" + sys.argv[2])
""")


def test_effect_counter_is_shared_by_concurrent_processes(effects: EffectCounter) -> None:
    per_worker, workers = 150, 4
    procs = [
        subprocess.Popen([sys.executable, "-c", _RECORDER, str(per_worker), f"w{w}"], env=child_env(),
                         stderr=subprocess.PIPE)
        for w in range(workers)
    ]
    effects.record("parent", note="written while the children write")
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()

    assert effects.count("tick") == per_worker * workers
    ticks = effects.all("tick")
    for w in range(workers):  # every record whole, none lost, each worker's in its own order
        assert [e.data["seq"] for e in ticks if e.data["worker"] == f"w{w}"] == list(range(per_worker))
    assert len({e.pid for e in ticks}) == workers and os.getpid() not in {e.pid for e in ticks}
    assert effects.all("parent")[0].pid == os.getpid()
    assert set(effects.names()) == {"tick", "parent"} | {f"done:w{w}" for w in range(workers)}
    effects.assert_exactly_once("parent", *(f"done:w{w}" for w in range(workers)))
    effects.assert_at_most("tick", per_worker * workers)
    with pytest.raises(AssertionError, match="tick"):
        effects.assert_at_most("tick", per_worker * workers - 1)


def test_effect_counter_assertions(tmp_path: Path) -> None:
    c = EffectCounter(tmp_path / "sub" / "effects.jsonl")  # the directory is created on first record
    assert c.count("x") == 0 and c.names() == [] and c.all() == []
    with pytest.raises(AssertionError, match="no effect recorded"):
        c.assert_exactly_once()
    c.record("charge", key="k1", amount=100)
    c.record("email")
    c.assert_exactly_once("charge", "email")
    c.assert_exactly_once()  # every recorded name
    with pytest.raises(AssertionError, match=r"'refund': 0"):
        c.assert_exactly_once("charge", "refund")
    c.record("charge", key="k1", amount=100)  # a replay with the same idempotency key
    with pytest.raises(AssertionError, match=r"'charge': 2") as info:
        c.assert_exactly_once("charge")
    assert '"key": "k1"' in str(info.value)  # the records are shown
    c.assert_exactly_once("charge", by="key")  # once, for a payment API that dedups by key
    c.record("charge", key="k2", amount=100)
    with pytest.raises(AssertionError, match=r"'charge': 2"):
        c.assert_exactly_once("charge", by="key")
    assert c.distinct("charge", "key") == ["k1", "k2"]
    assert c.counts() == {"charge": 3, "email": 1}
    assert c.names() == ["charge", "email"]
    c.assert_at_most("charge", 3)
    c.assert_at_most("refund", 0)
    with pytest.raises(AssertionError, match="at most 2"):
        c.assert_at_most("charge", 2)

    # A line cut short by a crash mid-write is not an effect; the rest still reads.
    with open(c.path, "ab") as f:
        f.write(b'{"name": "charge", "data": {"key": "k3"')
    assert c.count("charge") == 3
    c.clear()
    assert c.counts() == {}
    with pytest.raises(ValueError):
        c.record("")


def test_effects_fixture_exports_its_path_to_children(effects: EffectCounter, monkeypatch: pytest.MonkeyPatch) -> None:
    assert os.environ[EFFECTS_ENV] == str(effects.path)
    code = "from tenxgraph.testing import EffectCounter; EffectCounter.from_env().record('from-child', ok=True)"
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), timeout=60)
    assert [e.data for e in effects.all("from-child")] == [{"ok": True}]
    monkeypatch.delenv(EFFECTS_ENV)
    with pytest.raises(RuntimeError, match=EFFECTS_ENV):
        EffectCounter.from_env()


# --------------------------------------------------------------------------- plumbing


def test_parse_failpoints() -> None:
    assert parse_failpoints("after_tool:charge_card=kill") == [
        {"point": "after_tool", "target": "charge_card", "nth": 1, "action": "kill", "delay_ms": None}]
    assert parse_failpoints(" before_tool@2=raise ; after_step:model@3=delay(250);") == [
        {"point": "before_tool", "target": None, "nth": 2, "action": "raise", "delay_ms": None},
        {"point": "after_step", "target": "model", "nth": 3, "action": "delay", "delay_ms": 250},
    ]
    for bad in ("", "after_tool", "after_tol:x=kill", "after_tool:x=explode", "after_tool@0=kill",
                "after_tool@x=kill", "after_tool=delay(soon)"):
        with pytest.raises(ValueError):
            parse_failpoints(bad)
    with pytest.raises(ValueError, match="unknown point"):  # checked before any child starts
        run_until_crash(TARGET, "t", failpoints="after_tol:charge_card=kill", db="unused.db")


def test_child_env_propagates_sys_path_and_failpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAILPOINTS_ENV, "after_step=kill")  # never leaks into a child by accident
    env = child_env()
    assert FAILPOINTS_ENV not in env
    root = str(Path(__file__).resolve().parent.parent)
    assert root in env["PYTHONPATH"].split(os.pathsep)
    assert child_env(failpoints="before_tool=raise", env={"X_KIT": "1"})[FAILPOINTS_ENV] == "before_tool=raise"
    probe = "import json, os, tests_py.kit_agents.support as s; print(json.dumps([s.__file__, os.environ.get('X_KIT')]))"
    out = subprocess.run([sys.executable, "-c", probe], env=child_env(env={"X_KIT": "1"}), cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [str(Path(__file__).resolve().parent / "kit_agents" / "support.py"), "1"]


def test_resume_runs_the_thread_in_a_fresh_child(crash_kit: CrashKit, db: str) -> None:
    first = crash_kit.resume(TARGET, "order-1", db=db, input="charge order 4821")
    assert first.status == "completed"
    assert first.messages[0] == "charge order 4821" and first.last == DONE
    assert "charged 129.00 USD for order 4821" in first.messages
    assert crash_kit.effects is not None
    crash_kit.effects.assert_exactly_once(*TOOLS)
    assert {e.pid for e in crash_kit.effects.all()} != {os.getpid()}  # the tools ran in the child

    second = crash_kit.resume(TARGET, "order-1", db=db, input="and again, please")
    assert second.status == "completed" and second.last == DONE
    assert crash_kit.effects.count("charge_card") == 2
    assert len(crash_kit.effects.distinct("charge_card", "key")) == 2  # two calls, two keys


def test_child_failures_raise_assertion_errors_with_the_childs_stderr(crash_kit: CrashKit) -> None:
    with pytest.raises(AssertionError, match=r"could not set up the graph(.|\n)*child stderr:(.|\n)*ModuleNotFoundError"):
        crash_kit.resume("tests_py.kit_agents.no_such_module:build", "t", input="hi")
    with pytest.raises(AssertionError, match=r"could not set up(.|\n)*AttributeError"):
        crash_kit.run_until_crash("tests_py.kit_agents.support:no_such_factory", "t", failpoints="after_step=kill")
    # A thread that does not exist cannot be resumed without messages: the run raises in the child.
    with pytest.raises(AssertionError, match=r"the resumed run raised(.|\n)*must contain 'messages'"):
        crash_kit.resume(TARGET, "never-started")
    with pytest.raises(AssertionError, match="did not finish within"):
        crash_kit.resume(TARGET, "t", input="hi", timeout=0.05)
    with pytest.raises(ValueError, match="target"):
        resume("no_colon", "t", db=crash_kit.db)
    with pytest.raises(ValueError, match="schema"):
        resume(TARGET, "t", db=crash_kit.db, schema="s1")


def test_run_until_crash_fails_when_no_failpoint_fires(crash_kit: CrashKit) -> None:
    # A misspelt tool name arms nothing: the run completes, which must not pass as a crash test.
    with pytest.raises(AssertionError, match="no kill/raise failpoint fired"):
        crash_kit.run_until_crash(TARGET, "t-typo", failpoints="after_tool:charge_crad=kill")
    done = crash_kit.run_until_crash(TARGET, "t-typo-2", failpoints="after_tool:charge_crad=kill", expect_crash=False)
    assert done.completed and not done.crashed and done.status == "completed" and done.messages[-1] == DONE


# --------------------------------------------------------------------------- crash and resume


# docs/testing-kit.md shows this test verbatim (test_docs_show_the_example_verbatim checks it).
def test_card_charged_once_after_a_crash(crash_kit):
    # SIGKILL right after charge_card returned, before its result reached the tool ledger.
    crashed = crash_kit.run_until_crash(
        "tests_py.kit_agents.support:build", "order-4821",
        failpoints="after_tool:charge_card=kill",
        input="Please charge my card for order 4821 and email me the receipt.",
    )
    assert crashed.killed

    resumed = crash_kit.resume("tests_py.kit_agents.support:build", "order-4821")
    assert resumed.status == "completed"
    assert resumed.last == "Done: charged and emailed."

    effects = crash_kit.effects
    # Its result was never recorded, so the call ran again on resume, with the same idempotency
    # key: a payment API that deduplicates by that key charged the card exactly once.
    assert effects.count("charge_card") == 2
    effects.assert_exactly_once("charge_card", by="key")


def test_docs_show_the_example_verbatim() -> None:
    docs = DOCS.read_text()
    source = inspect.getsource(test_card_charged_once_after_a_crash)
    assert source in docs, "docs/testing-kit.md must contain test_card_charged_once_after_a_crash verbatim"
    factory = (Path(__file__).resolve().parent / "kit_agents" / "support.py").read_text()
    assert f"```python\n{factory}```" in docs, "docs/testing-kit.md must contain kit_agents/support.py verbatim"


@pytest.mark.parametrize(
    ("failpoints", "charges", "stream"),
    [
        ("before_tool:charge_card=kill", 1, False),   # never ran before the crash
        ("after_tool:charge_card=kill", 2, False),    # ran, not recorded: runs again (same key)
        ("after_record:charge_card=kill", 1, False),  # recorded: replayed from the ledger
        # The tools step carried the node's last ledger rows (the three calls return together),
        # so it rolled back with them: the calls run again, with the same key.
        ("in_step_tx:tools=kill", 2, False),
        ("after_step:tools=kill", 1, False),          # the tools step committed
        ("after_step:model=kill", 1, False),          # the tools had not started
        ("after_step@2=kill", 1, False),              # 2nd commit of the run (after __input__): the model's
        ("mid_stream:tools=kill", 1, True),           # a streamed run, right after showing the tool results
    ],
)
def test_crash_then_resume_charges_once_per_key(crash_kit: CrashKit, db: str, failpoints: str, charges: int,
                                                stream: bool) -> None:
    effects = crash_kit.effects
    assert effects is not None
    crashed = crash_kit.run_until_crash(TARGET, "order-4821", failpoints=failpoints, db=db, stream=stream,
                                        input="charge order 4821")
    assert crashed.killed and crashed.returncode == -9 and crashed.exception is None, crashed
    before = effects.count("charge_card")
    resumed = crash_kit.resume(TARGET, "order-4821", db=db, stream=stream)
    assert resumed.status == "completed" and resumed.last == DONE, resumed
    assert effects.count("charge_card") == charges, (before, effects.counts())
    effects.assert_exactly_once("charge_card", by="key")
    for tool in ("lookup_order", "send_receipt"):  # parallel siblings: once, twice if killed unrecorded
        assert 1 <= effects.count(tool) <= 2, effects.counts()
    if failpoints.startswith(("after_step:model", "after_step@2", "before_tool")):
        assert before == 0  # the crash came before the charge
    # Each call's result reached the model exactly once.
    final = crash_kit.resume(TARGET, "order-4821", db=db, input="thanks")
    assert final.status == "completed"


def test_raise_failpoint_fails_the_run_and_resume_completes_it(crash_kit: CrashKit, db: str) -> None:
    effects = crash_kit.effects
    assert effects is not None
    failed = crash_kit.run_until_crash(TARGET, "order-4821", failpoints="after_record:charge_card=raise", db=db)
    assert not failed.killed and failed.crashed and failed.returncode == 1
    assert failed.exception is not None and failed.exception.is_failpoint
    assert failed.exception.type == FailpointError.__name__ and failed.exception.error_code == "FAILPOINT_001"
    assert "FailpointError" in failed.stderr and failed.status == "error"
    assert effects.count("charge_card") == 1
    resumed = crash_kit.resume(TARGET, "order-4821", db=db)
    assert resumed.status == "completed" and resumed.last == DONE
    effects.assert_exactly_once("charge_card")  # recorded before the raise: replayed, not run again


def test_delay_failpoint_completes_without_expecting_a_crash(crash_kit: CrashKit) -> None:
    slow = crash_kit.run_until_crash(TARGET, "t-slow", failpoints="after_step:model=delay(600)")
    fast = crash_kit.run_until_crash(TARGET, "t-fast", failpoints="after_step:model=delay(0)")
    assert slow.completed and fast.completed and slow.messages[-1] == DONE and slow.status == "completed"

    def model_to_summary(result) -> float:  # the delay sits between the two model messages
        stamps = [m["timestamp"] for m in result.message_dicts if m["role"] == "assistant"]
        return stamps[-1] - stamps[0]

    assert model_to_summary(slow) >= 0.6 > model_to_summary(fast)


# --------------------------------------------------------------------------- race

# Holds the lease winner just after its lease is committed, before it writes anything else, so the
# other worker finds the thread leased however late a loaded machine schedules it after the barrier.
# The hold is at `after_lease`, not inside a write transaction: held in the step's transaction
# (as this test once did) it also held SQLite's write lock, the loser's lease request queued behind
# that lock and, starved by SQLite's polling busy handler, got it only after the winner had released
# the thread, so both completed one after the other (CI, stop 18). 3 s stays under the 5 s lease TTL.
BOTH_STARTED = "after_lease:order-4821=delay(3000)"


def _assert_race_contract(results, effects: EffectCounter) -> None:
    """Runs racing on one thread: each either completes or raises StaleStateError
    (STORAGE_CONFLICT_001) having changed nothing; at least one completes; no tool call runs
    twice: each tool once per completed run, each charge with its own idempotency key."""
    outcomes = [r.outcome if r.completed else f"{r.error_type}/{r.error_code}" for r in results]
    allowed = ("completed", "StaleStateError/STORAGE_CONFLICT_001", "ThreadBusyError/STORAGE_BUSY_001",
               "ThreadBusyError/STORAGE_BUSY_002")
    assert all(o in allowed for o in outcomes), outcomes
    winners = [r for r in results if r.completed]
    assert winners, outcomes
    for r in winners:
        assert r.status == "completed" and r.messages[-1] == DONE, (r, r.messages)
    keys = effects.distinct("charge_card", "key")
    assert effects.count("charge_card") == len(keys) == len(winners), (outcomes, effects.counts())
    assert effects.counts() == {t: len(winners) for t in TOOLS}, (outcomes, effects.counts())


@pytest.mark.parametrize("inputs", ["same", "distinct"])
def test_race_two_workers_on_one_thread(crash_kit: CrashKit, db: str, inputs: str) -> None:
    assert crash_kit.effects is not None
    given = "charge order 4821" if inputs == "same" else ["charge order 4821", "charge it now"]
    results = crash_kit.race(TARGET, "order-4821", db=db, inputs=given, workers=2, failpoints=BOTH_STARTED)
    assert [r.index for r in results] == [0, 1] and len({r.pid for r in results}) == 2
    starts = [r.started for r in results]
    assert all(s is not None for s in starts) and max(starts) - min(starts) < 0.25  # released together
    _assert_race_contract(results, crash_kit.effects)
    # Both started together: one takes the thread's lease, the other is refused before it reads
    # or writes anything.
    outcomes = sorted(r.outcome if r.completed else f"{r.error_type}/{r.error_code}" for r in results)
    assert outcomes == ["ThreadBusyError/STORAGE_BUSY_002", "completed"], [str(r) for r in results]


def test_race_runs_far_apart_both_complete_in_order(crash_kit: CrashKit) -> None:
    assert crash_kit.effects is not None
    results = crash_kit.race(TARGET, "order-4821", inputs=["charge order 4821", "charge order 4821 again"],
                             stagger=1.5)
    assert [r.outcome for r in results] == ["completed", "completed"], [str(r) for r in results]
    assert results[0].finished is not None and results[1].started is not None
    assert results[0].finished <= results[1].started
    _assert_race_contract(results, crash_kit.effects)


def test_race_message_arriving_mid_run(crash_kit: CrashKit, db: str) -> None:
    assert crash_kit.effects is not None
    # Worker 0 pauses 1.5 s after its model step committed; worker 1 arrives 0.5 s after it started.
    results = crash_kit.race(TARGET, "order-4821", db=db, inputs=["charge order 4821", "where is my receipt?"],
                             failpoints="after_step:model=delay(1500)", stagger=0.5)
    _assert_race_contract(results, crash_kit.effects)
    # Worker 0 holds the thread's lease: the newcomer is refused before it reads or writes anything.
    assert [r.outcome if r.completed else r.error_code for r in results] == ["completed", "STORAGE_BUSY_002"]


def test_race_retry_while_a_tool_is_in_flight(crash_kit: CrashKit, db: str) -> None:
    assert crash_kit.effects is not None
    # Worker 0 holds charge_card 1 s before running it; the same request arrives 0.3 s later.
    results = crash_kit.race(TARGET, "order-4821", db=db, inputs="charge order 4821",
                             failpoints="before_tool:charge_card=delay(1000)", stagger=0.3)
    crash_kit.effects.assert_exactly_once("charge_card", by="key")
    _assert_race_contract(results, crash_kit.effects)
    # The retry arrives while the first run is unfinished: refused, so charge_card runs once.
    assert crash_kit.effects.count("charge_card") == 1


def test_new_message_after_a_crash_between_model_and_tools(crash_kit: CrashKit, db: str) -> None:
    assert crash_kit.run_until_crash(TARGET, "order-4821", failpoints="after_step:model=kill", db=db).killed
    # A new message on a thread whose run did not finish is refused and changes nothing ...
    with pytest.raises(AssertionError, match="STORAGE_BUSY_001"):
        crash_kit.resume(TARGET, "order-4821", db=db, input="hello? are you still there?")
    # ... the unfinished run is finished with {} (the tools run once) ...
    finished = crash_kit.resume(TARGET, "order-4821", db=db)
    assert finished.status == "completed" and finished.last == DONE
    # ... and then the new message starts a new turn.
    resumed = crash_kit.resume(TARGET, "order-4821", db=db, input="hello? are you still there?")
    assert resumed.status == "completed"
