"""The Python side of the loop runs on the event-loop thread (issue 16, item 4, last clause): the
run's Rust future is polled on the thread that awaits it, node and tool coroutines start there as
tasks, and every Python call the engine makes happens there; cancel-on-drop, timeouts, several
loops at once and an exit right after a run still hold."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph import _runtime
from tenxgraph.core.exceptions import NodeTimeoutError
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

from .tool_graphs import call, tool_graph

# Every method of the Python `Run` the engine calls into (src/py/host.rs).
ENGINE_CALLS = ("prepare", "run_node", "eval_condition", "snapshot", "committed", "lifecycle", "begin_tools",
                "run_tool", "tool_settled", "finish_tools", "unknown_outcome", "accept_replay")


@pytest.fixture
def engine_call_threads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, str]]:
    """Records (method, thread ident, thread name) for each call the engine makes into `Run`;
    the calls themselves are unchanged."""
    seen: list[tuple[str, int, str]] = []
    for name in ENGINE_CALLS:
        original = getattr(_runtime.Run, name)

        def record(self: Any, *args: Any, __name: str = name, __original: Any = original) -> Any:
            t = threading.current_thread()
            seen.append((__name, threading.get_ident(), t.name))
            return __original(self, *args)

        monkeypatch.setattr(_runtime.Run, name, record)
    return seen


def lookup(city: str) -> str:
    """Looks a city up."""
    return f"sunny in {city}"


async def alookup(city: str) -> str:
    """Looks a city up, as a coroutine; records its thread."""
    TOOL_THREADS.append(threading.get_ident())
    return f"rain in {city}"


TOOL_THREADS: list[int] = []


@pytest.mark.asyncio
async def test_every_engine_call_into_python_runs_on_the_loop_thread(
        engine_call_threads: list[tuple[str, int, str]]) -> None:
    # Before: prepare, snapshot, eval_condition, begin_tools and finish_tools ran on a tokio
    # worker ("tenxgraph-rt"), and each node and tool call crossed threads twice.
    TOOL_THREADS.clear()
    app = tool_graph(AgentState, [lookup, alookup], [[call("c1", "lookup", {"city": "Oslo"}),
                                                      call("c2", "alookup", {"city": "Bergen"})]],
                     checkpointer=InMemoryCheckpointer())
    out = await app.ainvoke({"messages": [Message.text_message("weather?")]}, {"thread_id": "loop-1"})
    assert out["messages"][-1].text() == "done"
    here = threading.get_ident()
    names = {n for n, _, _ in engine_call_threads}
    assert {"prepare", "run_node", "eval_condition", "snapshot", "begin_tools", "run_tool", "finish_tools"} <= names
    off_loop = [(n, tname) for n, ident, tname in engine_call_threads if ident != here]
    assert off_loop == []
    assert TOOL_THREADS == [here]


@pytest.mark.asyncio
async def test_cancelling_the_awaiting_task_mid_node_cancels_the_node_coroutine() -> None:
    entered = asyncio.Event()
    unwound = asyncio.Event()
    outcome: list[str] = []

    async def slow(state: AgentState) -> str:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        finally:
            unwound.set()
        return "never"

    g = StateGraph(AgentState)
    g.add_node("slow", slow)
    g.add_edge(START, "slow")
    g.add_edge("slow", END)
    cp = InMemoryCheckpointer()
    app = g.compile(checkpointer=cp)
    run = asyncio.ensure_future(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "loop-cancel"}))
    await asyncio.wait_for(entered.wait(), 30)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # The Rust future was dropped before the cancellation reached the caller: the node's task
    # has had cancel() called; it unwinds at its next step.
    await asyncio.wait_for(unwound.wait(), 30)
    assert outcome == ["cancelled"]
    # The lease went with the run: resuming the unfinished node starts at once.
    g2 = StateGraph(AgentState)

    async def quick(state: AgentState) -> str:
        return "ok"

    g2.add_node("slow", quick)
    g2.add_edge(START, "slow")
    g2.add_edge("slow", END)
    again = g2.compile(checkpointer=cp)
    out = await again.ainvoke({}, {"thread_id": "loop-cancel"})
    assert [m.text() for m in out["messages"]] == ["hi", "ok"]


@pytest.mark.asyncio
async def test_a_node_timeout_while_the_node_awaits_cancels_it_and_fails_the_run() -> None:
    unwound = asyncio.Event()

    async def stuck(state: AgentState) -> str:
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()
        return "never"

    g = StateGraph(AgentState)
    g.add_node("stuck", stuck)
    g.add_edge(START, "stuck")
    g.add_edge("stuck", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(NodeTimeoutError):
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "loop-timeout", "node_timeout": 0.3})
    await asyncio.wait_for(unwound.wait(), 30)


def test_runs_from_two_event_loops_in_two_threads_at_once() -> None:
    # Both nodes wait at one barrier: the runs overlap for certain, each on its own loop.
    barrier = threading.Barrier(2, timeout=60)
    seen: dict[str, tuple[int, int]] = {}

    async def meet(state: AgentState, config: dict[str, Any]) -> str:
        await asyncio.to_thread(barrier.wait)
        seen[config["thread_id"]] = (threading.get_ident(), id(asyncio.get_running_loop()))
        return "met"

    g = StateGraph(AgentState)
    g.add_node("meet", meet)
    g.add_edge(START, "meet")
    g.add_edge("meet", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    results: dict[str, Any] = {}

    def one(tid: str) -> None:
        async def go() -> None:
            out = await app.ainvoke({"messages": [Message.text_message(tid)]}, {"thread_id": tid})
            results[tid] = ([m.text() for m in out["messages"]], threading.get_ident(), id(asyncio.get_running_loop()))
        try:
            asyncio.run(go())
        except BaseException as exc:  # reported by the assertions below
            results[tid] = exc

    threads = [threading.Thread(target=one, args=(f"two-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    for tid in ("two-0", "two-1"):
        texts, ident, loop_id = results[tid]
        assert texts == [tid, "met"]
        assert seen[tid] == (ident, loop_id)
    assert results["two-0"][1] != results["two-1"][1]


EXIT_SCRIPT = """
import asyncio, sys
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer

async def reply(state):
    await asyncio.sleep(0)
    return "ok"

g = StateGraph(AgentState)
g.add_node("reply", reply)
g.add_edge(START, "reply")
g.add_edge("reply", END)
cp = SqliteCheckpointer(sys.argv[1]) if sys.argv[1] != "memory" else InMemoryCheckpointer()
app = g.compile(checkpointer=cp)
out = asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "exit"}))
print(out["messages"][-1].text(), flush=True)
"""


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_the_interpreter_exits_cleanly_right_after_a_run(backend: str, tmp_path: Path) -> None:
    script = tmp_path / "exit_after_run.py"
    script.write_text(textwrap.dedent(EXIT_SCRIPT))
    target = "memory" if backend == "memory" else str(tmp_path / "exit.db")
    for _ in range(5):
        proc = subprocess.run([sys.executable, str(script), target], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr
        assert "Fatal Python error" not in proc.stderr


CONDITION_SCRIPT = """
import asyncio, threading
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

seen = {}

async def first(state):
    seen["node"] = threading.get_ident()
    return [Message.text_message("a", role="assistant")]

async def second(state):
    return [Message.text_message("b", role="assistant")]

def route(state):
    seen["condition"] = threading.get_ident()
    return "second"

g = StateGraph(AgentState)
g.add_node("first", first)
g.add_node("second", second)
g.set_entry_point("first")
g.add_conditional_edges("first", route, {"second": "second"})
g.add_edge("second", END)
app = g.compile(checkpointer=InMemoryCheckpointer())

async def main():
    loop_thread = threading.get_ident()
    out = await app.ainvoke({"messages": [Message.text_message("hi")]}, config={"thread_id": "c1"})
    emit({"texts": [m.text() for m in out["messages"]],
          "node_on_loop": seen["node"] == loop_thread, "condition_on_loop": seen["condition"] == loop_thread})

asyncio.run(main())
"""


def test_a_conditional_edge_runs_on_the_loop_thread_as_in_10xgraph(oracle) -> None:
    # Before: the engine called the condition from a tokio worker thread.
    theirs, ours = oracle.run_both(CONDITION_SCRIPT)
    assert theirs == {"texts": ["hi", "a", "b"], "node_on_loop": True, "condition_on_loop": True}
    assert ours == theirs


@pytest.mark.asyncio
async def test_a_native_awaitable_awaited_twice_is_a_runtime_error_not_a_hang() -> None:
    native = InMemoryCheckpointer()._native
    call = native.thread_owner("never-written", None)
    assert await call is None
    with pytest.raises(RuntimeError, match="already awaited"):
        await asyncio.wait_for(call, 30)


WHO: "contextvars.ContextVar[str]" = __import__("contextvars").ContextVar("who", default="nobody")


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_each_run_sees_its_callers_contextvars_after_a_wake_from_another_thread(
        backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Nodes, tools and conditional edges of each run see the contextvars of the task that
    started it (a request id, a tenant), for runs one after another and at once. A guard: the
    poll after a wake from another thread once ran in the context of the first run that awaited
    on the loop; that showed in log fields (test_structured_logs), not here, since node, tool
    and edge calls are started in the run's own context."""
    from tests_py.conftest import make_checkpointer

    cp = make_checkpointer(backend, request, tmp_path)

    async def whoami(city: str) -> str:
        await asyncio.sleep(0.01)  # a timer: the wake comes from another thread
        return WHO.get()

    async def model(state: AgentState) -> Message:
        last = state.context[-1]
        if last.role == "tool":
            return Message.text_message(f"{WHO.get()}/{last.text()}", role="assistant")
        return Message(role="assistant", content="", tools_calls=[call("c1", "whoami", {"city": "x"})])

    from tenxgraph.core.graph.tool_node import ToolNode

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([whoami]))
    g.add_edge(START, "model")
    routed: dict[str, list[str]] = {}

    def route(state: AgentState) -> str:  # called by the engine's poll itself, not in a task
        routed.setdefault(state.context[0].text(), []).append(WHO.get())
        return "tools" if state.context[-1].tools_calls else END

    g.add_conditional_edges("model", route)
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=cp)

    async def as_caller(name: str) -> str:
        WHO.set(name)
        out = await app.ainvoke({"messages": [Message.text_message(name)]}, {"thread_id": f"{name}-{tmp_path.name}"})
        assert routed[name] == [name, name], routed
        return out["messages"][-1].text()

    # Separate tasks: each has its own copy of the context, as two requests of a server do.
    assert await asyncio.create_task(as_caller("first")) == "first/first"
    assert await asyncio.create_task(as_caller("second")) == "second/second"
    both = await asyncio.gather(as_caller("third"), as_caller("fourth"))
    assert both == ["third/third", "fourth/fourth"]
    await cp.arelease()
