"""Session 33's red-team findings in the testing kit and the lifecycle utilities, each on the real
thing: the effect file, crash-kit child processes, the HTTP stand-in, an event loop, real signals
and the ``serve`` command.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tenxgraph.testing import EffectCounter, race, resume, run_until_crash
from tenxgraph.testing.crash import child_env
from tenxgraph.testing.providers import OpenAIStandIn
from tenxgraph.utils.background_task_manager import BackgroundTaskManager
from tests_py.kit_agents.spawner import DONE

SPAWNER = "tests_py.kit_agents.spawner:build"


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie waits for whoever reaps orphans here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def no_worker_left(effects: EffectCounter):
    """Kills any worker the spawner agent started that is still running at the end, so a failing
    test leaves no sleeper behind."""
    yield
    for e in effects.all("start_worker"):
        pid = int(e.data["pid"])
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- 1. EffectCounter by=


def test_assert_exactly_once_by_a_field_no_record_has_fails_naming_the_keys(tmp_path: Path) -> None:
    c = EffectCounter(tmp_path / "effects.jsonl")
    # A replay drew a new idempotency key: two charges a payment API would both perform.
    c.record("charge_card", order_id="4821", amount_cents=12900, key="idem-1")
    c.record("charge_card", order_id="4821", amount_cents=12900, key="idem-2")
    with pytest.raises(AssertionError, match="distinct 'key'"):
        c.assert_exactly_once("charge_card", by="key")
    with pytest.raises(AssertionError) as caught:
        c.assert_exactly_once("charge_card", by="idempotency_key")  # the field is called `key`
    message = str(caught.value)
    assert "'idempotency_key'" in message
    assert "'amount_cents', 'key', 'order_id'" in message, message
    with pytest.raises(KeyError, match="'amount_cents', 'key', 'order_id'"):
        c.distinct("charge_card", "idempotency_key")


def test_assert_exactly_once_by_fails_when_only_some_records_lack_the_field(tmp_path: Path) -> None:
    c = EffectCounter(tmp_path / "effects.jsonl")
    c.record("charge_card", order_id="4821", key="idem-1")
    c.record("charge_card", order_id="4821")  # a second charge that recorded no key
    with pytest.raises(AssertionError, match="1 of 2 'charge_card' record"):
        c.assert_exactly_once("charge_card", by="key")


def test_a_field_recorded_as_none_is_a_value(tmp_path: Path) -> None:
    c = EffectCounter(tmp_path / "effects.jsonl")
    c.record("charge_card", key=None)
    c.record("charge_card", key=None)
    assert c.distinct("charge_card", "key") == [None]
    c.assert_exactly_once("charge_card", by="key")


# --------------------------------------------------------------------------- 2. a tool's grandchild


def test_run_until_crash_is_not_held_by_a_process_a_tool_started(tmp_path: Path, effects: EffectCounter,
                                                                  no_worker_left: None) -> None:
    # The worker sleeps far longer than the timeout: waiting for it shows as a timeout.
    r = run_until_crash(SPAWNER, "t-1", db=tmp_path / "kit.db", failpoints="after_tool:start_worker=kill",
                        timeout=60, env={"KIT_TOOLS": "start_worker", "WORKER_SECONDS": "600"})
    assert r.killed and r.returncode == -signal.SIGKILL
    assert "stdout: worker w1 is pid" in r.stdout and "stderr: worker w1 is pid" in r.stderr
    (worker,) = effects.all("start_worker")
    assert _gone_within(int(worker.data["pid"]), 30), "the killed child's worker is still running"


def test_resume_is_not_held_by_a_process_a_tool_started(tmp_path: Path, effects: EffectCounter,
                                                        no_worker_left: None) -> None:
    r = resume(SPAWNER, "t-1", db=tmp_path / "kit.db", input="start it", timeout=60,
               env={"KIT_TOOLS": "start_worker,charge_card", "WORKER_SECONDS": "600"})
    assert r.status == "completed" and r.last == DONE
    assert "stdout: worker w1 is pid" in r.stdout
    (worker,) = effects.all("start_worker")
    assert _gone_within(int(worker.data["pid"]), 30), "the finished child's worker is still running"


def test_race_is_not_outlived_by_a_process_a_tool_started(tmp_path: Path, effects: EffectCounter,
                                                          no_worker_left: None) -> None:
    """Session 33 left it: race()'s workers had no session of their own, so the sleeper a tool
    started kept running after the race returned."""
    results = race(SPAWNER, "t-1", db=tmp_path / "kit.db", inputs="start it", workers=2, timeout=60,
                   env={"KIT_TOOLS": "start_worker", "WORKER_SECONDS": "600"})
    assert [r.outcome for r in results].count("error") < 2, [r.exception for r in results]
    workers = effects.all("start_worker")
    assert workers, "no worker started"
    for w in workers:
        assert _gone_within(int(w.data["pid"]), 30), "a race worker's sleeper is still running"


# --------------------------------------------------------------------------- 3. reply_hang


def _post(llm: OpenAIStandIn, timeout: float) -> str:
    req = urllib.request.Request(
        llm.base_url + "/chat/completions", method="POST", headers={"content-type": "application/json"},
        data=json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode())
    try:
        urllib.request.urlopen(req, timeout=timeout).read()
        return "answered"
    except urllib.error.HTTPError as e:
        return f"http {e.code}"
    except TimeoutError:
        return "held"


def _held_then_released(llm: OpenAIStandIn) -> str:
    """Posts into a scripted hang; once the stand-in has the request, releases it."""
    outcome: list[str] = []
    t = threading.Thread(target=lambda: outcome.append(_post(llm, 120)))
    seen = len(llm.requests)
    t.start()
    deadline = time.monotonic() + 60
    while len(llm.requests) == seen and time.monotonic() < deadline:
        time.sleep(0.01)
    llm.release()
    t.join(60)
    return outcome[0] if outcome else "no answer"


def test_reply_hang_after_a_release_holds_its_request_again() -> None:
    with OpenAIStandIn() as llm:
        llm.reply_hang()
        assert _held_then_released(llm) == "http 504"
        llm.reply_hang()
        # Held for as long as nothing releases it: only the client's own timeout ends the wait.
        assert _post(llm, 2) == "held"
        llm.reply_hang()
        assert _held_then_released(llm) == "http 504"  # a release still lets the new hang go


def test_reply_hang_after_close_and_start_holds_its_request() -> None:
    llm = OpenAIStandIn().start()
    try:
        llm.close()
        llm.start()
        llm.reply_hang()
        assert _post(llm, 2) == "held"
    finally:
        llm.close()


# --------------------------------------------------------------------------- 4. cancel_all


@pytest.mark.asyncio
async def test_cancel_all_returns_when_a_cancelled_task_hangs_in_its_cleanup(caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    broker_answers = asyncio.Event()
    working = asyncio.Event()

    async def publish_with_flush() -> None:
        try:
            working.set()
            await asyncio.Event().wait()  # the work, until cancelled
        finally:
            await broker_answers.wait()  # a flush to a broker that does not answer

    caplog.set_level(logging.WARNING, logger="tenxgraph.utils")
    m = BackgroundTaskManager()
    task = m.create_task(publish_with_flush(), name="publish")
    assert task is not None
    await working.wait()
    # The default bound is 1 s; 30 s only tells "bounded" from "waits for ever".
    await asyncio.wait_for(m.cancel_all(), 30)
    assert not task.done()
    assert any("publish" in r.getMessage() and "still running" in r.getMessage() for r in caplog.records)
    broker_answers.set()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and m.pending_count == 0


@pytest.mark.asyncio
async def test_cancel_all_returns_once_the_tasks_have_ended() -> None:
    started = asyncio.Event()
    cleaned: list[str] = []

    async def work() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            cleaned.append("done")

    m = BackgroundTaskManager()
    task = m.create_task(work(), name="work")
    await started.wait()
    await asyncio.wait_for(m.cancel_all(timeout=None), 30)
    assert task is not None and task.cancelled() and cleaned == ["done"] and m.pending_count == 0


# --------------------------------------------------------------------------- 5. signal handlers


DOUBLE_REGISTER_CHILD = textwrap.dedent("""
    import asyncio, signal, sys, time
    from tenxgraph.utils.shutdown import GracefulShutdownManager

    # A suite started as a background job has SIGINT ignored, and its children inherit that:
    # give this child the handler a program started from a terminal has.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    async def main():
        m = GracefulShutdownManager()
        m.register_signal_handlers()
        m.register_signal_handlers()  # two components of one app register it
        m.unregister_signal_handlers()

    asyncio.run(main())
    try:
        print("ready", flush=True)  # inside the try: SIGINT may come as soon as this is out
        time.sleep(600)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    time.sleep(600)  # until SIGTERM
""")


def test_signals_work_again_after_registering_twice_and_unregistering() -> None:
    p = subprocess.Popen([sys.executable, "-c", DOUBLE_REGISTER_CHILD], env=child_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.put(line.strip())
        lines.put("EOF: the child ended")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert lines.get(timeout=60) == "ready"
        p.send_signal(signal.SIGINT)
        try:
            got = lines.get(timeout=60)
        except queue.Empty:
            got = "nothing: SIGINT was ignored"
        assert got == "KeyboardInterrupt"
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = None  # SIGTERM was ignored
        assert rc == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        reader.join(60)


TWO_LOOPS_CHILD = textwrap.dedent("""
    import asyncio, signal
    from tenxgraph.utils.shutdown import GracefulShutdownManager

    def mine(sig, frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    m = GracefulShutdownManager()
    m.register_signal_handlers(first)
    m.register_signal_handlers(second)  # moved to another loop
    m.unregister_signal_handlers()
    first.close()   # a loop still holding a handler resets the signal to SIG_DFL here
    second.close()
    print("restored" if signal.getsignal(signal.SIGTERM) is mine else f"got {signal.getsignal(signal.SIGTERM)!r}")
""")


def test_registering_on_a_second_loop_then_unregistering_restores_the_first_handler() -> None:
    r = subprocess.run([sys.executable, "-c", TWO_LOOPS_CHILD], env=child_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "restored"


BEFORE_THE_LOOP_CHILD = textwrap.dedent("""
    import asyncio, signal, warnings
    warnings.simplefilter("error")  # a DeprecationWarning from the registration ends the child
    from tenxgraph.utils.shutdown import GracefulShutdownManager

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (see above)
    m = GracefulShutdownManager()
    calls = []

    def where():
        try:
            asyncio.get_running_loop()
            calls.append("on the loop")
        except RuntimeError:
            calls.append("no loop")

    m.add_shutdown_callback(where)
    m.register_signal_handlers()  # from sync code, before asyncio.run makes its loop

    async def main():
        print("ready", flush=True)
        await asyncio.wait_for(m.wait_for_shutdown(0.01), 60)
        print("graceful", m.shutdown_requested, calls, flush=True)

    asyncio.run(main())
    m.unregister_signal_handlers()
    print("restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
    m2 = GracefulShutdownManager()
    calls.clear()
    m2.add_shutdown_callback(where)
    m2.register_signal_handlers()  # a program with no loop at all
    signal.raise_signal(signal.SIGTERM)
    print("no loop", m2.shutdown_requested, calls, flush=True)
""")


def test_handlers_registered_before_asyncio_run_take_ctrl_c_on_its_loop() -> None:
    """Promise: nothing hangs, not even Ctrl-C. Registered from sync code, 10xGraph's manager
    (and ours until session 46) put its handlers on the loop ``asyncio.get_event_loop()`` made
    (DeprecationWarning on 3.12, an error on 3.14), a loop nothing runs: SIGINT went to it, and
    the process ignored Ctrl-C for the rest of its life."""
    before, out, _ = signal_at_ready(BEFORE_THE_LOOP_CHILD, signal.SIGINT)
    assert before == []
    assert out == ["graceful True ['on the loop']", "restored True", "no loop True ['no loop']"]


def signal_at_ready(code: str, sig: int) -> tuple[list[str], list[str], str]:
    """Runs ``code`` in a child, sends it ``sig`` once it prints ``ready``, and requires it to exit
    0: (its lines before ``ready``, its lines after, its stderr)."""
    p = subprocess.Popen([sys.executable, "-c", code], env=child_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    before: list[str] = []
    try:
        assert p.stdout is not None
        while (line := p.stdout.readline().strip()) != "ready":
            assert line or p.poll() is None, (before, p.stderr.read()[-2000:] if p.stderr else "")
            before.append(line)
        p.send_signal(sig)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-2000:]
    return before, out.splitlines(), err


EDGES_CHILD = textwrap.dedent("""
    import asyncio, logging, signal
    from tenxgraph.utils.shutdown import GracefulShutdownManager

    logging.basicConfig(level=logging.WARNING)  # the warning to stderr

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (see above)
    calls = []

    # 1. A signal that comes in a loop's last iteration (the end of asyncio.run, of a sync invoke).
    m = GracefulShutdownManager()
    m.add_shutdown_callback(lambda: calls.append("cb"))
    m.register_signal_handlers()
    loop = asyncio.new_event_loop()
    loop.call_soon(signal.raise_signal, signal.SIGTERM)
    loop.call_soon(loop.stop)  # the same iteration: the loop runs nothing after it
    loop.run_forever()
    loop.close()
    print("last iteration", m.shutdown_requested, calls, flush=True)
    m.unregister_signal_handlers()

    # 2. Registered on the running loop, then again from a worker thread.
    async def main():
        m2 = GracefulShutdownManager()
        m2.register_signal_handlers()
        await asyncio.to_thread(m2.register_signal_handlers)  # warns: not the main thread
        print("ready", flush=True)
        try:
            await asyncio.wait_for(m2.wait_for_shutdown(0.01), 60)
        except TimeoutError:
            pass
        print("after a worker's registration", m2.shutdown_requested, flush=True)
        m2.unregister_signal_handlers()

    asyncio.run(main())
""")


def test_a_signal_in_a_loops_last_iteration_and_a_registration_from_a_worker_thread_are_not_lost() -> None:
    """Promise: nothing hangs, and a stop request is not dropped. Two ways a helper's red-team lost
    the signal: a process handler that handed it to the loop, in the loop's last iteration
    (``loop.close()`` discarded it, flag and callbacks); and a registration from a worker thread
    (``asyncio.to_thread``, a sync tool), which took the handlers off the main loop's
    registration and left the signals reaching a loop that no longer routed them."""
    before, out, err = signal_at_ready(EDGES_CHILD, signal.SIGTERM)
    assert [*before, *out] == ["last iteration True ['cb']", "after a worker's registration True"]
    assert "not the main thread" in err, err[-2000:]


# --------------------------------------------------------------------------- 6. serve's stdin


def _serve(tmp_path: Path, stdin: Any) -> tuple[subprocess.Popen[str], str]:
    """``python -m tenxgraph.testing serve`` on servers named in the environment (so it starts
    none, and stopping it stops nothing); returns once it has written its env file."""
    env = {**child_env(), "TENXGRAPH_TEST_PG_DSN": "postgresql://nobody@127.0.0.1:9/none",
           "TENXGRAPH_TEST_REDIS_URL": "redis://127.0.0.1:9/0"}
    p = subprocess.Popen([sys.executable, "-m", "tenxgraph.testing", "serve", str(tmp_path / "env")], env=env,
                         stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, p.stdout.readline()


def _reap(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            f.close()


def test_serve_stops_when_its_stdin_pipe_closes(tmp_path: Path) -> None:
    p, line = _serve(tmp_path, subprocess.PIPE)
    try:
        assert line.startswith("postgres "), line
        assert p.stdin is not None
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    finally:
        _reap(p)


def test_serve_with_stdin_not_a_pipe_runs_until_sigterm(tmp_path: Path) -> None:
    p, line = _serve(tmp_path, subprocess.DEVNULL)
    try:
        assert line.startswith("postgres "), line
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=3)  # /dev/null reads EOF at once: that must not stop it
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    finally:
        _reap(p)


def test_an_effect_may_record_a_field_called_name(tmp_path: Path) -> None:
    """``record(name, **data)`` took ``name=`` in the data as a second value for its first
    argument (TypeError): a tool recording whom it emailed could not say ``name="Ada"``."""
    c = EffectCounter(tmp_path / "effects.jsonl")
    c.record("send_email", name="Ada", to="ada@example.com")
    c.record("send_email", name="Bob", to="bob@example.com")
    assert c.count("send_email") == 2
    assert sorted(c.distinct("send_email", by="name")) == ["Ada", "Bob"]
