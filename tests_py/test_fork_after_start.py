"""A process forked after the runtime started (gunicorn --preload, multiprocessing's fork start
method) cannot use it: the runtime's threads do not survive fork(). Its first run used to wait
for ever; it must be a RuntimeError at once, and the child must still be able to exit."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer

# A hang shows as the child still running at this deadline (it answers in well under a second).
DEADLINE_S = float(os.environ.get("TENX_FORK_DEADLINE_S", "60"))


def _graph(backend: str, tmp_path: Any) -> Any:
    async def answer(state: AgentState, config: dict[str, Any]) -> Message:
        return Message.text_message("ok", role="assistant")

    g = StateGraph()
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    cp = InMemoryCheckpointer() if backend == "memory" else SqliteCheckpointer(str(tmp_path / "fork.db"))
    return g.compile(checkpointer=cp)


def _child(app: Any) -> int:
    try:
        asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "child"}))
    except RuntimeError as exc:
        return 0 if "fork" in str(exc) else 3
    except BaseException:
        return 4
    return 2  # ran: cannot be, the runtime's threads are gone


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_run_in_a_child_forked_after_the_runtime_started_is_a_runtime_error_not_a_hang(backend: str, tmp_path: Any) -> None:
    """SQLite's run waited for ever in the child. A memory run went through (its futures are
    polled on the loop's thread), but with no timer thread a node timeout, a lease renewal or a
    stop poll would never have fired: refused alike."""
    app = _graph(backend, tmp_path)
    asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "parent"}))
    pid = os.fork()
    if pid == 0:  # the child: its answer is its exit code; os._exit skips pytest's teardown
        code = 5
        try:
            code = _child(app)
        finally:
            os._exit(code)
    deadline = time.monotonic() + DEADLINE_S
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"the forked child's run still waited after {DEADLINE_S:.0f} s")
    assert os.waitstatus_to_exitcode(status) == 0, (
        "the forked child's run did not raise the fork RuntimeError (exit codes: 2 ran, 3 another "
        f"RuntimeError, 4 another exception): {os.waitstatus_to_exitcode(status)}"
    )
    # The parent's runtime is untouched.
    out = asyncio.run(app.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": "parent"}))
    assert out["messages"][-1].text() == "ok"
