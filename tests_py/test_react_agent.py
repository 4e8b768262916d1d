"""10xGraph's quick start (ReactAgent) and "build your own graph" (Agent + ToolNode) against the
local OpenAI stand-in, on SQLite and PostgreSQL: the pause in refund_order, the approval, and a
SIGKILL after the refund's side effect whose resume does not refund again."""

from __future__ import annotations

import pytest

from tenxgraph.testing import CrashKit, EffectCounter
from tenxgraph.testing.providers import OpenAIStandIn

TARGETS = ["tests_py.llm_agents.quickstart:build_react", "tests_py.llm_agents.quickstart:build_own_graph"]
ASK = "Order A-1001 arrived broken, please refund it."


@pytest.fixture
def llm():
    with OpenAIStandIn() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else sqlite_db


def _script_turn(llm: OpenAIStandIn) -> None:
    llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
    llm.reply_tool_calls(("refund_order", {"order_id": "A-1001", "amount": 42.0}))


def _tool_texts(request_messages: list[dict]) -> list[str]:
    return [m["content"] for m in request_messages if m["role"] == "tool"]


@pytest.mark.parametrize("target", TARGETS, ids=["quick_start", "own_graph"])
def test_pause_approve_kill_after_refund_resume(target: str, db: str, llm: OpenAIStandIn, tmp_path,
                                                effects: EffectCounter) -> None:
    kit = CrashKit(tmp_path / "kit", db=db, effects=effects)
    _script_turn(llm)
    # 1. The first turn: lookup_order runs, then refund_order pauses for the reviewer.
    paused = kit.resume(target, "t-refund", input=ASK, env=llm.env)
    assert paused.status.startswith("interrupted"), paused.status
    assert effects.count("lookup_order") == 1 and effects.count("refund_order") == 0
    assert len(llm.requests) == 2
    first = llm.requests[0].body
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup_order", "refund_order"]
    assert first["messages"][-1] == {"role": "user", "content": ASK}

    # 2. Approved; the process is killed after the refund returned and its ledger row committed,
    #    before the tool node's step commits.
    crashed = kit.run_until_crash(target, "t-refund", input={"resume": {"approved": True}},
                                  failpoints="after_record:refund_order=kill", env=llm.env)
    assert crashed.killed
    assert effects.count("refund_order") == 1
    assert len(llm.requests) == 2  # the model was not asked anything before the kill

    # 3. A fresh process resumes: the refund comes from the ledger, the model gets its result.
    llm.reply_text("Refunded $42.0 for order A-1001.")
    resumed = kit.resume(target, "t-refund", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert resumed.last == "Refunded $42.0 for order A-1001."
    assert effects.count("refund_order") == 1
    assert effects.count("lookup_order") == 1
    last_request = llm.requests[-1].messages
    assert _tool_texts(last_request)[-1] == "Refunded $42.0 for order A-1001."
    assert [m["role"] for m in last_request] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert llm.pending == 0 and llm.unscripted == 0


@pytest.mark.parametrize("target", TARGETS, ids=["quick_start", "own_graph"])
def test_declined_refund_never_refunds(target: str, db: str, llm: OpenAIStandIn, tmp_path,
                                       effects: EffectCounter) -> None:
    kit = CrashKit(tmp_path / "kit", db=db, effects=effects)
    _script_turn(llm)
    kit.resume(target, "t-decline", input=ASK, env=llm.env)
    llm.reply_text("The reviewer declined the refund.")
    done = kit.resume(target, "t-decline", input={"resume": {"approved": False}}, env=llm.env)
    assert done.status == "completed"
    assert effects.count("refund_order") == 0
    assert _tool_texts(llm.requests[-1].messages)[-1] == "Refund declined by reviewer."


def test_the_example_runs_as_written(tmp_path) -> None:
    """``python examples/react_agent.py``: pause, approval, SIGKILL after the refund, resume; one refund."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "react_agent.py"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TENXGRAPH_EFFECTS")}
    r = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=240, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "paused (interrupted_before) in TOOL: 'Refund $42.0?'" in r.stdout
    assert "child killed (exit -9); refunds issued so far: 1" in r.stdout
    assert "== refunds issued: 1 (model requests: 3)" in r.stdout


def test_streamed_quick_start_killed_after_refund(db: str, llm: OpenAIStandIn, tmp_path, effects: EffectCounter) -> None:
    """The same story over astream: the guarantees do not depend on the path."""
    target = TARGETS[0]
    kit = CrashKit(tmp_path / "kit", db=db, effects=effects)
    _script_turn(llm)
    paused = kit.resume(target, "t-stream", input=ASK, env=llm.env, stream=True)
    assert paused.status.startswith("interrupted"), paused.status
    crashed = kit.run_until_crash(target, "t-stream", input={"resume": {"approved": True}}, stream=True,
                                  failpoints="after_record:refund_order=kill", env=llm.env)
    assert crashed.killed and effects.count("refund_order") == 1
    llm.reply_text("Refunded $42.0 for order A-1001.")
    resumed = kit.resume(target, "t-stream", env=llm.env, stream=True)
    assert resumed.status == "completed"
    assert resumed.last == "Refunded $42.0 for order A-1001."
    assert effects.count("refund_order") == 1
    assert all(r.stream for r in llm.requests)


# docs/testing-kit.md (section 6) shows this test verbatim (the next test checks it).
def test_refund_after_a_crash(crash_kit):
    with OpenAIStandIn() as llm:
        llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
        llm.reply_tool_calls(("refund_order", {"order_id": "A-1001", "amount": 42.0}))
        target = "tests_py.llm_agents.quickstart:build_react"
        paused = crash_kit.resume(target, "t-1", input="Refund order A-1001", env=llm.env)
        assert paused.status == "interrupted_before"  # refund_order waits for the reviewer

        crashed = crash_kit.run_until_crash(target, "t-1", input={"resume": {"approved": True}},
                                            failpoints="after_record:refund_order=kill", env=llm.env)
        assert crashed.killed  # after the refund, before the tool node's step committed

        llm.reply_text("Refunded.")
        assert crash_kit.resume(target, "t-1", env=llm.env).last == "Refunded."
        assert crash_kit.effects.count("refund_order") == 1  # answered from the ledger on resume
        assert llm.requests[-1].messages[-1] == {
            "role": "tool", "content": "Refunded $42.0 for order A-1001.", "tool_call_id": "call_1"}


def test_docs_show_the_stand_in_example_verbatim() -> None:
    import inspect
    import textwrap
    from pathlib import Path

    docs = (Path(__file__).resolve().parent.parent / "docs" / "testing-kit.md").read_text()
    assert textwrap.dedent(inspect.getsource(test_refund_after_a_crash)) in docs


@pytest.mark.parametrize(("failpoint", "asked_again"), [("in_step_tx:MAIN@1=kill", True),
                                                         ("after_step:MAIN@1=kill", False)],
                         ids=["before_the_model_step_commits", "after_it_commits"])
def test_kill_around_the_model_step(failpoint: str, asked_again: bool, db: str, llm: OpenAIStandIn, tmp_path,
                                    effects: EffectCounter) -> None:
    """Killed while the model's reply (its tool calls) is being committed, the turn is asked
    again on resume; killed after the commit, it is not: the ToolNode runs the committed calls."""
    target = TARGETS[0]
    kit = CrashKit(tmp_path / "kit", db=db, effects=effects)
    llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
    crashed = kit.run_until_crash(target, "t-model", input=ASK, failpoints=failpoint, env=llm.env)
    assert crashed.killed and len(llm.requests) == 1
    if asked_again:
        llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
    llm.reply_text("It was delivered.")
    resumed = kit.resume(target, "t-model", env=llm.env)
    assert resumed.status == "completed" and resumed.last == "It was delivered."
    assert len(llm.requests) == (3 if asked_again else 2)
    assert effects.count("lookup_order") == 1
    assert llm.unscripted == 0
