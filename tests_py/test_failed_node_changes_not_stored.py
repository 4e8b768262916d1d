"""A node that changed the state in place and then failed (raised, hit ``node_timeout``, was
stopped; or its AI ``before_invoke`` callback did and raised) runs again from its start on the
retry: what it changed before is not stored with the failure (helper red-team, session 35).

It was: a counter bumped twice, a note in the thread twice after ``ainvoke({})``. The pause at
``interrupt()`` already stored the state the node started from (session 25); a failure now does
the same. 10xGraph stores the changed state (docs/differences.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.utils import CallbackManager, InvocationType

from .tool_graphs import call, route


class Counted(AgentState):
    counter: int = 0


class LibraryTimeout(BaseException):
    pass


def _bump(state: Counted) -> None:
    state.counter += 1
    state.context.append(Message.text_message(f"note {state.counter}", role="assistant"))


def _one_node(node: Any, checkpointer: Any, mgr: CallbackManager) -> Any:
    g = StateGraph(Counted)
    g.add_node("m", node)
    g.set_entry_point("m")
    g.add_edge("m", END)
    return g.compile(checkpointer=checkpointer, callback_manager=mgr)


def _tools_graph(checkpointer: Any, tools: list[Any], asked: Any, mgr: CallbackManager | None = None,
                 message_id: str | None = None) -> Any:
    """model -> tools -> model: the model asks for ``asked`` (the calls, or a function of the
    user's text giving them), then answers "done"."""
    def model(state: Counted) -> Message:
        last = state.context[-1]
        if last.role == "tool":
            return Message.text_message("done", role="assistant")
        calls = asked(last.text()) if callable(asked) else asked
        return Message(role="assistant", content=[], tools_calls=calls,
                       **({"message_id": message_id} if message_id else {}))

    g = StateGraph(Counted)
    g.add_node("model", model)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer, callback_manager=mgr or CallbackManager())


async def _cut_off(app: Any, cfg: dict[str, Any], how: str, entered: asyncio.Event) -> None:
    """A turn that raises (``node_timeout``: ``cfg`` sets it; or a node's own failure), or is
    stopped by ``stop()`` once ``entered`` is set."""
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg)))
    if how == "stop":
        await asyncio.wait_for(entered.wait(), 30)
        assert (await app.astop(dict(cfg)))["running"] is True
    with pytest.raises(BaseException) if how != "stop" else contextlib.nullcontext():
        await asyncio.wait_for(run, 60)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["raise", "base_exception", "callback", "node_timeout", "stop"])
async def test_what_a_failed_node_changed_in_place_is_not_stored(checkpointer: Any, make_thread: Any, how: str) -> None:
    failing = True
    entered = asyncio.Event()

    def audit(context: Any, data: Any) -> Any:  # an AI before_invoke that records, then fails
        _bump(data["state"])
        if failing:
            raise RuntimeError("audit service down")
        return data

    async def node(state: Counted) -> Message:
        if how != "callback":
            _bump(state)
            entered.set()
            if failing:
                if how == "raise":
                    raise RuntimeError("model down")
                if how == "base_exception":  # a library's timeout built on it (gevent's): session 36
                    raise LibraryTimeout("call timed out")
                await asyncio.sleep(60)  # cut by node_timeout or stop()
        return Message.text_message("ok", role="assistant")

    mgr = CallbackManager()
    if how == "callback":
        mgr.register_before_invoke(InvocationType.AI, audit)
    app = _one_node(node, checkpointer, mgr)
    cfg = {"thread_id": make_thread(), "node_timeout": 0.5 if how == "node_timeout" else 60}
    await _cut_off(app, cfg, how, entered)

    stored = await checkpointer.aget_state(dict(cfg))
    assert (stored.counter, [m.text() for m in stored.context]) == (0, ["hi"])
    assert stored.execution_meta.status == ("interrupted_after" if how == "stop" else "error")

    failing = False
    await app.ainvoke({}, dict(cfg))
    done = await checkpointer.aget_state(dict(cfg))
    assert (done.counter, [m.text() for m in done.context]) == (1, ["hi", "note 1", "ok"])


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["raise", "node_timeout"])
async def test_on_graph_error_sees_the_start_state_and_what_it_returns_is_stored(
    checkpointer: Any, make_thread: Any, how: str
) -> None:
    """The error hook sees the state the failed node started from, and a state it returns is what
    the failure stores, also when the engine commits a node_timeout before the node unwound."""
    from tenxgraph.utils import GraphLifecycleHook

    seen: list[int] = []

    class OnError(GraphLifecycleHook):
        async def on_graph_error(self, ctx, error, partial_state, messages, step, node_name):  # type: ignore[no-untyped-def]
            seen.append(partial_state.counter)
            partial_state.counter = 42
            return partial_state, "handled"

    async def node(state: Counted) -> Message:
        _bump(state)
        if how == "raise":
            raise RuntimeError("model down")
        await asyncio.sleep(60)
        return Message.text_message("never", role="assistant")

    mgr = CallbackManager()
    mgr.register_lifecycle_hook(OnError())
    app = _one_node(node, checkpointer, mgr)
    cfg = {"thread_id": make_thread(), "node_timeout": 0.5 if how == "node_timeout" else 60}
    with pytest.raises(Exception):
        await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg)), 60)
    stored = await checkpointer.aget_state(dict(cfg))
    assert seen == [0]
    assert (stored.counter, [m.text() for m in stored.context]) == (42, ["hi"])


@pytest.mark.asyncio
async def test_without_a_commit_per_step_a_failure_keeps_the_runs_earlier_steps(checkpointer: Any, make_thread: Any) -> None:
    """(Second red-team pass, session 35) With ``durable_checkpoint_every_step=False`` the last
    commit is older than the failed node's start: putting it back lost the steps between (the
    model's tool call and the tool's result), and the retry's model asked again and the charge ran
    twice. There the node's changes stay, as 10xGraph keeps them; nothing finished is lost."""
    charges: list[int] = []
    failing = True

    def charge(amount: int) -> str:
        """Charge the card."""
        charges.append(amount)
        return f"charged {amount}"

    turns = iter(range(100))

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            return Message(role="assistant", content=[], tools_calls=[call(f"call_{next(turns)}", "charge", {"amount": 5})])
        if failing:
            raise RuntimeError("model API 503")
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([charge]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread(), "durable_checkpoint_every_step": False}
    with pytest.raises(Exception):
        await app.ainvoke({"messages": [Message.text_message("pay 5")]}, dict(cfg))
    stored = await checkpointer.aget_state(dict(cfg))
    assert [m.role for m in stored.context] == ["user", "assistant", "tool"]
    failing = False
    await app.ainvoke({}, dict(cfg))
    done = await checkpointer.aget_state(dict(cfg))
    assert charges == [5] and done.context[-1].text() == "done"


@pytest.mark.asyncio
async def test_a_refused_return_value_does_not_keep_the_nodes_changes(checkpointer: Any, make_thread: Any) -> None:
    """A node that changed the state and returned a value that is refused (None: NODE_001) runs
    again from its start too (second red-team pass, session 35)."""
    failing = True

    def node(state: Counted) -> Any:
        _bump(state)
        return None if failing else Message.text_message("ok", role="assistant")

    app = _one_node(node, checkpointer, CallbackManager())
    cfg = {"thread_id": make_thread()}
    with pytest.raises(Exception):
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    stored = await checkpointer.aget_state(dict(cfg))
    assert (stored.counter, [m.text() for m in stored.context]) == (0, ["hi"])
    failing = False
    await app.ainvoke({}, dict(cfg))
    done = await checkpointer.aget_state(dict(cfg))
    assert (done.counter, [m.text() for m in done.context]) == (1, ["hi", "note 1", "ok"])


@pytest.mark.asyncio
async def test_a_sync_node_raising_stop_iteration_fails_at_once(checkpointer: Any, make_thread: Any) -> None:
    """``next(iter([]))`` in a sync node: an asyncio future cannot hold a StopIteration, so the
    node's thread call never completed and the run waited for node_timeout (900 s by default;
    10xGraph the same; differential red-team, session 35). NODE_001 at once now."""
    from tenxgraph.core.exceptions import NodeError

    def first_item(state: Counted) -> Message:
        return next(iter([]))

    app = _one_node(first_item, checkpointer, CallbackManager())
    with pytest.raises(NodeError) as err:
        await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("hi")]},
                                           {"thread_id": make_thread(), "node_timeout": 120}), 60)
    assert err.value.error_code == "NODE_001" and "StopIteration" in str(err.value)


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_strict_state_class_is_put_back_too(backend: str, tmp_path: Any, make_thread: Any) -> None:
    """A strict-mode state class (a datetime field) was never put back: rebuilt in Python mode,
    which refuses a datetime's text, so the change was stored and made again by the retry
    (second red-team pass, session 35). It is validated from JSON now, as a load reads it."""
    import datetime

    from pydantic import ConfigDict

    from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer

    class Strict(AgentState):
        model_config = ConfigDict(strict=True)
        counter: int = 0
        when: datetime.datetime = datetime.datetime(2024, 1, 1)

    failing = True
    started_from: list[int] = []

    def node(state: Strict) -> Message:
        started_from.append(state.counter)
        state.counter += 1
        if failing:
            raise RuntimeError("model down")
        return Message.text_message("ok", role="assistant")

    cp = InMemoryCheckpointer() if backend == "memory" else SqliteCheckpointer(str(tmp_path / "strict.db"))
    g = StateGraph(Strict)
    g.add_node("m", node)
    g.set_entry_point("m")
    g.add_edge("m", END)
    app = g.compile(checkpointer=cp)
    cfg = {"thread_id": make_thread()}
    with pytest.raises(Exception):
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    failing = False
    await app.ainvoke({}, dict(cfg))
    assert started_from == [0, 0]
    await app.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("calls", [1, 2], ids=["one-call", "two-calls"])
@pytest.mark.parametrize("how", ["node_timeout", "stop"])
async def test_a_tool_call_cut_off_after_changing_its_state_runs_again_from_the_nodes_start(
    checkpointer: Any, make_thread: Any, how: str, calls: int
) -> None:
    """A tool that takes the state, changes it in place, then hangs, and is cut off by
    ``node_timeout`` or ``stop()``: the failure stored its change and the retry made it again
    (counter 2, a note twice), where a plain node's is put back (session 37). A sole call works
    on the live state; two calls work on branches, merged only when the node ends."""
    failing = True
    entered = asyncio.Event()

    async def note(state: Counted) -> str:
        """Count the visit."""
        _bump(state)
        entered.set()
        if failing:
            await asyncio.sleep(60)
        return "noted"

    async def peek() -> str:
        """Peek."""
        return "peeked"

    asked = [call("c1", "note")] + ([call("c2", "peek")] if calls == 2 else [])
    app = _tools_graph(checkpointer, [note, peek], asked)
    cfg = {"thread_id": make_thread(), "node_timeout": 0.5 if how == "node_timeout" else 60}
    await _cut_off(app, cfg, how, entered)

    stored = await checkpointer.aget_state(dict(cfg))
    assert (stored.counter, [m.role for m in stored.context]) == (0, ["user", "assistant"])

    failing = False
    await app.ainvoke({}, dict(cfg))
    done = await checkpointer.aget_state(dict(cfg))
    assert done.counter == 1
    # A branch's context is not merged back (10xGraph's merge leaves `context` out).
    notes = [m.text() for m in done.context if m.role == "assistant" and m.text().startswith("note")]
    assert notes == (["note 1"] if calls == 1 else [])
    assert done.context[-1].text() == "done"


@pytest.mark.asyncio
@pytest.mark.parametrize("calls", [1, 2], ids=["one-call", "two-calls"])
@pytest.mark.parametrize("how", ["node_timeout", "stop"])
async def test_a_tool_that_returned_before_its_node_was_cut_keeps_its_changes_through_the_replay(
    checkpointer: Any, make_thread: Any, how: str, calls: int
) -> None:
    """The tool changed its state in place and returned; its TOOL ``after_invoke`` callback hung
    and the node was cut. Its result is recorded (it took effect) and the retry answers it from
    the ledger: the record carried only its ``ToolResult`` update, so the change was lost for
    good once the failure stored the node's start (second red-team pass, session 37; with two
    calls the branch's change was lost before too)."""
    ran = 0
    returned = asyncio.Event()
    hang = True

    async def note(state: Counted) -> str:
        """Count the visit."""
        nonlocal ran
        ran += 1
        state.counter += 1
        return "noted"

    async def peek() -> str:
        """Peek."""
        return "peeked"

    async def after(ctx: Any, data: Any, out: Any) -> Any:
        if hang and ctx.function_name == "note":
            returned.set()
            await asyncio.sleep(60)  # cut off here, after the tool returned
        return out

    asked = [call("c1", "note")] + ([call("c2", "peek")] if calls == 2 else [])
    mgr = CallbackManager()
    mgr.register_after_invoke(InvocationType.TOOL, after)
    app = _tools_graph(checkpointer, [note, peek], asked, mgr)
    cfg = {"thread_id": make_thread(), "node_timeout": 1.0 if how == "node_timeout" else 60}
    await _cut_off(app, cfg, how, returned)

    hang = False
    await app.ainvoke({}, dict(cfg))
    done = await checkpointer.aget_state(dict(cfg))
    assert (done.counter, ran, done.context[-1].text()) == (1, 1, "done")


@pytest.mark.asyncio
@pytest.mark.parametrize("tool", ["returns", "raises-under-callbacks"])
@pytest.mark.parametrize("retry", ["after_it_returned", "while_it_runs"])
async def test_a_sync_tool_that_returns_after_its_node_was_cut_keeps_its_changes(
    checkpointer: Any, make_thread: Any, retry: str, tool: str
) -> None:
    """A sync tool (in a thread no timeout can stop) changes its state in place, its node is
    cut by ``node_timeout``, and it returns later: its late record, or the retry that joins the
    still-running call, carried only its ``ToolResult`` update, and the change was lost for good
    once the failure stored the node's start (third red-team pass, session 37). The changes are
    measured on the worker thread as the tool returns."""
    import logging
    import threading

    ran = 0
    release = threading.Event()
    returned = threading.Event()

    def note(state: Counted) -> str:
        """Count the visit."""
        nonlocal ran
        ran += 1
        state.counter += 1
        release.wait(60)
        returned.set()
        if tool == "raises-under-callbacks":  # TOOL callbacks run it apart (run_sync_raw): fourth pass
            raise RuntimeError("the service answered 500 after the write")
        return "noted"

    mgr = CallbackManager()
    if tool == "raises-under-callbacks":
        mgr.register_after_invoke(InvocationType.TOOL, lambda ctx, data, out: out)

    class OnJoin(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "event", None) == "sync_tool_joined":
                release.set()

    app = _tools_graph(checkpointer, [note], [call("c1", "note")], mgr)
    cfg = {"thread_id": make_thread(), "node_timeout": 0.5}
    with pytest.raises(BaseException):
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    joined = OnJoin()
    tools_log = logging.getLogger("tenxgraph.tools")
    level = tools_log.level
    if retry == "after_it_returned":
        release.set()
        await asyncio.to_thread(returned.wait, 60)
    else:  # released once the retry waits for the running call (its INFO line says so)
        tools_log.addHandler(joined)
        tools_log.setLevel(logging.INFO)
    try:
        await asyncio.wait_for(app.ainvoke({}, dict(cfg, node_timeout=60)), 90)
    finally:
        tools_log.removeHandler(joined)
        tools_log.setLevel(level)
        release.set()
    assert release.is_set()
    done = await checkpointer.aget_state(dict(cfg))
    assert (done.counter, ran, done.context[-1].text()) == (1, 1, "done")


def _late_sync_graph(checkpointer: Any, tool: Any, mgr: CallbackManager | None = None) -> Any:
    # Fixed ids, as a stub model or a recorded cassette gives them.
    return _tools_graph(checkpointer, [tool], lambda text: [call("call_1", tool.__name__, {"q": text})],
                        mgr, message_id="a1")


async def _cut_and_recorded_late(app: Any, cfg: dict[str, Any], release: Any) -> None:
    """The first turn's sync tool is cut by node_timeout, then released; returns once its late
    result is recorded (its WARNING line says so)."""
    import logging
    import threading

    recorded = threading.Event()

    class OnRecord(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "event", None) == "sync_tool_late_result_recorded":
                recorded.set()

    handler = OnRecord()
    logging.getLogger("tenxgraph.tools").addHandler(handler)
    try:
        with pytest.raises(BaseException):
            await app.ainvoke({"messages": [Message.text_message("first question")]}, dict(cfg))
        release.set()
        assert await asyncio.to_thread(recorded.wait, 60)
    finally:
        logging.getLogger("tenxgraph.tools").removeHandler(handler)


@pytest.mark.asyncio
async def test_a_late_recorded_call_is_not_handed_to_a_new_conversation_on_a_cleaned_thread(
    checkpointer: Any, make_thread: Any
) -> None:
    """A sync call recorded late stays joinable for a while (a retry that read the ledger before
    the record went in takes it); the thread was then deleted and a new conversation reused its
    ids (message "a1", call "call_1"): its call was handed the deleted thread's answer and never
    ran (fourth red-team pass, session 37). The ledger is read again before joining."""
    import threading

    ran: list[str] = []
    release = threading.Event()

    def lookup(state: Counted, q: str) -> str:
        """Look something up."""
        ran.append(q)
        if len(ran) == 1:
            release.wait(60)
        return f"answer to {q}"

    app = _late_sync_graph(checkpointer, lookup)
    cfg = {"thread_id": make_thread(), "node_timeout": 0.5}
    await _cut_and_recorded_late(app, cfg, release)
    await checkpointer.aclean_thread(dict(cfg))
    await app.ainvoke({"messages": [Message.text_message("second question")]}, dict(cfg, node_timeout=60))
    stored = await checkpointer.aget_state(dict(cfg))
    assert ran == ["first question", "second question"]
    assert [m.text() for m in stored.context if m.role == "tool"] == ["answer to second question"]


@pytest.mark.asyncio
@pytest.mark.parametrize("tool", ["returns", "raises-under-callbacks"])
async def test_a_late_recorded_call_does_not_keep_its_run_alive(make_thread: Any, tool: str) -> None:
    """What keeps a late-recorded call joinable holds its result only: it held the recorder,
    and with it the run's state (its whole context), the step and the store, for 300 s; and
    (fifth pass) a raised error's traceback, whose tool frame held the state."""
    import gc
    import threading
    import weakref

    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    seen: list[Any] = []
    release = threading.Event()

    def lookup(state: Counted, q: str) -> str:
        """Look something up."""
        seen.append(weakref.ref(state))
        release.wait(60)
        if tool == "raises-under-callbacks":
            raise RuntimeError(f"no answer to {q}")
        return f"answer to {q}"

    cp = InMemoryCheckpointer()
    mgr = CallbackManager()
    if tool == "raises-under-callbacks":
        mgr.register_after_invoke(InvocationType.TOOL, lambda ctx, data, out: out)
    app = _late_sync_graph(cp, lookup, mgr)
    await _cut_and_recorded_late(app, {"thread_id": make_thread(), "node_timeout": 0.5}, release)
    await cp.arelease()
    del app, cp
    for _ in range(3):
        gc.collect()
    assert len(seen) == 1 and seen[0]() is None
