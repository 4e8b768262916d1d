"""Red team (session 9): a pause (``interrupt()`` inside a tool) next to a crash. Real processes
killed by SIGKILL at exact points (failpoints), resumed in fresh processes; the refund (the side
effect behind the human's approval) counted outside the processes.

- killed right after the pause is stored: the thread waits at its interrupt; the answer resumes it.
- killed right after the resume answer is committed (before the tool ran): the answer is kept; a
  retried answer (the same or another) is refused with "Nothing to resume" and changes nothing;
  ``ainvoke({})`` finishes with the committed answer, the refund paid once.
- killed after the tool paid but before its ledger row (the window) or after the row: the resumed
  tool gets the committed answer again (it does not pause a second time); after the row it is not
  called again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tenxgraph.testing import CrashKit, EffectCounter

T = "tests_py.kit_agents.approval:build"
USER = {"messages": [{"role": "user", "content": [{"type": "text", "text": "refund o-7"}]}]}
FINAL = ["refund o-7", "", "refunded 1299 for o-7: yes", "done (refunded 1299 for o-7: yes)"]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "pause.db") if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


def _stored(kit: CrashKit, tid: str) -> list[str]:
    # A finished thread's {} runs nothing and returns the stored thread whole.
    return kit.resume(T, tid, input={}).messages


def test_killed_after_the_pause_and_after_the_answer_commit(db: str, tmp_path: Path, effects: EffectCounter) -> None:
    kit = CrashKit(tmp_path / "kit", db=db, effects=effects)
    tid = f"pause-{tmp_path.name}"
    # Commits: input, model step, the pause: killed right after the third.
    first = kit.run_until_crash(T, tid, failpoints="after_step@3=kill", input=USER)
    assert first.killed
    # Killed right after the resume answer's commit, before the tool node ran.
    second = kit.run_until_crash(T, tid, failpoints="after_step:__input__=kill", input={"resume": "yes"})
    assert second.killed and effects.count("refund") == 0
    for retry in ("yes", "no"):
        again = kit.run_until_crash(T, tid, failpoints="before_tool:none=kill", input={"resume": retry},
                                    expect_crash=False)
        assert again.exception is not None and "Nothing to resume" in again.exception.message, again
        assert again.status == "running"
    done = kit.resume(T, tid, input={})
    assert done.status == "completed" and done.last == "done (refunded 1299 for o-7: yes)"
    assert [e.data["answer"] for e in effects.all() if e.name == "refund"] == ["yes"]
    assert _stored(kit, tid) == FINAL


@pytest.mark.parametrize("point, refunds", [("after_tool:refund", (1, 2)), ("after_record:refund", (1, 1))])
def test_killed_around_the_approved_tool(db: str, tmp_path: Path, effects: EffectCounter, point: str,
                                         refunds: tuple[int, int]) -> None:
    kit = CrashKit(tmp_path / "kit", db=db, effects=effects)
    tid = f"pause-tool-{tmp_path.name}"
    assert kit.resume(T, tid, input=USER).status == "interrupted_before"
    crashed = kit.run_until_crash(T, tid, failpoints=f"{point}=kill", input={"resume": "yes"})
    assert crashed.killed and effects.count("refund") == refunds[0]
    done = kit.resume(T, tid, input={})
    # The answer is still there: the re-run tool does not pause again.
    assert done.status == "completed", done
    answers = [e.data["answer"] for e in effects.all() if e.name == "refund"]
    assert answers == ["yes"] * refunds[1]
    assert _stored(kit, tid) == FINAL
