"""astream/stream run through the same Rust loop as ainvoke: ledger, commits, deadlines, stop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.state.stream_chunks import StreamChunk, StreamEvent
from tenxgraph.utils import interrupt, pending_interrupt
from tests_py.tool_graphs import call, seen_cancelled, tool_graph, tool_texts




def user(text: str) -> Message:
    return Message.text_message(text)


async def collect(agen: Any) -> list[StreamChunk]:
    return [c async for c in agen]


def texts(chunks: list[StreamChunk]) -> list[str]:
    return [c.message.text() for c in chunks if c.message is not None]


@pytest.mark.asyncio
async def test_stream_granularity_and_order(checkpointer, make_thread) -> None:
    async def a(x: int) -> str:
        return f"a{x}"

    app = tool_graph(AgentState, [a], [[call("c1", "a", {"x": 1})]], checkpointer=checkpointer)
    low = await collect(app.astream({"messages": [user("go")]}, {"thread_id": make_thread()}))
    assert {c.event for c in low} <= {StreamEvent.MESSAGE, StreamEvent.ERROR}
    assert texts(low) == ["go", "calling tools (turn 1)", "a1", "done"]
    assert low[0].metadata["status"] == "invoking_graph"
    assert all(c.thread_id and c.run_id for c in low)

    partial = await collect(app.astream({"messages": [user("go")]}, {"thread_id": make_thread()}, "partial"))
    events = {c.event for c in partial}
    assert StreamEvent.STATE in events and StreamEvent.UPDATES not in events
    assert all(isinstance(c.state, AgentState) for c in partial if c.event == StreamEvent.STATE)

    full = await collect(app.astream({"messages": [user("go")]}, {"thread_id": make_thread()}, "full"))
    statuses = [c.data["status"] for c in full if c.event == StreamEvent.UPDATES]
    assert statuses[0] == "invoking_node" and statuses[-1] == "graph_invoked"
    assert "node_invoked" in statuses
    final = full[-1].data
    assert final["is_interrupted"] is False and final["total_messages"] == 4
    # The same thread, read back: the stream committed what it showed.
    r = await app.ainvoke({"messages": [user("again")]}, {"thread_id": full[0].thread_id})
    assert tool_texts(r["messages"]) == {"c1": "a1"}


@pytest.mark.asyncio
async def test_stream_shows_a_node_only_after_its_commit(checkpointer, make_thread) -> None:
    app = tool_graph(AgentState, [], [[]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    async for chunk in app.astream({"messages": [user("hi")]}, cfg):
        if chunk.message is not None and chunk.message.role == "assistant":
            stored = await checkpointer.aget_state(dict(cfg))
            assert any(m.message_id == chunk.message.message_id for m in stored.context)


@pytest.mark.asyncio
async def test_leaving_the_stream_cancels_work_and_keeps_committed_steps(checkpointer, make_thread) -> None:
    seen: list[str] = []
    runs = {"fast": 0, "slow": 0}  # a stream shows a tool result only once the ledger has it

    async def fast() -> str:
        runs["fast"] += 1
        return "fast"

    async def slow() -> str:
        runs["slow"] += 1
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "slow"

    app = tool_graph(AgentState, [fast, slow], [[call("c1", "fast"), call("c2", "slow")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    # aclosing: leaving an `async for` early closes the generator only when it is garbage
    # collected; aclosing (or aclose()) makes the cancellation immediate.
    async with contextlib.aclosing(app.astream({"messages": [user("go")]}, cfg)) as stream:
        async for chunk in stream:
            if chunk.message is not None and chunk.message.text() == "fast":
                break  # the client stops reading while "slow" runs
    for _ in range(100):  # the cancellation crosses into Rust and back: allow a loaded machine time
        if seen:
            break
        await asyncio.sleep(0.02)
    # "slow" was either running and got CancelledError, or had not started yet and never will
    # (its task is cancelled before its first step): in no case is it left running.
    assert seen == ["cancelled"] if runs["slow"] else seen == [], (runs, seen)
    await asyncio.sleep(0.1)
    assert runs["slow"] <= 1 and len(seen) == runs["slow"]
    # ainvoke resumes what the stream left: the finished tool comes from the ledger.
    async def slow() -> str:  # noqa: F811 - a healthy "slow" for the resume
        return "slow now"

    app2 = tool_graph(AgentState, [fast, slow], [[call("c1", "fast"), call("c2", "slow")]], checkpointer=checkpointer)
    r = await app2.ainvoke({}, cfg)
    assert runs["fast"] == 1
    assert tool_texts(r["messages"]) == {"c1": "fast", "c2": "slow now"}


@pytest.mark.asyncio
async def test_stream_enforces_tool_timeout_and_stop(checkpointer, make_thread) -> None:
    async def stuck() -> str:
        await asyncio.sleep(30)
        return "never"

    app = tool_graph(AgentState, [stuck], [[call("c1", "stuck")]], checkpointer=checkpointer)
    chunks = await collect(app.astream({"messages": [user("x")]}, {"thread_id": make_thread(), "tool_timeout": 0.2}))
    failed = [c for c in chunks if c.event == StreamEvent.ERROR]
    assert failed and "NODE_TIMEOUT_002" in failed[0].message.text()

    started = asyncio.Event()

    async def forever() -> str:
        started.set()
        await asyncio.sleep(3600)
        return "never"

    app = tool_graph(AgentState, [forever], [[call("c1", "forever")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    consumer = asyncio.create_task(collect(app.astream({"messages": [user("x")]}, cfg, "full")))
    await asyncio.wait_for(started.wait(), 10)
    t0 = time.perf_counter()
    await app.astop(cfg)
    chunks = await asyncio.wait_for(consumer, 5)
    assert time.perf_counter() - t0 < 1.0
    assert any(c.data and c.data.get("status") == "stopped" for c in chunks)


@pytest.mark.asyncio
async def test_stream_interrupt_and_resume_by_either_path(checkpointer, make_thread) -> None:
    async def ask(state: AgentState) -> str:
        return f"answer: {interrupt('approve?')}"

    from tenxgraph import END, START, StateGraph

    g = StateGraph()
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    chunks = await collect(app.astream({"messages": [user("x")]}, cfg, "full"))
    paused = [c for c in chunks if c.data and c.data.get("status") == "interrupted"]
    assert paused and paused[0].data["interrupt"]["value"] == "approve?"
    assert chunks[-1].data["is_interrupted"] is True
    r = await app.ainvoke({"resume": "yes"}, cfg)
    assert r["messages"][-1].text() == "answer: yes"

    cfg2 = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [user("x")]}, cfg2)
    assert pending_interrupt(await checkpointer.aget_state(dict(cfg2))) is not None
    chunks = await collect(app.astream({"resume": "streamed"}, cfg2))
    assert texts(chunks)[-1] == "answer: streamed"


@pytest.mark.asyncio
async def test_stream_error_chunk_then_the_exception(checkpointer, make_thread) -> None:
    from tenxgraph import END, START, StateGraph
    from tenxgraph.core.exceptions import NodeError

    def broken(state: AgentState) -> str:
        raise ValueError("kaput")

    g = StateGraph()
    g.add_node("broken", broken)
    g.add_edge(START, "broken")
    g.add_edge("broken", END)
    app = g.compile(checkpointer=checkpointer)
    got: list[StreamChunk] = []
    with pytest.raises(NodeError) as e:
        async for c in app.astream({"messages": [user("x")]}, {"thread_id": make_thread()}):
            got.append(c)
    assert e.value.error_code == "NODE_001"
    last = got[-1]
    assert last.event == StreamEvent.ERROR and "kaput" in last.data["error"]
    # 10xGraph's keys too (a consumer reads data["reason"] and data["node"]), and the state.
    assert last.data["reason"] == str(e.value) and last.data["node"] == "broken"
    assert last.data["max_steps"] == 25 and isinstance(last.data["step"], int)
    assert last.state is not None and last.state.context[-1].text() == "x"


def test_sync_stream_and_early_exit(make_thread) -> None:
    runs = {"slow": 0}

    async def a() -> str:
        return "a"

    def slow() -> str:
        runs["slow"] += 1
        time.sleep(0.3)
        return "slow"

    app = tool_graph(AgentState, [a, slow], [[call("c1", "a")]])
    got = [c.message.text() for c in app.stream({"messages": [user("go")]}, {"thread_id": make_thread()})]
    assert got == ["go", "calling tools (turn 1)", "a", "done"]
    stream = app.stream({"messages": [user("go")]}, {"thread_id": make_thread()})
    first = next(stream)
    assert first.message.text() == "go"
    stream.close()  # leaving early ends the worker thread and the run


def test_leaving_a_sync_stream_while_a_tool_runs_cancels_the_tool_at_once(make_thread) -> None:
    """The consumer of ``stream()`` leaves while a tool is running (here one that would wait for
    ever). Until session 23 ``close()`` waited for the tool to finish (up to ``tool_timeout``,
    300 s: a hang from the caller's side) and the tool was not cancelled; the worker only looked
    at the consumer at the next chunk. Now leaving cancels the run where it is, as leaving
    ``astream`` does, and the thread stays at its in-flight node for a resume."""
    import threading

    started, ended = threading.Event(), []

    async def wait_forever() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        return "never"

    app = tool_graph(AgentState, [wait_forever], [[call("c1", "wait_forever")]])
    cfg = {"thread_id": make_thread("sync-leave")}
    stream = app.stream({"messages": [user("go")]}, cfg)
    assert next(stream).message.text() == "go"
    assert started.wait(60), "the tool never started"
    closer = threading.Thread(target=stream.close, daemon=True)
    closer.start()
    closer.join(60)  # without the cancel, this waits on a tool that never returns
    assert not closer.is_alive(), "leaving the stream waits for the running tool"
    assert ended == ["cancelled"]


def _support_turn_app(checkpointer: Any):
    async def lookup_order(order_id: str) -> str:
        await asyncio.sleep(0.01)
        return "order found"

    async def charge_card(order_id: str, amount_cents: int) -> str:
        await asyncio.sleep(0.05)
        return "charged"

    async def send_receipt(order_id: str) -> str:
        await asyncio.sleep(0.1)
        return "sent"

    turn = [call("call_1", "lookup_order", {"order_id": "4821"}),
            call("call_2", "charge_card", {"order_id": "4821", "amount_cents": 12900}),
            call("call_3", "send_receipt", {"order_id": "4821"})]
    return tool_graph(AgentState, [lookup_order, charge_card, send_receipt], [turn], checkpointer=checkpointer)


SUPPORT_TURN_FULL = [
    ("message", "invoking_graph", None, "charge and email"),
    ("updates", "invoking_node", "model", None),
    ("message", "node_invoked", "model", "calling tools (turn 1)"),
    ("updates", "node_invoked", "model", None),
    ("state", "node_invoked", "model", None),
    ("updates", "invoking_node", "tools", None),
    ("message", "tool_result", "tools", "order found"),
    ("message", "tool_result", "tools", "charged"),
    ("message", "tool_result", "tools", "sent"),
    ("updates", "node_invoked", "tools", None),
    ("state", "node_invoked", "tools", None),
    ("updates", "invoking_node", "model", None),
    ("message", "node_invoked", "model", "done"),
    ("updates", "node_invoked", "model", None),
    ("state", "node_invoked", "model", None),
    ("updates", "graph_invoked", None, None),
]


@pytest.mark.asyncio
@pytest.mark.parametrize("granularity", ["low", "partial", "full"])
async def test_support_turn_chunk_sequence_is_pinned(checkpointer, make_thread, granularity: str) -> None:
    app = _support_turn_app(checkpointer)
    chunks = await collect(app.astream({"messages": [user("charge and email")]}, {"thread_id": make_thread()},
                                       granularity))
    got = [(c.event.value, c.metadata.get("status"), c.metadata.get("node"), c.message.text() if c.message else None)
           for c in chunks]
    keep = {"low": {"message", "error"}, "partial": {"message", "error", "state"}, "full": None}[granularity]
    expected = [e for e in SUPPORT_TURN_FULL if keep is None or e[0] in keep]
    assert got == expected


@pytest.mark.asyncio
async def test_stream_node_timeout(checkpointer, make_thread) -> None:
    from tenxgraph import END, START, StateGraph
    from tenxgraph.core.exceptions import NodeTimeoutError

    seen: list[str] = []

    async def slow(state: AgentState) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    g = StateGraph()
    g.add_node("slow", slow)
    g.add_edge(START, "slow")
    g.add_edge("slow", END)
    app = g.compile(checkpointer=checkpointer)
    with pytest.raises(NodeTimeoutError) as e:
        await collect(app.astream({"messages": [user("x")]}, {"thread_id": make_thread(), "node_timeout": 0.2}))
    assert e.value.error_code == "NODE_TIMEOUT_001"
    await seen_cancelled(seen)


@pytest.mark.asyncio
async def test_a_streamed_turn_answers_unreadable_tool_arguments_as_invoke_does(checkpointer, make_thread) -> None:
    """Arguments nested past the interpreter's recursion limit: the tool answers with an error the
    model reads, under ``ainvoke`` and ``astream`` alike. The stream's chunk decoration (session
    21: the parsed ``args`` in the chunk's data) raised RecursionError there, failed the tool
    node after its messages were in the live state, and stored an error state whose context
    already ended in the tool result: every ``{}`` after it failed with NODE_002 (red-team)."""
    deep = '{"order_id": ' + "[" * 50000 + "]" * 50000 + "}"

    def lookup(order_id: str = "x") -> str:
        """Looks an order up."""
        return "ok"

    app = tool_graph(AgentState, [lookup], [[call("c1", "lookup", raw_args=deep)]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("deep-args")}
    chunks = [c async for c in app.astream({"messages": [Message.text_message("hi")]}, dict(cfg))]
    tool_chunk = next(c for c in chunks if c.message is not None and c.message.role == "tool")
    assert tool_chunk.data is not None and tool_chunk.data["args"] == deep  # as the model sent it
    state = await checkpointer.aget_state(dict(cfg))
    assert state.execution_meta.status == "completed"
    assert [m.role for m in state.context] == ["user", "assistant", "tool", "assistant"]
    assert "failed" in state.context[2].text()
    again = await app.ainvoke({"messages": [Message.text_message("again")]}, dict(cfg))
    assert again["messages"][-1].text() == "done"
