"""``app.arecover()`` in one process, on every backend: which threads a pass resumes, skips and
reports as failed, paging and ``limit``, bad arguments, ``compile(recover_on_start=...)`` and
``aclose()`` while a pass is running. A run "dies" here through the ``after_step`` failpoint
(the model's step committed, then the run raised: the thread is left ``running`` with its lease
free), as a crash leaves it; tests_py/test_recovery.py kills real processes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import FailpointError
from tenxgraph.recovery import RecoveryReport
from tenxgraph.utils.tool_decorator import tool
from tests_py.conftest import make_checkpointer
from tests_py.tool_graphs import call, tool_graph

DIE = "after_step:model=raise"


def _app(checkpointer: Any, counts: dict[str, int], **compile_kw: Any) -> Any:
    async def charge(order_id: str) -> str:
        """Charge an order."""
        counts[order_id] = counts.get(order_id, 0) + 1
        return f"charged {order_id}"

    return tool_graph(AgentState, [charge], [[call("c1", "charge", {"order_id": "x"})]],
                      checkpointer=checkpointer, **compile_kw)


async def _die(app: Any, thread: str, user: str = "anonymous") -> None:
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [Message.text_message("pay")]},
                          {"thread_id": thread, "user_id": user, "failpoints": DIE})
    state = await app._checkpointer.aget_state({"thread_id": thread, "user_id": user})
    assert str(state.execution_meta.status) == "running" and state.execution_meta.current_node == "tools"


async def _status_version(cp: Any, thread: str, user: str = "anonymous") -> tuple[str, int]:
    cfg: dict[str, Any] = {"thread_id": thread, "user_id": user}
    state = await cp.aget_state(cfg)
    return str(state.execution_meta.status), int(cfg["_checkpoint_version"])


@pytest.mark.asyncio
async def test_a_pass_resumes_the_runs_that_died_and_nothing_else(checkpointer, make_thread) -> None:
    counts: dict[str, int] = {}
    app = _app(checkpointer, counts)
    died = {make_thread("died"): "alice", make_thread("died"): "bob"}
    for thread, user in died.items():
        await _die(app, thread, user)
    done = make_thread("done")
    await app.ainvoke({"messages": [Message.text_message("pay")]}, {"thread_id": done})
    paused = make_thread("paused")
    await _app(checkpointer, counts, interrupt_before=["tools"]).ainvoke(
        {"messages": [Message.text_message("pay")]}, {"thread_id": paused})
    failed = make_thread("failed")
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [Message.text_message("pay")]},
                          {"thread_id": failed, "failpoints": "before_tool:charge=raise"})
    untouched = {t: await _status_version(checkpointer, t) for t in (done, paused, failed)}
    assert [s for s, _ in untouched.values()] == ["completed", "interrupted_before", "error"]
    assert counts == {"x": 1}  # only the completed thread's charge so far

    report = await app.arecover()
    assert isinstance(report, RecoveryReport) and report.ok
    assert sorted((r.thread_id, r.user_id, r.status) for r in report.resumed) == sorted(
        (t, u, "completed") for t, u in died.items())
    assert report.skipped == [] and report.failed == []
    assert counts == {"x": 3}  # each died thread's charge, once
    for thread, user in died.items():
        state = await checkpointer.aget_state({"thread_id": thread, "user_id": user})
        assert state.context[-1].text() == "done"
    assert {t: await _status_version(checkpointer, t) for t in untouched} == untouched

    again = await app.arecover()
    assert again == RecoveryReport()  # nothing left to do
    assert counts == {"x": 3}


@pytest.mark.asyncio
async def test_a_run_alive_in_this_process_is_skipped_as_busy(checkpointer, make_thread) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def model(state: AgentState) -> Message:
        entered.set()
        await release.wait()
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=checkpointer)
    thread = make_thread("live")
    task = asyncio.ensure_future(app.ainvoke({"messages": [Message.text_message("hi")]},
                                             {"thread_id": thread, "run_id": "the-live-run"}))
    try:
        await asyncio.wait_for(entered.wait(), 30)
        report = await app.arecover()
        assert report.resumed == [] and report.failed == []
        assert [(s.thread_id, s.reason, s.holder_run_id) for s in report.skipped] == [(thread, "busy", "the-live-run")]
    finally:
        release.set()
    result = await asyncio.wait_for(task, 30)
    assert result["messages"][-1].text() == "done"


@pytest.mark.asyncio
async def test_a_failing_resume_is_reported_and_the_pass_goes_on(checkpointer, make_thread) -> None:
    armed = {"on": False}

    async def first(state: AgentState) -> Message:
        return Message.text_message("step one", role="assistant")

    async def second(state: AgentState) -> Message:
        if armed["on"] and state.context[0].text() == "boom":
            raise RuntimeError("the model provider is down")
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", first)
    g.add_node("second", second)
    g.add_edge(START, "model")
    g.add_edge("model", "second")
    g.add_edge("second", END)
    app = g.compile(checkpointer=checkpointer)
    bad, good = make_thread("a-bad"), make_thread("b-good")
    for thread, text in ((bad, "boom"), (good, "fine")):
        with pytest.raises(FailpointError):
            await app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": thread, "failpoints": DIE})
    armed["on"] = True
    report = await app.arecover(concurrency=1)
    assert [(r.thread_id, r.status) for r in report.resumed] == [(good, "completed")]
    assert len(report.failed) == 1 and not report.ok
    f = report.failed[0]
    assert (f.thread_id, f.error_type, f.error_code, f.status) == (bad, "NodeError", "NODE_001", "error")
    assert "the model provider is down" in f.error
    assert await app.arecover() == RecoveryReport()  # a failed thread is no longer running


@pytest.mark.asyncio
async def test_pages_and_limit(checkpointer, make_thread, monkeypatch: pytest.MonkeyPatch) -> None:
    import tenxgraph.recovery as recovery

    monkeypatch.setattr(recovery, "PAGE_SIZE", 2)
    counts: dict[str, int] = {}
    app = _app(checkpointer, counts)
    threads = [f"{make_thread('page')}-{i}" for i in range(5)]
    for t in threads:
        await _die(app, t)
    first = await app.arecover(limit=3, concurrency=2)
    assert sorted(r.thread_id for r in first.resumed) == sorted(threads)[:3]
    rest = await app.arecover(concurrency=3)
    assert sorted(r.thread_id for r in rest.resumed) == sorted(threads)[3:]
    assert counts == {"x": 5}


def test_sync_recover(tmp_path: Path) -> None:
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    counts: dict[str, int] = {}
    app = _app(SqliteCheckpointer(tmp_path / "s.db"), counts)
    asyncio.run(_die(app, "sync-1"))
    report = app.recover()
    assert [(r.thread_id, r.status) for r in report.resumed] == [("sync-1", "completed")]
    assert counts == {"x": 1}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.asyncio
async def test_user_isolation_resumes_each_thread_as_its_owner(kind: str, request: pytest.FixtureRequest,
                                                               tmp_path: Path) -> None:
    cp = make_checkpointer(kind, request, tmp_path, enforce_user_isolation=True)
    counts: dict[str, int] = {}
    app = _app(cp, counts)
    await _die(app, "iso-1", "alice")
    await _die(app, "iso-2", "bob")
    report = await app.arecover()
    assert sorted((r.thread_id, r.user_id, r.status) for r in report.resumed) == [
        ("iso-1", "alice", "completed"), ("iso-2", "bob", "completed")]
    assert counts == {"x": 2}


BAD_ARGS = [
    ({"concurrency": 0}, ValueError, "concurrency must be an int >= 1"),
    ({"concurrency": -1}, ValueError, "concurrency must be an int >= 1"),
    ({"concurrency": True}, ValueError, "concurrency must be an int >= 1"),
    ({"concurrency": 2.5}, ValueError, "concurrency must be an int >= 1"),
    ({"concurrency": "2"}, ValueError, "concurrency must be an int >= 1"),
    ({"limit": 0}, ValueError, "limit must be None or an int >= 1"),
    ({"limit": False}, ValueError, "limit must be None or an int >= 1"),
    ({"config": "fast"}, TypeError, "config must be a dict"),
    ({"config": {"thread_id": "t"}}, ValueError, "config must not set 'thread_id'"),
    ({"config": {"user_id": "u"}}, ValueError, "config must not set 'user_id'"),
    ({"config": {"on_busy": "wait"}}, ValueError, "config must not set 'on_busy'"),
    ({"config": {"recursion_limit": 0}}, ValueError, "recursion_limit must be a positive int"),
    ({"config": {"lease_ttl": -1}}, ValueError, "lease_ttl must be a number of seconds"),
]


@pytest.mark.parametrize("kwargs,exc,match", BAD_ARGS, ids=[str(a[0]) for a in BAD_ARGS])
@pytest.mark.asyncio
async def test_bad_arguments_raise_before_any_thread_is_touched(tmp_path: Path, kwargs: dict[str, Any], exc: type,
                                                                match: str) -> None:
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    cp = SqliteCheckpointer(tmp_path / "bad.db")
    counts: dict[str, int] = {}
    app = _app(cp, counts)
    await _die(app, "bad-1")
    before = await _status_version(cp, "bad-1")
    with pytest.raises(exc, match=match):
        await app.arecover(**kwargs)
    assert await _status_version(cp, "bad-1") == before == ("running", before[1])
    assert counts == {}


@pytest.mark.parametrize("value,exc,match", [
    ("yes", TypeError, "recover_on_start must be a bool or a dict"),
    ({"concurency": 2}, ValueError, "recover_on_start options are concurrency, limit and config"),
])
def test_bad_recover_on_start_is_refused_at_compile(value: Any, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _app(None, {}, recover_on_start=value)


@pytest.mark.asyncio
async def test_recover_on_start_runs_in_the_background(checkpointer, make_thread) -> None:
    counts: dict[str, int] = {}
    await _die(_app(checkpointer, counts), thread := make_thread("start"))
    async with _app(checkpointer, counts, recover_on_start={"concurrency": 2}) as app:
        assert app.recovery is not None
        report = await asyncio.wait_for(app.recovery, 60)
    assert [(r.thread_id, r.status) for r in report.resumed] == [(thread, "completed")]
    assert counts == {"x": 1}
    # Without the option nothing starts by itself.
    async with _app(checkpointer, counts) as plain:
        assert plain.recovery is None


@pytest.mark.asyncio
async def test_aclose_cancels_a_pass_that_hangs_and_the_thread_waits_for_the_next(tmp_path: Path) -> None:
    """A resume that hangs does not hang shutdown: aclose() waits two thirds of
    shutdown_timeout, then cancels the pass; the thread stays running and the next pass
    finishes it."""
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    db = tmp_path / "hang.db"
    counts: dict[str, int] = {}
    await _die(_app(SqliteCheckpointer(db), counts), "hang-1")
    entered = asyncio.Event()

    async def hang(order_id: str) -> str:
        """Charge an order (never returns)."""
        entered.set()
        await asyncio.Event().wait()
        return "unreachable"

    hanging = tool_graph(AgentState, [tool(name="charge")(hang)], [[call("c1", "charge", {"order_id": "x"})]],
                         checkpointer=SqliteCheckpointer(db), recover_on_start=True, shutdown_timeout=0.6)
    async with hanging:
        await asyncio.wait_for(entered.wait(), 30)
    assert hanging.recovery is not None and hanging.recovery.cancelled()
    cp = SqliteCheckpointer(db)
    assert (await _status_version(cp, "hang-1"))[0] == "running"
    report = await _app(cp, counts).arecover()
    assert [(r.thread_id, r.status) for r in report.resumed] == [("hang-1", "completed")]
    assert counts == {"x": 1}


@pytest.mark.asyncio
async def test_a_huge_concurrency_starts_no_more_resumes_than_threads(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """(session 31) The pass made ``concurrency`` worker tasks up front: 10**6 (the CLI takes up
    to 2**63-1) cost 1.5 GB before any thread was looked at. They start as threads are found."""
    import types

    import tenxgraph.recovery as recovery
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    counts: dict[str, int] = {}
    app = _app(SqliteCheckpointer(tmp_path / "huge.db"), counts)
    await _die(app, "huge-1")
    started: list[Any] = []

    def create_task(coro: Any, **kw: Any) -> Any:
        started.append(coro)
        return asyncio.create_task(coro, **kw)

    # The recovery module's own view of asyncio: only the tasks it starts are counted.
    monkeypatch.setattr(recovery, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "create_task": create_task}))
    report = await app.arecover(concurrency=10**5)
    assert [r.thread_id for r in report.resumed] == ["huge-1"] and counts == {"x": 1}
    assert len(started) == 1, len(started)
