"""The per-turn paths issue 16 (session 8) made cheaper, pinned by behaviour: the stream emitter
queues chunks directly on the loop thread and keeps emission order across threads; the tool
step's ledger envelope and the messages it puts in the state come from one encoding of each
result; the execution metadata mirror assigns only what changed."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph._runtime import Run
from tenxgraph._stream import Emitter
from tenxgraph._tool_step import ToolStep, _Call
from tenxgraph.core.state.stream_chunks import StreamEvent
from tests_py.tool_graphs import call, tool_graph, tool_texts

CONFIG = {"thread_id": "t", "run_id": "r"}


def chunk(em: Emitter, text: str) -> Any:
    return em.make(StreamEvent.MESSAGE, message=Message.text_message(text))


@pytest.mark.asyncio
async def test_emit_on_the_loop_thread_is_queued_at_once() -> None:
    em = Emitter(asyncio.get_running_loop(), "low", CONFIG)
    em.emit(chunk(em, "a"))
    em.hold(chunk(em, "b"))
    em.flush()
    em.close()
    # No loop iteration has run since: a call_soon_threadsafe hand-off would still be pending.
    assert em.queue.qsize() == 3
    got = [em.queue.get_nowait() for _ in range(3)]
    assert [c.message.text() for c in got[:2]] == ["a", "b"] and got[2] is None


@pytest.mark.asyncio
async def test_chunks_keep_their_order_across_threads() -> None:
    em = Emitter(asyncio.get_running_loop(), "low", CONFIG)
    emitted = threading.Event()

    def other_thread() -> None:
        em.emit(chunk(em, "from another thread"))
        emitted.set()

    threading.Thread(target=other_thread).start()
    # Wait without running the loop, so the other thread's hand-off is still pending here.
    assert emitted.wait(timeout=60)
    em.emit(chunk(em, "from the loop thread, later"))
    em.close()
    got = []
    while True:
        c = await asyncio.wait_for(em.queue.get(), timeout=60)
        if c is None:
            break
        got.append(c.message.text())
    assert got == ["from another thread", "from the loop thread, later"]


class _Outcome:
    def __init__(self, message: Message, state_update: dict[str, Any] | None = None) -> None:
        self.message = message
        self.state_update = state_update
        self.recordable = True


def _step() -> ToolStep:
    call_ = _Call("c1", "lookup", "{}", raw_id="c1")
    return ToolStep("tools", None, "m1", [call_], AgentState(), None)


def test_envelope_holds_the_message_and_the_state_update() -> None:
    step = _step()
    msg = Message.tool_message([], meta={"function_name": "lookup", "tool_call_id": "c1"})
    text = msg.model_dump_json()
    envelope, record = step._envelope_of(0, _Outcome(msg, {"n": 1, "s": {"state": [1]}}), "k", text)
    env = json.loads(envelope)
    assert record is True
    assert env == {"__kind__": "message", "value": msg.model_dump(mode="json"), "state": {"n": 1, "s": {"state": [1]}}}
    plain, _ = step._envelope_of(0, _Outcome(msg), "k")
    assert json.loads(plain) == {"__kind__": "message", "value": msg.model_dump(mode="json")}


def test_an_unserialisable_state_update_is_left_out_and_not_recorded() -> None:
    step = _step()
    msg = Message.tool_message([], meta={"function_name": "lookup", "tool_call_id": "c1"})
    envelope, record = step._envelope_of(0, _Outcome(msg, {"n": 2**70}), "k")
    assert record is False
    assert "state" not in json.loads(envelope)


def test_finish_gives_fresh_messages_equal_to_the_record() -> None:
    step = _step()
    msg = Message.tool_message([], meta={"function_name": "lookup", "tool_call_id": "c1"})
    envelope = step._answer(0, msg)
    first = step.finish([("ran", envelope)])[0]
    again = step.message_of(0, envelope)
    assert first.model_dump(mode="json") == json.loads(envelope)["value"] == msg.model_dump(mode="json")
    assert first is not msg and again is not first  # the state never shares the result object
    # Without a kept text (a result this process did not make), the envelope is read.
    other = _step()
    assert other.message_of(0, envelope).model_dump(mode="json") == msg.model_dump(mode="json")


@pytest.mark.asyncio
async def test_tool_results_returned_equal_those_stored(checkpointer, make_thread) -> None:
    ran: list[int] = []

    async def lookup(x: int) -> dict[str, Any]:
        ran.append(x)
        return {"x": x, "nested": {"state": [x, "ü"]}}

    app = tool_graph(AgentState, [lookup], [[call("c1", "lookup", {"x": 1}), call("c2", "lookup", {"x": 2})]],
                     checkpointer=checkpointer)
    thread = make_thread()
    r = await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": thread})
    fresh = tool_texts(r["messages"])
    assert sorted(ran) == [1, 2]
    state = await checkpointer.aget_state({"thread_id": thread})
    stored = [m for m in state.context if m.role == "tool"]
    assert [m.model_dump(mode="json")["content"] for m in stored] == [
        m.model_dump(mode="json")["content"] for m in r["messages"] if m.role == "tool"]
    assert set(fresh) == {"c1", "c2"}


class _View:
    """An ExecView stand-in: the attributes `_apply_exec` reads."""

    def __init__(self, **kw: Any) -> None:
        base = dict(current_node="a", step=1, status="running", interrupted_node=None, interrupt_reason=None,
                    interrupt_data=None, thread_id="t", stop_current_execution="none", error=None)
        base.update(kw)
        self.__dict__.update(base)


def test_exec_mirror_assigns_only_changed_fields() -> None:
    state = AgentState()
    Run._apply_exec(state, _View())
    em = state.execution_meta
    assert (em.current_node, em.step, em.status.value, em.thread_id) == ("a", 1, "running", "t")
    data = {"k": [1]}
    Run._apply_exec(state, _View(interrupt_data=data))
    kept = em.interrupt_data
    assert kept == data
    Run._apply_exec(state, _View(interrupt_data={"k": [1]}, step=2, status="completed",
                                 stop_current_execution="stop_requested", error="boom"))
    assert em.interrupt_data is kept  # equal: not assigned again
    assert (em.step, em.status.value, em.stop_current_execution.value) == (2, "completed", "stop_requested")
    assert em.internal_data["error"] == "boom"


def test_fresh_message_ids_are_uuid4_strings() -> None:
    import uuid

    from tenxgraph.core.state.message import generate_id

    ids = {generate_id() for _ in range(2000)}
    assert len(ids) == 2000
    for text in ids:
        u = uuid.UUID(text)
        assert (u.version, u.variant, str(u)) == (4, uuid.RFC_4122, text)
    assert Message.text_message("x").message_id != Message.text_message("x").message_id


def _sqlite_app(path: Any) -> Any:
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    async def lookup(x: int) -> str:
        return f"looked up {x}"

    # SQLite's I/O completes on its driver's thread: every store await is woken from another
    # thread, through the loop thread's wake socket.
    return tool_graph(AgentState, [lookup], [[call("c1", "lookup", {"x": 1}), call("c2", "lookup", {"x": 2})]],
                      checkpointer=SqliteCheckpointer(path))


def test_one_loop_driven_from_two_threads_in_turn(tmp_path: Any) -> None:
    """The wake socket is per thread and watched per loop and thread: a loop that moves to
    another thread watches that thread's socket too (a wake nobody reads would hang the run)."""
    app = _sqlite_app(tmp_path / "cp.db")
    loop = asyncio.new_event_loop()
    results: dict[str, Any] = {}

    def run_on(name: str) -> None:
        asyncio.set_event_loop(loop)
        results[name] = loop.run_until_complete(
            asyncio.wait_for(app.ainvoke({"messages": [Message.text_message(name)]}, {"thread_id": name}), 120))

    try:
        for name in ("first", "second"):
            t = threading.Thread(target=run_on, args=(name,))
            t.start()
            t.join(timeout=180)
            assert not t.is_alive(), f"the run on thread {name} did not finish"
    finally:
        loop.close()
    for name in ("first", "second"):
        assert tool_texts(results[name]["messages"]) == {"c1": "looked up 1", "c2": "looked up 2"}


def test_many_loops_in_turn_on_one_thread(tmp_path: Any) -> None:
    """Each new loop (asyncio.run) watches the thread's wake socket from its first native await."""
    app = _sqlite_app(tmp_path / "cp.db")
    for i in range(5):
        r = asyncio.run(asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("go")]},
                                                     {"thread_id": f"loop-{i}"}), 120))
        assert tool_texts(r["messages"]) == {"c1": "looked up 1", "c2": "looked up 2"}


@pytest.mark.asyncio
async def test_concurrent_runs_woken_from_other_threads(tmp_path: Any) -> None:
    """Several runs on one loop, all woken through the one socket, each finishes with its own
    results."""
    app = _sqlite_app(tmp_path / "cp.db")
    runs = [app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": f"t{i}"}) for i in range(8)]
    results = await asyncio.wait_for(asyncio.gather(*runs), 180)
    assert all(tool_texts(r["messages"]) == {"c1": "looked up 1", "c2": "looked up 2"} for r in results)
