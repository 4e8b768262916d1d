"""A process forked after the runtime started (gunicorn --preload, multiprocessing's fork start
method) cannot use it: the runtime's threads do not survive fork(). Its first run used to wait
for ever; it must be a ForkedProcessError (a RuntimeError, RUNTIME_FORKED_001) at once, and the
child must still be able to exit. A graph and checkpointer only built before the fork, never
used, must work in the child: building them does not start the runtime."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import ForkedProcessError
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


def _wait(pid: int) -> int:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child still ran after {DEADLINE_S:.0f} s")


def _child(app: Any) -> int:
    try:
        asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "child"}))
    except ForkedProcessError as exc:
        ok = isinstance(exc, RuntimeError) and exc.error_code == "RUNTIME_FORKED_001" and "fork" in str(exc)
        return 0 if ok else 3
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
    code = _wait(pid)
    assert code == 0, (
        "the forked child's run did not raise ForkedProcessError (exit codes: 2 ran, 3 the error "
        f"without its code or RuntimeError base, 4 another exception): {code}"
    )
    # The parent's runtime is untouched.
    out = asyncio.run(app.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": "parent"}))
    assert out["messages"][-1].text() == "ok"


# Run in a fresh interpreter: this test process started the runtime long ago.
_PRELOAD = """
import asyncio, os, sys
from tenxgraph import END, START, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer

async def answer(state, config):
    return Message.text_message("ok", role="assistant")

backend, path = sys.argv[1], sys.argv[2]
g = StateGraph()
g.add_node("answer", answer)
g.add_edge(START, "answer")
g.add_edge("answer", END)
cp = InMemoryCheckpointer() if backend == "memory" else SqliteCheckpointer(path)
app = g.compile(checkpointer=cp)
pid = os.fork()
if pid == 0:
    code = 5
    try:
        out = asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "child"}))
        code = 0 if out["messages"][-1].text() == "ok" else 2
    except BaseException as exc:
        print("child:", type(exc).__name__, exc, file=sys.stderr)
        code = 4
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
out = asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "parent"}))
print("parent", out["messages"][-1].text())
if backend == "sqlite":
    print("stored", [m.text() for m in cp.get_state({"thread_id": "child"}).context])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_graph_built_before_the_fork_and_first_run_in_the_child_works(backend: str, tmp_path: Any) -> None:
    """gunicorn --preload imports the app (module-level checkpointer and compiled graph) in the
    master, then forks. Constructing a SqliteCheckpointer opened the file and started the runtime
    there, so every worker's first request raised the fork error. The parent, which never used
    them before the fork, uses them after; the child's turn is in the shared file."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _PRELOAD, backend, str(tmp_path / "preload.db")],
        capture_output=True, text=True, timeout=DEADLINE_S,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert lines[:2] == ["child 0", "parent ok"], (lines, proc.stderr[-2000:])
    if backend == "sqlite":
        assert lines[2] == "stored ['hi', 'ok']"


def test_a_sqlite_path_that_cannot_be_opened_fails_on_first_use_with_a_typed_error(tmp_path: Any) -> None:
    """Opening moved to the first use (as 10xGraph's SqliteCheckpointer connects in setup): the
    failure is still a StorageError there, nothing is created, and a later call opens once the
    path is usable."""
    from tenxgraph.core.exceptions import StorageError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cp = SqliteCheckpointer(str(blocker / "x.db"))
    with pytest.raises(StorageError) as err:
        cp.get_state({"thread_id": "t"})
    assert err.value.error_code.startswith("STORAGE")
    assert blocker.read_text() == "not a directory"
    blocker.unlink()
    blocker.mkdir()
    assert cp.get_state({"thread_id": "t"}) is None
    assert (blocker / "x.db").exists()
