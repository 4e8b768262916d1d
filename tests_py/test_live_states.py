"""Live states kept between runs (tenxgraph._live_states): a thread's next turn in this process
reuses the state its last run committed, and only while the store confirms that commit is still
the thread's latest. Every backend; the counters come from the Rust loop."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph, metrics
from tenxgraph.utils import interrupt

from .conftest import make_checkpointer




class Notes(AgentState):
    turns: int = 0
    tags: list[str] = []


def user(text: str) -> Message:
    return Message.text_message(text, role="user")


async def reply(state: Notes, config: dict[str, Any]) -> Notes:
    state.turns += 1
    state.context.append(Message.text_message(f"reply {state.turns} to {state.context[-1].text()}", role="assistant"))
    return state


def build(cp: Any, node: Any = reply, **compile_kw: Any) -> Any:
    """START -> node -> END."""
    g = StateGraph(Notes())
    g.add_node("reply", node)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=cp, **compile_kw)


def counters() -> tuple[float, float]:
    snap = metrics.snapshot()
    return snap["tenxgraph.storage.history_loads"], snap["tenxgraph.storage.live_state_reuses"]


def delta(before: tuple[float, float]) -> tuple[float, float]:
    now = counters()
    return now[0] - before[0], now[1] - before[1]


async def texts(cp: Any, thread: str) -> list[str]:
    state = await cp.aget_state({"thread_id": thread})
    return [m.text() for m in state.context]


@pytest.mark.asyncio
async def test_a_second_turn_reuses_the_live_state_and_stores_the_same(checkpointer: Any, make_thread: Any) -> None:
    app, t = build(checkpointer), make_thread()
    await app.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    before = counters()
    for word in ("two", "three"):
        out = await app.ainvoke({"messages": [user(word)]}, {"thread_id": t})
        assert out["messages"][-1].text() == f"reply {['two', 'three'].index(word) + 2} to {word}"
    assert delta(before) == (0, 2)
    assert await texts(checkpointer, t) == ["one", "reply 1 to one", "two", "reply 2 to two", "three", "reply 3 to three"]
    stored = await checkpointer.aget_state({"thread_id": t})
    assert stored.turns == 3


@pytest.mark.asyncio
async def test_a_write_from_elsewhere_is_seen_and_the_kept_state_dropped(
    checkpointer: Any, make_thread: Any, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    app, t = build(checkpointer), make_thread()
    await app.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    # Another writer moves the thread on: aput_state through the checkpointer, not the graph.
    state = await checkpointer.aget_state({"thread_id": t})
    state.tags = ["edited elsewhere"]
    state.context.append(Message.text_message("a note from an operator", role="assistant"))
    await checkpointer.aput_state({"thread_id": t}, state)
    before = counters()
    await app.ainvoke({"messages": [user("two")]}, {"thread_id": t})
    assert delta(before) == (1, 0)
    stored = await checkpointer.aget_state({"thread_id": t})
    assert stored.tags == ["edited elsewhere"] and stored.turns == 2
    assert await texts(checkpointer, t) == ["one", "reply 1 to one", "a note from an operator", "two", "reply 2 to two"]


@pytest.mark.asyncio
async def test_a_thread_deleted_and_written_again_to_the_same_version_is_loaded(
    checkpointer: Any, make_thread: Any
) -> None:
    app, other, t = build(checkpointer), build(checkpointer), make_thread()
    await app.ainvoke({"messages": [user("first life")]}, {"thread_id": t})
    await checkpointer.aclear_state({"thread_id": t})
    # A second graph (its own live states) writes the thread again, reaching the same version.
    await other.ainvoke({"messages": [user("second life")]}, {"thread_id": t})
    before = counters()
    await app.ainvoke({"messages": [user("again")]}, {"thread_id": t})
    assert delta(before) == (1, 0)
    assert await texts(checkpointer, t) == ["second life", "reply 1 to second life", "again", "reply 2 to again"]


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_two_processes_worth_of_graphs_on_one_database_never_see_a_stale_state(
    backend: str, request: pytest.FixtureRequest, tmp_path: Any, make_thread: Any
) -> None:
    # Two checkpointer objects on one database stand for two workers; turns alternate between them.
    cp_a = make_checkpointer(backend, request, tmp_path)
    cp_b = (make_checkpointer(backend, request, tmp_path) if backend == "sqlite"
            else type(cp_a)(request.getfixturevalue("tenx_postgres").dsn, schema=cp_a.schema,
                            enforce_user_isolation=False))
    a, b, t = build(cp_a), build(cp_b), make_thread()
    before = counters()
    for i in range(5):  # a, b, a, b, a: each finds the other's commit
        await (a if i % 2 == 0 else b).ainvoke({"messages": [user(f"m{i}")]}, {"thread_id": t})
    assert delta(before) == (4, 0)
    # And twice in a row on one worker: the second of those reuses its own state.
    before = counters()
    await b.ainvoke({"messages": [user("m5")]}, {"thread_id": t})
    await b.ainvoke({"messages": [user("m6")]}, {"thread_id": t})
    assert delta(before) == (1, 1)
    stored = await cp_a.aget_state({"thread_id": t})
    assert stored.turns == 7
    assert [m.text() for m in stored.context] == [x for i in range(7) for x in (f"m{i}", f"reply {i + 1} to m{i}")]
    await cp_b.arelease()


@pytest.mark.asyncio
async def test_what_a_caller_gets_back_cannot_change_the_kept_state(checkpointer: Any, make_thread: Any) -> None:
    app, t = build(checkpointer), make_thread()
    out = await app.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    out["messages"][-1].content.clear()  # the caller scribbles on the returned reply
    await app.ainvoke({"messages": [user("two")]}, {"thread_id": t})
    assert await texts(checkpointer, t) == ["one", "reply 1 to one", "two", "reply 2 to two"]
    # "full" hands out the live state itself: it is not kept, the next run loads from the store.
    full = await app.ainvoke({"messages": [user("three")]}, {"thread_id": t}, response_granularity="full")
    full["state"].context.clear()
    full["state"].turns = 99
    before = counters()
    await app.ainvoke({"messages": [user("four")]}, {"thread_id": t})
    assert delta(before) == (1, 0)
    stored = await checkpointer.aget_state({"thread_id": t})
    assert stored.turns == 4 and len(stored.context) == 8


@pytest.mark.asyncio
async def test_a_failed_run_is_not_kept(checkpointer: Any, make_thread: Any) -> None:
    calls = {"n": 0}

    async def flaky(state: Notes, config: dict[str, Any]) -> Notes:
        calls["n"] += 1
        state.tags.append(f"touched {calls['n']}")  # changed in place, then the node fails
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return await reply(state, config)

    app, t = build(checkpointer, flaky), make_thread()
    await app.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    with pytest.raises(Exception, match="boom"):
        await app.ainvoke({"messages": [user("two")]}, {"thread_id": t})
    assert len(app._live) == 0
    before = counters()
    await app.ainvoke({}, {"thread_id": t})  # the failed node runs again, from the store
    assert delta(before) == (1, 0)
    stored = await checkpointer.aget_state({"thread_id": t})
    assert stored.context[-1].text() == "reply 2 to two"


@pytest.mark.asyncio
async def test_an_interrupt_and_its_resume_use_the_kept_state(checkpointer: Any, make_thread: Any) -> None:
    async def ask(state: Notes, config: dict[str, Any]) -> Notes:
        answer = interrupt("approve?")
        state.tags.append(f"answer={answer}")
        return await reply(state, config)

    app, t = build(checkpointer, ask), make_thread()
    await app.ainvoke({"messages": [user("pay?")]}, {"thread_id": t})
    before = counters()
    await app.ainvoke({"resume": "yes"}, {"thread_id": t})
    assert delta(before) == (0, 1)
    stored = await checkpointer.aget_state({"thread_id": t})
    assert stored.tags == ["answer=yes"] and stored.context[-1].text() == "reply 1 to pay?"


@pytest.mark.asyncio
async def test_the_limit_evicts_the_least_recent_thread_and_zero_keeps_none(make_thread: Any) -> None:
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    cp = InMemoryCheckpointer()
    app = build(cp, live_states=2)
    threads = [make_thread() for _ in range(3)]
    for t in threads:
        await app.ainvoke({"messages": [user("hi")]}, {"thread_id": t})
    assert len(app._live) == 2
    before = counters()
    for t in reversed(threads):
        await app.ainvoke({"messages": [user("again")]}, {"thread_id": t})
    assert delta(before) == (1, 2)  # the first thread had been evicted
    off, t = build(cp, live_states=0), make_thread()
    await off.ainvoke({"messages": [user("hi")]}, {"thread_id": t})
    before = counters()
    await off.ainvoke({"messages": [user("again")]}, {"thread_id": t})
    assert delta(before) == (1, 0) and len(off._live) == 0


@pytest.mark.parametrize("bad", [-1, 2.5, "10", True])
def test_bad_live_states_settings_are_refused(bad: Any) -> None:
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    with pytest.raises(ValueError, match="live_states must be a whole number >= 0"):
        build(InMemoryCheckpointer(), live_states=bad)


def test_a_bad_environment_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    monkeypatch.setenv("TENXGRAPH_LIVE_STATES", "lots")
    with pytest.raises(ValueError, match="TENXGRAPH_LIVE_STATES must be a whole number >= 0, got 'lots'"):
        build(InMemoryCheckpointer())
    monkeypatch.setenv("TENXGRAPH_LIVE_STATES", "3")
    assert build(InMemoryCheckpointer())._live.limit == 3


def test_sync_invokes_from_several_threads_share_one_bounded_cache(make_thread: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    cp = InMemoryCheckpointer()
    app = build(cp, live_states=2)  # smaller than the number of threads: evictions race with takes
    threads = [make_thread() for _ in range(6)]

    def converse(t: str) -> list[str]:
        return [app.invoke({"messages": [user(f"{t} {i}")]}, {"thread_id": t})["messages"][-1].text() for i in range(4)]

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(converse, threads))
    for t, got in zip(threads, answers):
        assert got == [f"reply {i + 1} to {t} {i}" for i in range(4)]
    assert len(app._live) <= 2


@pytest.mark.asyncio
async def test_messages_changed_outside_a_run_are_seen_by_the_next_turn(checkpointer: Any, make_thread: Any) -> None:
    app, t = build(checkpointer), make_thread()
    await app.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    await checkpointer.aput_messages({"thread_id": t}, [Message.text_message("added by an operator", role="assistant")])
    before = counters()
    await app.ainvoke({"messages": [user("two")]}, {"thread_id": t})
    assert delta(before) == (1, 0)
    assert await texts(checkpointer, t) == ["one", "reply 1 to one", "added by an operator", "two", "reply 2 to two"]
    first = (await checkpointer.aget_state({"thread_id": t})).context[0]
    await checkpointer.adelete_message({"thread_id": t}, first.message_id)  # returns None on Postgres, as 10xGraph
    before = counters()
    out = await app.ainvoke({"messages": [user("three")]}, {"thread_id": t})
    assert delta(before) == (1, 0) and out["messages"][-1].text() == "reply 3 to three"
    assert await texts(checkpointer, t) == ["reply 1 to one", "added by an operator", "two", "reply 2 to two",
                                            "three", "reply 3 to three"]


@pytest.mark.asyncio
async def test_messages_changed_while_a_run_is_in_flight_are_seen_by_the_next_turn(
    checkpointer: Any, make_thread: Any
) -> None:
    gate = asyncio.Event()

    async def slow(state: Notes, config: dict[str, Any]) -> Notes:
        if state.context[-1].text() == "two":
            gate.set()
            await asyncio.sleep(0.3)  # an operator edits the thread meanwhile
        return await reply(state, config)

    app, t = build(checkpointer, slow), make_thread()
    await app.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    run = asyncio.create_task(app.ainvoke({"messages": [user("two")]}, {"thread_id": t}))
    await gate.wait()
    first = (await checkpointer.aget_state({"thread_id": t})).context[0]
    await checkpointer.adelete_message({"thread_id": t}, first.message_id)  # returns None on Postgres, as 10xGraph
    await run
    before = counters()
    out = await app.ainvoke({"messages": [user("three")]}, {"thread_id": t})
    assert delta(before) == (1, 0)  # the kept state predates the delete: not reused
    assert out["messages"][-1].text() == "reply 3 to three"
    assert await texts(checkpointer, t) == ["reply 1 to one", "two", "reply 2 to two", "three", "reply 3 to three"]


@pytest.mark.asyncio
async def test_an_earlier_message_replaced_by_a_node_is_stored(checkpointer: Any, make_thread: Any) -> None:
    async def redact(state: Notes, config: dict[str, Any]) -> Notes:
        if len(state.context) > 2:  # replace the first message, keep the length and the last id
            state.context[0] = Message.text_message("[redacted]", role="user")
        return await reply(state, config)

    app, t = build(checkpointer, redact), make_thread()
    await app.ainvoke({"messages": [user("card 4111")]}, {"thread_id": t})
    await app.ainvoke({"messages": [user("two")]}, {"thread_id": t})
    assert await texts(checkpointer, t) == ["[redacted]", "reply 1 to card 4111", "two", "reply 2 to two"]
    fresh = build(checkpointer, live_states=0)  # a cold load sees the same as the kept state
    await fresh.ainvoke({"messages": [user("three")]}, {"thread_id": t})
    assert (await texts(checkpointer, t))[0] == "[redacted]"


@pytest.mark.asyncio
async def test_the_caller_s_input_objects_are_not_part_of_the_kept_state(checkpointer: Any, make_thread: Any) -> None:
    seen: list[tuple[str, list[str]]] = []

    async def look(state: Notes, config: dict[str, Any]) -> Notes:
        seen.append((state.context[0].text(), list(state.tags)))
        return await reply(state, config)

    app, t = build(checkpointer, look), make_thread()
    mine = user("one")
    tags = ["from the caller"]
    await app.ainvoke({"messages": [mine], "state": {"tags": tags}}, {"thread_id": t})
    mine.content.clear()  # the caller reuses its objects afterwards
    tags.append("changed later")
    before = counters()
    await app.ainvoke({"messages": [user("two")]}, {"thread_id": t})
    assert delta(before) == (0, 1)
    assert seen == [("one", ["from the caller"]), ("one", ["from the caller"])]


# -- Postgres: a turn on a kept state reads nothing before its input commit ---------------------


def skipped() -> float:
    return metrics.snapshot()["tenxgraph.storage.start_reads_skipped"]


async def counted(node_reply: str, state: Notes) -> Notes:
    """A reply that names how many messages the node saw: which history a turn was built on."""
    state.turns += 1
    state.context.append(Message.text_message(f"{node_reply} after {len(state.context)}", role="assistant"))
    return state


def build_counting(cp: Any) -> Any:
    async def node(state: Notes, config: dict[str, Any]) -> Notes:
        return await counted("reply", state)

    return build(cp, node)


@pytest.fixture
def pg_checkpointer(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    return make_checkpointer("postgres", request, tmp_path)


@pytest.mark.asyncio
async def test_a_kept_turn_on_postgres_skips_the_start_read(pg_checkpointer: Any, make_thread: Any) -> None:
    app, t = build(pg_checkpointer), make_thread()
    first = skipped()
    await app.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    assert skipped() == first  # nothing kept yet: the first turn reads
    before, was = counters(), skipped()
    for word in ("two", "three"):
        await app.ainvoke({"messages": [user(word)]}, {"thread_id": t})
    assert delta(before) == (0, 2) and skipped() - was == 2
    assert await texts(pg_checkpointer, t) == ["one", "reply 1 to one", "two", "reply 2 to two", "three", "reply 3 to three"]
    # A resume-only pass and a state update are not turns with messages: they read as before.
    was = skipped()
    await app.ainvoke({}, {"thread_id": t})
    assert skipped() == was


@pytest.mark.asyncio
async def test_a_thread_written_again_to_the_kept_version_is_not_built_on(
    pg_checkpointer: Any, make_thread: Any, request: pytest.FixtureRequest
) -> None:
    # The version alone cannot tell the two lives apart; the write mark checked in the input
    # commit does. Built on the kept state, the reply would say it saw 3 messages.
    pg = request.getfixturevalue("tenx_postgres")

    def head_version() -> str:
        query = f"SELECT max(version) FROM {pg_checkpointer.schema}.states WHERE thread_id = '{t}'"
        return pg.psql(query, dbname=urllib.parse.unquote(urllib.parse.urlsplit(pg.dsn).path.lstrip("/"))).strip()

    app, other, t = build_counting(pg_checkpointer), build_counting(pg_checkpointer), make_thread()
    await app.ainvoke({"messages": [user("first life")]}, {"thread_id": t})
    kept_version = head_version()
    await pg_checkpointer.aclear_state({"thread_id": t})
    await other.ainvoke({"messages": [user("second"), user("life")]}, {"thread_id": t})
    assert head_version() == kept_version == "2"
    before, was = counters(), skipped()
    out = await app.ainvoke({"messages": [user("again")]}, {"thread_id": t})
    assert delta(before) == (1, 0) and skipped() == was
    assert out["messages"][-1].text() == "reply after 4"
    assert await texts(pg_checkpointer, t) == ["second", "life", "reply after 2", "again", "reply after 4"]
    stored = await pg_checkpointer.aget_state({"thread_id": t})
    assert stored.turns == 2


@pytest.mark.asyncio
async def test_a_kept_state_does_not_let_a_turn_past_another_worker_s_run(
    pg_checkpointer: Any, make_thread: Any, request: pytest.FixtureRequest
) -> None:
    from tenxgraph.core.exceptions import ThreadBusyError

    entered, release = asyncio.Event(), asyncio.Event()

    async def held(state: Notes, config: dict[str, Any]) -> Notes:
        if state.context[-1].text() == "b holds it":
            entered.set()
            await release.wait()
        return await reply(state, config)

    other_cp = type(pg_checkpointer)(request.getfixturevalue("tenx_postgres").dsn, schema=pg_checkpointer.schema,
                                     enforce_user_isolation=False)
    a, b, t = build(pg_checkpointer), build(other_cp, held), make_thread()
    await a.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    run_b = asyncio.create_task(b.ainvoke({"messages": [user("b holds it")]}, {"thread_id": t}))
    await entered.wait()
    was = skipped()
    with pytest.raises(ThreadBusyError):
        await a.ainvoke({"messages": [user("a wants in")]}, {"thread_id": t})
    assert skipped() == was
    release.set()
    await run_b
    await a.ainvoke({"messages": [user("after b")]}, {"thread_id": t})
    assert await texts(pg_checkpointer, t) == ["one", "reply 1 to one", "b holds it", "reply 2 to b holds it",
                                               "after b", "reply 3 to after b"]
    await other_cp.arelease()
