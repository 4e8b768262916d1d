"""A Postgres + Redis that the real 10xGraph 0.10.0 wrote, with a run it was killed in the middle
of, opened and resumed by tenxgraph (issue 14, item 11).

Nothing here is written by hand: ``real_10xgraph_writer`` runs ``crash_agents/legacy_tool_agent``
on 10xGraph itself and SIGKILLs it inside its tool node after ``charge``'s ledger row committed,
while ``email`` is blocked. What that leaves: the latest ``states`` row names the node that
*completed* (``model``), the node in flight (``tools``) is only in 10xGraph's Redis entry
``state_cache:<thread>:<user>``, and the ledger holds ``charge``'s result.

tenxgraph must resume at the tool node (from that entry when Redis is given, else inferred from
the unanswered tool calls), answer ``charge`` from 10xGraph's ledger (not charge again), run
``email`` once, and end with the messages 10xGraph itself ends with: both when it runs the agent
uncrashed and when it resumes the same crashed thread (a copy of the database and the entry).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import metrics
from tenxgraph.core.exceptions import ThreadBusyError, TransientStorageError
from tenxgraph.storage.checkpointer import PgCheckpointer
from tests_py.core_logs import tenxgraph_records
from tests_py.crash_agents import legacy_tool_agent as agent
from tests_py.pg_sessions import Holder, blocked_by
from tests_py.real_10xgraph_writer import USER, Writer

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600)]


@pytest.fixture
def writer(oracle: Any, tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Writer:
    """10xGraph on the test's database and Redis; our side's tools use the same effects file."""
    monkeypatch.setenv(agent.AGENT_DIR_ENV, str(tmp_path))
    return Writer(oracle.python, tenx_postgres, pg_dsn, tenx_redis.url, tmp_path)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """tenxgraph's records, the Rust core's included."""
    with tenxgraph_records(caplog, logging.INFO) as records:
        yield records


def new_thread(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def cfg(thread: str) -> dict[str, Any]:
    return {"thread_id": thread, "user_id": USER}


def as_json(messages: list[Any]) -> list[dict[str, Any]]:
    return [m if isinstance(m, dict) else m.model_dump(mode="json") for m in messages]


def comparable(messages: list[Any], thread: str) -> list[dict[str, Any]]:
    """Messages without what differs between two runs of the agent: timestamps, the random ids
    ToolNode gives tool results, and the thread id inside the scripted ids."""
    out = []
    for d in as_json(messages):
        d = dict(d)
        d.pop("timestamp", None)
        if d["role"] == "tool":
            d.pop("message_id")
        else:
            d["message_id"] = str(d["message_id"]).replace(thread, "T")
        out.append(d)
    return out


def effect_names(w: Writer) -> list[str]:
    return [e["effect"] for e in w.effects()]


def ten_x_pid(w: Writer) -> int:
    """The pid of the 10xGraph process that was killed (the one that charged)."""
    (pid,) = {e["pid"] for e in w.effects() if e["effect"] == "charge"}
    return pid


def references(w: Writer, thread: str, tmp_path: Path, *, nondurable: bool = False) -> tuple[dict, dict]:
    """10xGraph's own results, each on its own effects file: the agent run uncrashed on a new
    thread, and 10xGraph resuming this crashed thread (on a copy of the database and of its
    Redis entry, so ours is left alone)."""
    clean_dir = tmp_path / "ref-clean"
    clean_dir.mkdir()
    clean_thread = new_thread("clean")
    extra = {"NONDURABLE": "1"} if nondurable else {}
    clean = Writer(w.python, w.pg, w.dsn, w.redis_url, clean_dir).run_to_completion(clean_thread, **extra)
    clean["thread"] = clean_thread
    resumed = their_resume(w, thread, tmp_path / "ref-resume", 1)
    return clean, resumed


def their_resume(w: Writer, thread: str, workdir: Path, redis_db: int, **extra: str) -> dict[str, Any]:
    """10xGraph's own ``ainvoke({})`` of ``thread`` on a copy of the database and of its Redis
    entry (ours is left alone); what it printed, and ``"effects"``: the tools and model calls it
    made, from its own effects file."""
    workdir.mkdir()
    copy_db = f"tenx_{uuid.uuid4().hex}"
    copy_dsn = w.copy_database(copy_db)
    copy_redis = w.redis_copy_to(w.cache_key(thread), redis_db)
    try:
        resumed = Writer(w.python, w.pg, copy_dsn, copy_redis, workdir).run_to_completion(thread, "resume", **extra)
    finally:
        w.pg.drop_database(copy_db)
    effects = workdir / "effects.jsonl"
    lines = effects.read_text().splitlines() if effects.exists() else []
    resumed["effects"] = [json.loads(x)["effect"] for x in lines]
    return resumed


async def resume_on_tenxgraph(
    w: Writer, thread: str, *, redis: bool, via: str = "ainvoke"
) -> tuple[dict[str, Any] | None, Any, PgCheckpointer]:
    (w.workdir / "email.release").write_text("go")
    cp = PgCheckpointer(w.dsn, redis_url=w.redis_url if redis else None)
    app = agent.build(cp)
    out = None
    if via == "ainvoke":
        out = await app.ainvoke({}, config=cfg(thread))
    else:
        chunks = [c async for c in app.astream({}, config=cfg(thread))]
        assert chunks
    state = await cp.aget_state(cfg(thread))
    return out, state, cp


def assert_left_mid_tool_node(left: dict[str, Any]) -> None:
    """What the kill left is what the issue describes (else the test proves nothing)."""
    assert left["states"], "10xGraph wrote no state row"
    assert left["states"][-1]["meta"]["current_node"] == "model"
    assert left["states"][-1]["meta"]["status"] == "running"
    cache = json.loads(left["cache"])
    assert cache["execution_meta"]["current_node"] == "tools"
    assert cache["__checkpoint_version__"] == left["states"][-1]["version"]
    assert left["ledger"]["__kind__"] == "message"


def assert_finished_like_10xgraph(w: Writer, thread: str, left: dict[str, Any], out: dict[str, Any] | None, state: Any,
                                  clean: dict[str, Any], resumed: dict[str, Any]) -> None:
    # charge ran once (in the killed 10xGraph process), email once and the model once more (here).
    assert effect_names(w) == ["model", "charge", "email", "model"], w.effects()
    killed = ten_x_pid(w)
    assert [e["pid"] for e in w.effects()][2:] == [os.getpid(), os.getpid()] and killed != os.getpid()
    assert resumed["effects"] == ["email", "model"]
    assert state.execution_meta.status.value == "completed" == resumed["status"] == clean["status"]
    # The charge result is 10xGraph's ledger row, verbatim (its message id and timestamp too).
    charge_result = next(m for m in state.context if m.role == "tool" and m.metadata.get("tool_call_id") == "call_1")
    assert charge_result.model_dump(mode="json") == left["ledger"]["value"]
    # The thread ends as 10xGraph ends it, uncrashed and resumed.
    ours = comparable(state.context, thread)
    assert ours == comparable(clean["context"], clean["thread"])
    assert ours == comparable(resumed["context"], thread)
    assert [m["role"] for m in ours] == ["user", "assistant", "tool", "tool", "assistant"]
    assert ours[-1]["content"][0]["text"] == "all done: charged 42; emailed a@b.c"
    # What the resume returns is what 10xGraph's resume returns.
    if out is not None:
        assert comparable(out["messages"], thread) == comparable(resumed["messages"], thread)


async def test_crashed_run_resumes_at_the_tool_node_from_10xgraphs_redis_cache(
    writer: Writer, tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    thread = new_thread("crash")
    left = writer.crash_in_tool_node(thread)
    assert_left_mid_tool_node(left)
    assert effect_names(writer) == ["model", "charge"]
    clean, resumed = references(writer, thread, tmp_path)

    out, state, cp = await resume_on_tenxgraph(writer, thread, redis=True)

    assert_finished_like_10xgraph(writer, thread, left, out, state, clean, resumed)
    assert any("from its Redis state cache" in r.getMessage() for r in logs.records), "the cache was not read"
    # 10xGraph's entry is stale once we committed: dropped, so nothing reads it again.
    assert writer.redis_type(writer.cache_key(thread)) != "string"
    # A second resume finds the thread finished: nothing runs again.
    await agent.build(cp).ainvoke({}, config=cfg(thread))
    assert effect_names(writer) == ["model", "charge", "email", "model"]


@pytest.mark.parametrize("via", ["ainvoke", "astream"])
async def test_crashed_run_without_redis_infers_the_tool_node(
    writer: Writer, tmp_path: Path, logs: pytest.LogCaptureFixture, via: str
) -> None:
    thread = new_thread("crash")
    left = writer.crash_in_tool_node(thread)
    assert_left_mid_tool_node(left)
    clean, resumed = references(writer, thread, tmp_path)

    out, state, _ = await resume_on_tenxgraph(writer, thread, redis=False, via=via)

    assert_finished_like_10xgraph(writer, thread, left, out, state, clean, resumed)
    assert any("resuming at 'tools'" in r.getMessage() for r in logs.records)
    assert not any("from its Redis state cache" in r.getMessage() for r in logs.records)


async def test_crashed_run_with_a_corrupt_cache_entry_falls_back_to_inference(
    writer: Writer, tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    thread = new_thread("crash")
    left = writer.crash_in_tool_node(thread)
    assert_left_mid_tool_node(left)
    clean, resumed = references(writer, thread, tmp_path)
    writer.redis_set(writer.cache_key(thread), '{"context": [ not json')
    fallbacks = metrics.snapshot()["tenxgraph.storage.redis_fallbacks"]

    out, state, _ = await resume_on_tenxgraph(writer, thread, redis=True)

    assert_finished_like_10xgraph(writer, thread, left, out, state, clean, resumed)
    warned = [r for r in logs.records if "state cache entry of this thread is not used" in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING and "not JSON" in warned[0].getMessage()
    assert any("resuming at 'tools'" in r.getMessage() for r in logs.records)
    # A bad entry is no Redis failure: Redis stays in use for everything else.
    assert metrics.snapshot()["tenxgraph.storage.redis_fallbacks"] == fallbacks
    assert writer.redis_type(writer.cache_key(thread)) != "string"


async def test_cache_entry_of_another_version_is_not_used(
    writer: Writer, tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    """An entry that does not describe the thread's latest row (here: one version behind, as a
    cache written before a later durable step would be) is not trusted: inference decides."""
    thread = new_thread("crash")
    left = writer.crash_in_tool_node(thread)
    assert_left_mid_tool_node(left)
    clean, resumed = references(writer, thread, tmp_path)
    entry = json.loads(left["cache"])
    entry["__checkpoint_version__"] -= 1
    entry["execution_meta"]["current_node"] = "model"  # what using it would do: run model again
    writer.redis_set(writer.cache_key(thread), json.dumps(entry))

    out, state, _ = await resume_on_tenxgraph(writer, thread, redis=True)

    assert_finished_like_10xgraph(writer, thread, left, out, state, clean, resumed)
    assert any("cached at version" in r.getMessage() for r in logs.records)


async def test_run_without_per_step_checkpoints_resumes_from_the_cache_alone(
    writer: Writer, tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    """``durable_checkpoint_every_step=False``: 10xGraph wrote no state row before the kill; its
    Redis entry is the only record of the run. Resumed from it, the model is not called again."""
    thread = new_thread("nodurable")
    left = writer.crash_in_tool_node(thread, nondurable=True)
    assert left["states"] == []
    assert json.loads(left["cache"])["execution_meta"]["current_node"] == "tools"
    clean, resumed = references(writer, thread, tmp_path, nondurable=True)
    # Without Redis there is nothing to resume from: the answer of an unknown thread, no write.
    (writer.workdir / "email.release").write_text("go")
    with pytest.raises(ValueError, match="messages"):
        await agent.build(PgCheckpointer(writer.dsn)).ainvoke({}, config=cfg(thread))
    assert writer.sql(f"SELECT count(*) FROM states WHERE thread_id = '{thread}'") == "0"
    assert effect_names(writer) == ["model", "charge"]

    out, state, _ = await resume_on_tenxgraph(writer, thread, redis=True)

    assert_finished_like_10xgraph(writer, thread, left, out, state, clean, resumed)
    assert any("from its Redis state cache" in r.getMessage() for r in logs.records)


async def test_run_without_per_step_checkpoints_after_a_finished_turn_resumes_from_the_cache(
    writer: Writer, tmp_path: Path, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same kill in a second turn: the thread's latest row is the first turn's, `completed`,
    and only the Redis entry (at that row's version, `running`) holds the second turn. 10xGraph
    resumes it from the entry; so do we (session 40 ran nothing: the entry was read only for a
    row that says `running`, and the turn's user message and charge were lost)."""
    thread = new_thread("nodurable2")
    writer.run_to_completion(thread)
    first = effect_names(writer)
    left = writer.crash_in_tool_node(thread, nondurable=True, turn=2)
    assert [s["meta"]["status"] for s in left["states"]][-1] == "completed", left["states"]
    entry = json.loads(left["cache"])
    assert entry["execution_meta"]["current_node"] == "tools" and entry["execution_meta"]["status"] == "running"
    assert entry["__checkpoint_version__"] == left["states"][-1]["version"]
    assert effect_names(writer) == [*first, "model", "charge"]
    theirs = their_resume(writer, thread, tmp_path / "ref-resume", 1, NONDURABLE="1", LEGACY_AGENT_TURN="2")
    assert theirs["effects"] == ["email", "model"]

    monkeypatch.setenv(agent.TURN_ENV, "2")
    out, state, _ = await resume_on_tenxgraph(writer, thread, redis=True)

    assert effect_names(writer) == [*first, "model", "charge", "email", "model"], "charge fired again, or nothing ran"
    assert state.execution_meta.status.value == "completed"
    assert comparable(state.context, thread) == comparable(theirs["context"], thread)
    assert [m["role"] for m in comparable(state.context, thread)] == ["user", "assistant", "tool", "tool", "assistant"] * 2
    assert out is not None and comparable(out["messages"], thread) == comparable(theirs["messages"], thread)
    assert any("from its Redis state cache" in r.getMessage() for r in logs.records)
    assert writer.redis_type(writer.cache_key(thread)) != "string"


async def test_an_approved_run_past_a_gate_killed_before_its_first_durable_write_resumes_from_the_cache(
    writer: Writer, tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    """10xGraph paused at ``interrupt_before=["model"]``; the reviewer's ``{}`` ran the model and
    the tools with ``durable_checkpoint_every_step=False`` and was killed once ``charge`` was in
    its ledger. The row still says ``interrupted_before`` at the model; only the entry holds the
    approved run. We took the row: the model ran again and ``charge`` fired a second time (its
    calls a fresh batch; red-team, session 41). 10xGraph resumes from the entry; so do we."""
    thread = new_thread("gate")
    paused = writer.run_to_completion(thread, INTERRUPT_BEFORE="model")
    assert paused["status"] == "interrupted_before" and effect_names(writer) == []
    left = writer.crash_in_tool_node(thread, nondurable=True, mode="resume", INTERRUPT_BEFORE="model")
    assert left["states"][-1]["meta"]["status"] == "interrupted_before", left["states"]
    entry = json.loads(left["cache"])
    assert (entry["execution_meta"]["current_node"], entry["execution_meta"]["status"]) == ("tools", "running")
    assert effect_names(writer) == ["model", "charge"]
    theirs = their_resume(writer, thread, tmp_path / "ref-resume", 1, NONDURABLE="1", INTERRUPT_BEFORE="model")
    assert theirs["effects"] == ["email"] and theirs["status"] == "interrupted_before"

    (writer.workdir / "email.release").write_text("go")
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    out = await agent.build(cp, interrupt_before=["model"]).ainvoke({}, config=cfg(thread))

    assert effect_names(writer) == ["model", "charge", "email"], "charge fired again, or the model ran again"
    state = await cp.aget_state(cfg(thread))
    assert state.execution_meta.status.value == "interrupted_before"
    assert comparable(state.context, thread) == comparable(theirs["context"], thread)
    assert comparable(out["messages"], thread) == comparable(theirs["messages"], thread)
    assert any("from its Redis state cache" in r.getMessage() for r in logs.records)


async def test_a_new_turn_on_a_thread_whose_10xgraph_run_lives_only_in_the_cache_is_refused(
    writer: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second turn killed as above (row ``completed``, the turn only in the entry), and the
    client sends that turn again: sent on from the row, it ran the model again and ``charge``
    fired a second time. Refused as for any run under way (``STORAGE_BUSY_001``), as the same
    kill in durable mode is; ``{}`` then finishes it from the entry."""
    thread = new_thread("resent")
    writer.run_to_completion(thread)
    first = effect_names(writer)
    writer.crash_in_tool_node(thread, nondurable=True, turn=2)
    monkeypatch.setenv(agent.TURN_ENV, "2")
    (writer.workdir / "email.release").write_text("go")
    app = agent.build(PgCheckpointer(writer.dsn, redis_url=writer.redis_url))
    with pytest.raises(ThreadBusyError) as refused:
        await app.ainvoke({"messages": [agent.user_message(thread)]}, config=cfg(thread))
    assert refused.value.error_code == "STORAGE_BUSY_001"
    assert effect_names(writer) == [*first, "model", "charge"]
    await app.ainvoke({}, config=cfg(thread))
    assert effect_names(writer) == [*first, "model", "charge", "email", "model"]


DOWN_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1: every Redis call fails


async def test_a_thread_10xgraph_wrote_is_refused_while_its_redis_is_down(
    writer: Writer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second turn killed as above, taken over while the Redis its entry lives in is down.
    The failed read counted as "no entry": the turn sent again ran from the ``completed`` row and
    ``charge`` fired a second time, and ``{}`` finished the thread without the turn, lost for good
    (red-team, session 41). Both are refused ``STORAGE_TRANSIENT_001`` with nothing written; once
    Redis is back ``{}`` finishes the turn from the entry. A thread with no row goes on."""
    thread = new_thread("redisdown")
    writer.run_to_completion(thread)
    first = effect_names(writer)
    left = writer.crash_in_tool_node(thread, nondurable=True, turn=2)
    assert left["states"][-1]["meta"]["status"] == "completed"
    monkeypatch.setenv(agent.TURN_ENV, "2")
    (writer.workdir / "email.release").write_text("go")
    rows = writer.sql(f"SELECT count(*) FROM states WHERE thread_id = '{thread}'")
    down = PgCheckpointer(writer.dsn, redis_url=DOWN_REDIS)
    try:
        app = agent.build(down)
        for given in ({"messages": [agent.user_message(thread)]}, {}, {}):
            with pytest.raises(TransientStorageError) as refused:
                await app.ainvoke(given, config=cfg(thread))
            assert refused.value.error_code == "STORAGE_TRANSIENT_001"
            assert "Redis" in str(refused.value)
        assert effect_names(writer) == [*first, "model", "charge"], "a tool ran without the entry"
        assert writer.sql(f"SELECT count(*) FROM states WHERE thread_id = '{thread}'") == rows
        assert json.loads(writer.redis_get(writer.cache_key(thread)))["execution_meta"]["status"] == "running"
        # A thread with no row has no sign of 10xGraph: Redis being down does not stop it.
        fresh = new_thread("fresh")
        monkeypatch.setenv(agent.TURN_ENV, "1")
        out = await app.ainvoke({"messages": [agent.user_message(fresh)]}, config=cfg(fresh))
        assert out["messages"][-1].content[0].text.startswith("all done")
    finally:
        await down.arelease()
    monkeypatch.setenv(agent.TURN_ENV, "2")
    before = effect_names(writer)
    await agent.build(PgCheckpointer(writer.dsn, redis_url=writer.redis_url)).ainvoke({}, config=cfg(thread))
    assert effect_names(writer) == [*before, "email", "model"], "charge fired again, or nothing ran"


async def test_a_first_turn_10xgraph_left_only_in_redis_is_refused_while_redis_is_down(writer: Writer) -> None:
    """10xGraph's first turn killed in its tool node without per-step checkpoints: no state row,
    only the thread's row (10xGraph writes it when a run starts), the entry and ``charge`` in the
    ledger. With Redis down this thread was taken for a new one: the turn sent again fired
    ``charge`` a second time, and ``{}`` said the input had no messages (red-team, session 42).
    Both are refused ``STORAGE_TRANSIENT_001``, nothing written; with Redis back ``{}`` finishes
    the turn from the entry."""
    thread = new_thread("norow")
    left = writer.crash_in_tool_node(thread, nondurable=True)
    assert left["states"] == [] and json.loads(left["cache"]).get("__checkpoint_version__") is None
    (writer.workdir / "email.release").write_text("go")
    down = PgCheckpointer(writer.dsn, redis_url=DOWN_REDIS)
    try:
        app = agent.build(down)
        for given in ({"messages": [agent.user_message(thread)]}, {}):
            with pytest.raises(TransientStorageError) as refused:
                await app.ainvoke(given, config=cfg(thread))
            assert refused.value.error_code == "STORAGE_TRANSIENT_001"
        assert effect_names(writer) == ["model", "charge"], "a tool ran without the entry"
        assert writer.sql(f"SELECT count(*) FROM states WHERE thread_id = '{thread}'") == "0"
    finally:
        await down.arelease()
    await agent.build(PgCheckpointer(writer.dsn, redis_url=writer.redis_url)).ainvoke({}, config=cfg(thread))
    assert effect_names(writer) == ["model", "charge", "email", "model"], "charge fired again, or nothing ran"


@pytest.mark.parametrize("op", ["aclean_thread", "aclear_state"])
async def test_a_thread_deleted_while_redis_is_down_does_not_come_back(writer: Writer, op: str) -> None:
    """The thread of a 10xGraph run that lives only in its entry, deleted (or cleared) while
    Redis is down: the rows went and the entry stayed, so once Redis was back the next
    conversation on the id was refused as busy and ``{}`` resumed the deleted run, its tools
    fired again (red-team, session 42). The delete is refused ``STORAGE_TRANSIENT_001`` with
    nothing deleted; with Redis up it deletes both, and the id starts afresh."""
    thread = new_thread("deleted")
    writer.crash_in_tool_node(thread, nondurable=True)
    key = writer.cache_key(thread)
    down = PgCheckpointer(writer.dsn, redis_url=DOWN_REDIS)
    try:
        with pytest.raises(TransientStorageError) as refused:
            await getattr(down, op)(cfg(thread))
        assert refused.value.error_code == "STORAGE_TRANSIENT_001"
    finally:
        await down.arelease()
    assert writer.sql(f"SELECT count(*) FROM threads WHERE thread_id = '{thread}'") == "1"
    assert writer.redis_get(key) is not None
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    await getattr(cp, op)(cfg(thread))
    assert writer.redis_get(key) is None
    (writer.workdir / "email.release").write_text("go")
    out = await agent.build(cp).ainvoke({"messages": [agent.user_message(thread)]}, config=cfg(thread))
    assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]
    done = effect_names(writer)  # the killed turn's, then the new conversation's (its tools run at once)
    assert (done[:3], sorted(done[3:5]), done[5:]) == (["model", "charge", "model"], ["charge", "email"], ["model"]), done


async def test_threads_only_tenxgraph_wrote_run_and_go_without_redis(pg_dsn: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis is a cache to threads 10xGraph never ran: one named before its first message
    (``aput_thread``: a thread row and no state row, as a 10xGraph first turn killed early
    leaves) takes its turns, and one deleted goes, with Redis down. They were refused
    ``STORAGE_TRANSIENT_001`` for the outage (red-team, session 42): only a thread with no state
    row whose ledger holds tools, or whose latest row 10xGraph wrote, needs the entry."""
    from tenxgraph.utils.thread_info import ThreadInfo

    monkeypatch.setenv(agent.AGENT_DIR_ENV, str(tmp_path))
    (tmp_path / "email.release").write_text("go")
    cp = PgCheckpointer(pg_dsn, redis_url=DOWN_REDIS)
    try:
        app = agent.build(cp)
        named, other = new_thread("named"), new_thread("gone")
        for thread in (named, other):
            await cp.aput_thread(cfg(thread), ThreadInfo(thread_id=thread, thread_name="support chat"))
        out = await app.ainvoke({"messages": [agent.user_message(named)]}, config=cfg(named))
        assert [m.role for m in out["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]
        await cp.aclean_thread(cfg(other))
        assert await cp.aget_thread(cfg(other)) is None
        # The turn's thread now has a row of ours: deleted without Redis too.
        await cp.aclean_thread(cfg(named))
        assert await cp.aget_state(cfg(named)) is None
    finally:
        await cp.arelease()


async def test_thread_10xgraph_finished_reads_the_same(writer: Writer, logs: pytest.LogCaptureFixture) -> None:
    """A thread 10xGraph completed: the same state with and without Redis (its Redis entry in
    10xGraph's format is no Redis failure), and a resume runs nothing."""
    thread = new_thread("done")
    theirs = writer.run_to_completion(thread)
    done = effect_names(writer)  # the tools ran in parallel: either may come first
    assert done[0] == done[3] == "model" and sorted(done[1:3]) == ["charge", "email"], done
    assert writer.redis_type(writer.cache_key(thread)) == "string"
    fallbacks = metrics.snapshot()["tenxgraph.storage.redis_fallbacks"]
    for redis in (True, False):
        cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url if redis else None)
        app = agent.build(cp)
        state = await cp.aget_state(cfg(thread))
        assert as_json(state.context) == theirs["context"]
        assert state.execution_meta.status.value == "completed"
        cached = await cp.aget_state_cache(cfg(thread))
        assert cached is not None and as_json(cached.context) == theirs["context"]
        out = await app.ainvoke({}, config=cfg(thread))
        assert out["messages"] is not None
        assert effect_names(writer) == done, "a resume of a finished thread ran"
        assert as_json((await cp.aget_state(cfg(thread))).context) == theirs["context"]
    assert metrics.snapshot()["tenxgraph.storage.redis_fallbacks"] == fallbacks
    assert not any("redis failed" in r.getMessage() for r in logs.records)


async def test_10xgraph_itself_without_its_cache_runs_the_completed_node_again(writer: Writer, tmp_path: Path) -> None:
    """The difference the inference makes, pinned: 10xGraph resuming the same crashed thread
    after its cache entry is gone (24 h TTL, a Redis restart) takes the row as the node to run
    and calls the model on its own unanswered tool calls; tenxgraph resumes at the tool node."""
    thread = new_thread("crash")
    left = writer.crash_in_tool_node(thread)
    assert_left_mid_tool_node(left)
    copy_db = f"tenx_{uuid.uuid4().hex}"
    copy_dsn = writer.copy_database(copy_db)
    empty_redis = writer.redis_url_of_db(2)  # a Redis database without the entry (threads are unique)
    try:
        theirs = Writer(writer.python, writer.pg, copy_dsn, empty_redis, tmp_path / "theirs")
        theirs.workdir.mkdir()
        r = theirs.run(thread, "resume")
    finally:
        writer.pg.drop_database(copy_db)
    assert r.returncode != 0 and "unanswered tool calls: ['call_1', 'call_2']" in r.stdout + r.stderr
    assert theirs.effects() == []

    _, state, _ = await resume_on_tenxgraph(writer, thread, redis=False)
    assert state.execution_meta.status.value == "completed"
    assert effect_names(writer) == ["model", "charge", "email", "model"]


@pytest.mark.parametrize("redis", [True, False], ids=["redis", "no-redis"])
async def test_recovery_finishes_the_run_10xgraph_left(writer: Writer, redis: bool) -> None:
    """``arecover()`` finds the thread 10xGraph died in (its row says running) and finishes it
    the same way: the tool node, charge from the ledger, email once."""
    thread = new_thread("recover")
    left = writer.crash_in_tool_node(thread)
    assert_left_mid_tool_node(left)
    (writer.workdir / "email.release").write_text("go")
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url if redis else None)
    report = await agent.build(cp).arecover()
    assert report.ok, report.failed
    assert [(r.thread_id, r.status) for r in report.resumed] == [(thread, "completed")]
    assert effect_names(writer) == ["model", "charge", "email", "model"]
    state = await cp.aget_state(cfg(thread))
    assert [m.role for m in state.context] == ["user", "assistant", "tool", "tool", "assistant"]
    assert state.context[2].model_dump(mode="json") == left["ledger"]["value"]


@pytest.mark.parametrize("turn", [1, 2], ids=["no-row", "after-a-finished-turn"])
async def test_recovery_finds_a_10xgraph_run_that_lives_only_in_redis(
    writer: Writer, monkeypatch: pytest.MonkeyPatch, turn: int
) -> None:
    """A turn run with ``durable_checkpoint_every_step=False`` killed in its tool node: no state
    row says ``running`` (the thread has none, or the finished turn's), so ``arecover()``, which
    listed only such rows, did not find it; after a deploy the turn waited for a client's ``{}``
    that may never come (red-team, session 41). The pass now also lists the runs 10xGraph's
    entries show under way for this database's threads, and finishes each from its entry:
    ``charge`` is answered from the ledger. With Redis down the pass lists the rows only, and
    touches nothing; a later pass with Redis finishes the run."""
    thread = new_thread("recover-redis")
    first: list[str] = []
    if turn == 2:
        writer.run_to_completion(thread)
        first = effect_names(writer)
    left = writer.crash_in_tool_node(thread, nondurable=True, turn=turn)
    assert [s["meta"]["status"] for s in left["states"]][-1:] == ([] if turn == 1 else ["completed"])
    monkeypatch.setenv(agent.TURN_ENV, str(turn))
    (writer.workdir / "email.release").write_text("go")
    down = PgCheckpointer(writer.dsn, redis_url=DOWN_REDIS)
    try:
        report = await agent.build(down).arecover()
        assert (report.resumed, report.skipped, report.failed) == ([], [], [])
        # The pass says what it could not read (it printed "0 resumed", exit 0; red-team, session 42).
        assert not report.ok and len(report.unlisted) == 1 and "Redis" in report.unlisted[0], report.unlisted
    finally:
        await down.arelease()
    assert effect_names(writer) == [*first, "model", "charge"]

    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    report = await agent.build(cp).arecover()
    assert report.ok, report.failed
    assert [(r.thread_id, r.status) for r in report.resumed] == [(thread, "completed")]
    assert effect_names(writer) == [*first, "model", "charge", "email", "model"], "charge fired again, or nothing ran"
    state = await cp.aget_state(cfg(thread))
    assert [m.role for m in state.context][-5:] == ["user", "assistant", "tool", "tool", "assistant"]
    # Finished: a second pass finds nothing.
    again = await agent.build(cp).arecover()
    assert (again.resumed, again.failed) == ([], [])
    assert effect_names(writer) == [*first, "model", "charge", "email", "model"]


@pytest.mark.parametrize("redis", ["up", "down"])
async def test_prune_leaves_a_10xgraph_run_that_lives_only_in_redis(
    writer: Writer, monkeypatch: pytest.MonkeyPatch, redis: str
) -> None:
    """A turn run with ``durable_checkpoint_every_step=False`` killed in its tool node after a
    finished turn: the thread's latest row says ``completed``, so ``aprune(ledger_ttl=)`` deleted
    the run's ledger rows and ``aprune(finished_older_than=)`` the thread, and the run's resume
    from 10xGraph's entry charged the card again (red-team, session 42). Prune now asks Redis which
    threads 10xGraph has a run under way in and leaves them; with Redis down it leaves every
    thread whose latest row 10xGraph wrote. A finished 10xGraph thread beside it is pruned (with
    Redis) as before."""
    thread, done = new_thread("prune-run"), new_thread("prune-done")
    writer.run_to_completion(thread)
    writer.run_to_completion(done)
    left = writer.crash_in_tool_node(thread, nondurable=True, turn=2)
    assert [s["meta"]["status"] for s in left["states"]][-1] == "completed"
    charges = effect_names(writer).count("charge")

    def ledger(t: str) -> int:
        return int(writer.sql(f"SELECT COUNT(*) FROM tool_executions WHERE thread_id = '{t}'"))

    def threads(t: str) -> int:
        return int(writer.sql(f"SELECT COUNT(*) FROM threads WHERE thread_id = '{t}'"))

    before = ledger(thread)
    assert before == 3 and ledger(done) == 2, (before, ledger(done))  # turn one's charge and email, turn two's charge
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url if redis == "up" else DOWN_REDIS)
    try:
        dry = await cp.aprune(ledger_ttl=0, dry_run=True)
        first = await cp.aprune(ledger_ttl=0)
        assert first["ledger_rows"] == dry["ledger_rows"] == (2 if redis == "up" else 0), (first, dry)
        assert first["legacy_unchecked"] is dry["legacy_unchecked"] is (redis == "down")
        assert ledger(thread) == before
        assert ledger(done) == (0 if redis == "up" else 2)
        second = await cp.aprune(finished_older_than=0)
        assert second["threads"] == (1 if redis == "up" else 0), second
        assert threads(thread) == 1 and threads(done) == (0 if redis == "up" else 1)
        # A deleted thread's 10xGraph entry goes with it (as with aclean_thread); the run's stays.
        assert (writer.redis_get(writer.cache_key(done)) is None) == (redis == "up")
        assert json.loads(writer.redis_get(writer.cache_key(thread)) or "{}")["execution_meta"]["status"] == "running"
    finally:
        await cp.arelease()

    monkeypatch.setenv(agent.TURN_ENV, "2")
    (writer.workdir / "email.release").write_text("go")
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    report = await agent.build(cp).arecover()
    assert report.ok, report.failed
    assert [(r.thread_id, r.status) for r in report.resumed] == [(thread, "completed")]
    assert effect_names(writer).count("charge") == charges, "a pruned ledger row let charge fire again"
    state = await cp.aget_state(cfg(thread))
    assert state.execution_meta.status.value == "completed"



async def test_prune_leaves_a_10xgraph_turn_its_redis_scan_did_not_see(writer: Writer) -> None:
    """Prune reads 10xGraph's Redis once, at its start: a 10xGraph worker's turn begun after that
    (here: its entry gone, as the scan saw Redis), on a thread finished long ago, is in no row, and
    10xGraph's turn does not touch ``threads.updated_at``. The thread and its ledger went, and the
    turn sent again charged again (red-team, session 43, pass 3). A thread whose latest row
    10xGraph wrote and whose ledger holds a row newer than it is not finished."""
    thread = new_thread("prune-unseen")
    writer.run_to_completion(thread)
    writer.crash_in_tool_node(thread, nondurable=True, turn=2)
    ledger = f"SELECT COUNT(*) FROM tool_executions WHERE thread_id = '{thread}'"
    before = writer.sql(ledger)
    assert before == "3"
    import redis

    redis.Redis.from_url(writer.redis_url).delete(writer.cache_key(thread))
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    try:
        report = await cp.aprune(finished_older_than=0, ledger_ttl=0)
        assert (report["threads"], report["ledger_rows"]) == (0, 0), report
    finally:
        await cp.arelease()
    assert writer.sql(f"SELECT COUNT(*) FROM threads WHERE thread_id = '{thread}'") == "1"
    assert writer.sql(ledger) == before


async def test_prune_leaves_a_10xgraph_turn_begun_while_it_ran(writer: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 10xGraph worker's turn begun while a prune runs (here: while the prune waits on a row
    lock in its first rule), killed in its first model call: the turn lives in its Redis entry
    alone, no tool recorded. Prune read Redis once, at its start, so the thread went with the
    turn's user message (red-team, session 43, left then). Each batch now reads the entries of the
    threads it is about to delete whose latest row 10xGraph wrote; the turn is then finished from
    its entry, ``charge`` firing once."""
    blocker, thread = new_thread("prune-blocker"), new_thread("prune-during")
    writer.run_to_completion(blocker)  # first: its rows come first in the prune's first rule
    writer.run_to_completion(thread)
    charges = effect_names(writer).count("charge")
    assert int(writer.sql(f"SELECT COUNT(*) FROM states WHERE thread_id = '{blocker}'")) > 1
    gate = writer.workdir / "turn.go"
    # 10xGraph's worker up before the prune (its store's setup waits on a prune's table locks).
    crash = asyncio.create_task(asyncio.to_thread(writer.crash_in_model_node, thread, first=True, nondurable=True,
                                                  turn=2, LEGACY_AGENT_GATE=str(gate)))
    while not gate.with_suffix(".go.ready").exists():
        assert not crash.done(), crash
        await asyncio.sleep(0.05)
    locker = Holder(writer.dsn)
    # The prune waits on the held row while 10xGraph runs its turn.
    patient = {"lock_timeout": 300, "statement_timeout": 300}
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url, pool_config=patient)
    try:
        # Another thread's oldest state row held: the prune's first rule (old versions) waits on
        # it before it reaches the thread's rows.
        held = await locker.ask_async(
            f"BEGIN; SELECT pg_backend_pid() FROM states WHERE thread_id = '{blocker}' ORDER BY version LIMIT 1 FOR UPDATE;")
        assert held.isdigit(), held
        prune = asyncio.create_task(cp.aprune(keep_versions=1, finished_older_than=0, ledger_ttl=0))
        assert await blocked_by(writer.dsn, held, prune), f"the prune did not wait on the held row: {prune}"
        gate.write_text("go")
        left = await asyncio.wait_for(crash, 120)
        assert json.loads(left["cache"] or "{}")["execution_meta"]["status"] == "running", left["cache"]
        locker.close()
        report = await asyncio.wait_for(prune, 120)
        assert report["threads"] == 1 and report["legacy_unchecked"] is False, report
    finally:
        locker.close()
        await cp.arelease()
    assert writer.sql(f"SELECT COUNT(*) FROM threads WHERE thread_id = '{thread}'") == "1"
    assert writer.sql(f"SELECT COUNT(*) FROM threads WHERE thread_id = '{blocker}'") == "0"
    monkeypatch.setenv(agent.TURN_ENV, "2")
    (writer.workdir / "email.release").write_text("go")
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    try:
        await agent.build(cp).ainvoke({}, cfg(thread))
        assert effect_names(writer).count("charge") == charges + 1
        state = await cp.aget_state(cfg(thread))
        assert f"{thread}-t2-u-1" in [m.message_id for m in state.context], "the turn's user message was lost"
        assert state.execution_meta.status.value == "completed"
    finally:
        await cp.arelease()


async def test_prune_keeps_a_thread_whose_10xgraph_first_turn_entry_lingers(writer: Writer) -> None:
    """10xGraph's first turn (nondurable) killed after ``charge``; tenxgraph's ``{}`` finished it
    but its drop of 10xGraph's entry was missed (our resume killed between its commit and the
    drop): the entry says ``running``, the latest row is ours. A prune that asked Redis only about
    threads whose latest row 10xGraph wrote deleted the thread and its ledger, and the id's ``{}``
    then took the entry's run again: ``charge`` fired twice (red-team, session 44, F2). Prune's scan
    holds the thread until the entry's TTL ends."""
    thread = new_thread("prune-linger")
    left = writer.crash_in_tool_node(thread, nondurable=True)
    assert left["cache"] and json.loads(left["cache"])["execution_meta"]["status"] == "running"
    (writer.workdir / "email.release").write_text("go")
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    try:
        await agent.build(cp).ainvoke({}, cfg(thread))
        assert effect_names(writer).count("charge") == 1
        writer.redis_set(writer.cache_key(thread), left["cache"])  # the drop that was missed
        report = await cp.aprune(finished_older_than=0, ledger_ttl=0)
        assert (report["threads"], report["ledger_rows"]) == (0, 0), report
    finally:
        await cp.arelease()
    assert writer.sql(f"SELECT COUNT(*) FROM threads WHERE thread_id = '{thread}'") == "1"
    assert writer.sql(f"SELECT COUNT(*) FROM tool_executions WHERE thread_id = '{thread}'") == "2"


async def test_recovery_finds_a_run_among_large_finished_entries_and_odd_keys(writer: Writer) -> None:
    """The scan decoded every entry in one script call per 500 keys: large finished entries (2,000
    of 300 KB; 100 here) ran it past Redis' answer timeout, and a key that is not UTF-8 failed it;
    either way the pass saw no entry and said nothing (red-team, session 42). Only entries that
    say "running" are decoded, keys are read as bytes, and a pass that could not scan says so."""

    import redis

    thread = new_thread("among")
    writer.crash_in_tool_node(thread, nondurable=True)
    r = redis.Redis.from_url(writer.redis_url)
    filler = json.dumps({"context": [{"message_id": f"m{i}", "role": "user", "content": [
        {"type": "text", "text": "x" * 3000}]} for i in range(100)],
        "execution_meta": {"current_node": "model", "status": "completed"}})
    keys = [f"state_cache:big-{thread}-{i}:u1" for i in range(100)]
    try:
        with r.pipeline(transaction=False) as p:
            for k in keys:
                p.set(k, filler)
            p.set(b"state_cache:\xff\xfe-" + thread.encode() + b":u1", b"{}")
            p.execute()
        (writer.workdir / "email.release").write_text("go")
        cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
        report = await agent.build(cp).arecover()
        assert report.ok, (report.failed, report.unlisted)
        assert [(x.thread_id, x.status) for x in report.resumed] == [(thread, "completed")]
        assert effect_names(writer) == ["model", "charge", "email", "model"]
    finally:
        r.delete(*keys, b"state_cache:\xff\xfe-" + thread.encode() + b":u1")
        r.close()


async def test_large_entries_are_read_in_short_calls_and_decoded_only_when_they_say_running(
        writer: Writer) -> None:
    """One script call decoded every large entry that had ``"running"`` anywhere in its text (a
    text block of that value, a tool's ``status`` argument): 100 such entries of 1 MB ran it past
    Redis' answer timeout and blocked Redis for its length; recovery and prune then saw no entry
    at all, and prune reported ``legacy_unchecked`` on every run (red-team, session 44, F4); large
    entries that said nothing of the kind did the same, read whole (session 45). Now only the
    text ``"status": "running"`` makes an entry a candidate, and a call stops after ~2 MB read.
    Redis' slow log shows how long each call held Redis."""

    import redis

    thread = new_thread("big")
    writer.crash_in_tool_node(thread, nondurable=True)
    r = redis.Redis.from_url(writer.redis_url)
    pad = "x" * (1 << 20)
    # Finished entries: one whose text has a block of the value "running", one where a tool call
    # asked for a status of "running" (a real pair, decoded, and seen to be finished).
    said = json.dumps({"context": [{"message_id": "m1", "role": "user", "content": [
        {"type": "text", "text": "running"}, {"type": "text", "text": pad}]}],
        "execution_meta": {"current_node": "model", "status": "completed"}})
    asked = json.dumps({"context": [{"message_id": "m1", "role": "assistant", "content": [
        {"type": "text", "text": pad}], "tools_calls": [{"id": "c1", "function": {
            "name": "set_job", "arguments": {"status": "running"}}}]}],
        "execution_meta": {"current_node": "model", "status": "completed"}})
    plain = json.dumps({"context": [{"message_id": "m1", "role": "user", "content": [
        {"type": "text", "text": pad + pad[:1 << 19]}]}], "execution_meta": {"current_node": "model", "status": "completed"}})
    kinds = {"said": (said, 60), "asked": (asked, 10), "plain": (plain, 60)}
    keys = [f"state_cache:big-{kind}-{thread}-{i}:u1" for kind, (_, n) in kinds.items() for i in range(n)]
    threshold = r.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    try:
        with r.pipeline(transaction=False) as p:
            for k in keys:
                p.set(k, kinds[k.split("-")[1]][0])
            p.execute()
        r.config_set("slowlog-log-slower-than", 20_000)
        r.slowlog_reset()
        (writer.workdir / "email.release").write_text("go")
        cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
        try:
            report = await agent.build(cp).arecover()
            assert report.ok, (report.failed, report.unlisted)
            assert [(x.thread_id, x.status) for x in report.resumed] == [(thread, "completed")]
            pruned = await cp.aprune(finished_older_than=3600, dry_run=True)
            assert pruned["legacy_unchecked"] is False, pruned
        finally:
            await cp.arelease()
        assert effect_names(writer) == ["model", "charge", "email", "model"]
        ours = set(keys)
        # A slow-log entry keeps a call's first 32 arguments: its script, its key count and keys.
        slow = [(e["duration"], e["command"][:60]) for e in r.slowlog_get(128)
                if ours.intersection(a.decode(errors="replace") for a in e["command"].split())]
        # ~2 MB read is ~10-20 ms; the one call of before took 250 ms or more, or timed out.
        assert all(us < 150_000 for us, _ in slow), slow
    finally:
        r.config_set("slowlog-log-slower-than", threshold)
        r.delete(*keys)
        r.close()


@pytest.mark.parametrize("turn", [1, 2])
async def test_a_running_entry_with_a_lone_surrogate_is_resumed(
        writer: Writer, monkeypatch: pytest.MonkeyPatch, turn: int) -> None:
    """A 10xGraph turn whose user message holds a lone surrogate (a client that cut an emoji in
    half): ``json.dumps`` writes ``\\ud83d``, which neither Redis' cjson nor serde_json reads.
    The entry of that run was skipped as if it were not there: recovery reported a clean pass
    (turn 1: listed as skipped, ``not_running``; turn 2: not listed), the run never finished, and
    prune could delete the thread (red-team, session 45). Such an escape is now read as U+FFFD,
    so the run is resumed from its entry: ``charge`` answered from the ledger, ``email`` once."""
    thread = new_thread("surrogate")
    first: list[str] = []
    if turn == 2:
        writer.run_to_completion(thread)
        first = effect_names(writer)
        monkeypatch.setenv(agent.TURN_ENV, "2")
    writer.crash_in_tool_node(thread, nondurable=True, turn=turn)
    key = writer.cache_key(thread)
    entry = json.loads(writer.redis_get(key))
    assert entry["execution_meta"]["status"] == "running"
    asked = next(m for m in reversed(entry["context"]) if m["role"] == "user")
    asked["content"][0]["text"] += " \ud83d"
    writer.redis_set(key, json.dumps(entry))
    assert "\\ud83d" in writer.redis_get(key)
    (writer.workdir / "email.release").write_text("go")
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    try:
        pruned = await cp.aprune(finished_older_than=0, ledger_ttl=0, dry_run=True)
        assert (pruned["threads"], pruned["ledger_rows"]) == (0, 0), pruned
        report = await agent.build(cp).arecover()
        assert report.ok, (report.failed, report.unlisted)
        assert [(x.thread_id, x.status) for x in report.resumed] == [(thread, "completed")], report
    finally:
        await cp.arelease()
    assert effect_names(writer) == [*first, "model", "charge", "email", "model"]


async def test_recovery_lists_no_entry_that_a_resume_would_not_use(writer: Writer) -> None:
    """Entries that say ``running`` but are no run a resume would take: one without a version on a
    thread with a finished 10xGraph row, one at an older version, and one of a thread this
    database does not have. Recovery lists none of them (the first was listed and reported as
    skipped) and touches nothing."""
    finished, stale = new_thread("fin"), new_thread("stale")
    for thread in (finished, stale):
        writer.run_to_completion(thread)
    version = int(writer.sql(f"SELECT max(version) FROM states WHERE thread_id = '{stale}'"))
    entry = {"context": [], "execution_meta": {"current_node": "tools", "status": "running"}}
    writer.redis_set(writer.cache_key(finished), json.dumps({**entry, "execution_meta": {
        **entry["execution_meta"], "thread_id": finished}}))
    writer.redis_set(writer.cache_key(stale), json.dumps({**entry, "__checkpoint_version__": version - 1}))
    stranger = new_thread("stranger")
    writer.redis_set(writer.cache_key(stranger), json.dumps(entry))
    done = effect_names(writer)
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    report = await agent.build(cp).arecover()
    assert (report.resumed, report.skipped, report.failed) == ([], [], [])
    assert effect_names(writer) == done
    assert await cp.aget_state(cfg(stranger)) is None


@pytest.mark.parametrize("redis", [True, False], ids=["redis", "no-redis"])
async def test_run_killed_in_the_model_after_its_tools_resumes_at_the_model(
    writer: Writer, tmp_path: Path, logs: pytest.LogCaptureFixture, redis: bool
) -> None:
    """The likeliest crash point: the model call after the tools. 10xGraph's row then names the
    tool node (completed, its results the last messages) and its cache the model. Resumed at the
    model either way: the tools do not run again (without the cache, running the tool node again
    could only fail: its last message asks for no tools)."""
    thread = new_thread("crash-model")
    left = writer.crash_in_model_node(thread)
    assert left["states"][-1]["meta"]["current_node"] == "tools"
    assert [m["role"] for m in left["states"][-1]["context"]] == ["user", "assistant", "tool", "tool"]
    assert json.loads(left["cache"])["execution_meta"]["current_node"] == "model"
    # The two tools ran in parallel (either may finish first), each once.
    done = effect_names(writer)
    assert done[0] == "model" and sorted(done[1:]) == ["charge", "email"], done
    clean_dir = tmp_path / "ref-clean"
    clean_dir.mkdir()
    clean_thread = new_thread("clean")
    clean = Writer(writer.python, writer.pg, writer.dsn, writer.redis_url, clean_dir).run_to_completion(clean_thread)

    _, state, _ = await resume_on_tenxgraph(writer, thread, redis=redis)

    assert effect_names(writer) == [*done, "model"]
    assert state.execution_meta.status.value == "completed"
    assert comparable(state.context, thread) == comparable(clean["context"], clean_thread)
    # The tool results are 10xGraph's, unchanged (no second run wrote new ones).
    assert as_json(state.context)[:4] == left["states"][-1]["context"]
    said = [r.getMessage() for r in logs.records]
    if redis:
        assert any("from its Redis state cache" in m for m in said)
    else:
        assert any("after node 'tools' completed: resuming at 'model'" in m for m in said)


async def test_thread_10xgraph_paused_at_interrupt_before_resumes_like_10xgraph(writer: Writer, tmp_path: Path) -> None:
    """A thread 10xGraph paused by ``interrupt_before=["tools"]`` (not a crash: its row is
    ``interrupted_before``): resumed with ``ainvoke({})`` it runs the tools once and completes as
    10xGraph's own resume of the same thread does."""
    thread = new_thread("paused")
    paused = writer.run_to_completion(thread, INTERRUPT_BEFORE="tools")
    assert paused["status"] == "interrupted_before"
    assert effect_names(writer) == ["model"]
    theirs = their_resume(writer, thread, tmp_path / "ref-resume", 3, INTERRUPT_BEFORE="tools")
    assert theirs["status"] == "completed"

    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    out = await agent.build(cp, interrupt_before=["tools"]).ainvoke({}, config=cfg(thread))
    state = await cp.aget_state(cfg(thread))

    done = effect_names(writer)
    assert done[0] == done[3] == "model" and sorted(done[1:3]) == ["charge", "email"] and len(done) == 4, done
    assert state.execution_meta.status.value == "completed"
    assert comparable(state.context, thread) == comparable(theirs["context"], thread)
    assert comparable(out["messages"], thread) == comparable(theirs["messages"], thread)


async def test_another_threads_entry_under_the_same_key_is_neither_resumed_nor_deleted(writer: Writer) -> None:
    """10xGraph's key ``state_cache:<thread>:<user>`` is not escaped: thread ``T:b`` of user
    ``u1`` and thread ``T`` of user ``b:u1`` share one. A run 10xGraph left unfinished for the
    first (no state row: only its entry) was resumed under the second user's new thread: that
    user got its messages, ``charge`` fired again, and the entry was then deleted, so the owner's
    own resume had nothing left (red-team, session 34)."""
    base = new_thread("coll")
    victim = f"{base}:b"
    left = writer.crash_in_tool_node(victim, nondurable=True)
    assert left["states"] == [] and json.loads(left["cache"])["execution_meta"]["current_node"] == "tools"
    key = writer.cache_key(victim)
    assert key == f"state_cache:{base}:b:u1"
    (writer.workdir / "email.release").write_text("go")
    other = {"thread_id": base, "user_id": "b:u1"}
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    try:
        with pytest.raises(ValueError, match="messages"):  # a thread with nothing to resume
            await agent.build(cp).ainvoke({}, config=other)
        assert effect_names(writer) == ["model", "charge"], "the other user's run fired a tool"
        assert await cp.aget_state(other) is None
        await cp.aclean_thread(other)  # clears that thread's cache entries: not the victim's
        assert writer.redis_get(key) is not None, "the owner's entry was deleted"
    finally:
        await cp.arelease()
    out, state, _ = await resume_on_tenxgraph(writer, victim, redis=True)
    assert effect_names(writer) == ["model", "charge", "email", "model"], writer.effects()
    assert state.execution_meta.status.value == "completed"


async def test_a_10xgraph_worker_cannot_write_a_thread_tenxgraph_wrote_last(writer: Writer) -> None:
    """A rolling deploy (or a rollback) with both runtimes on one database: 10xGraph read our row,
    whose state carries no context, as an empty history, and wrote a row holding only its own turn;
    tenxgraph then took that row's context as the truth and rewrote the thread's messages from it:
    every earlier turn was gone (red-team, session 34). Schema v16 refuses 10xGraph's write."""
    thread = new_thread("mixed")
    (writer.workdir / "email.release").write_text("go")
    cp = PgCheckpointer(writer.dsn, redis_url=writer.redis_url)
    try:
        await agent.build(cp).ainvoke({"messages": [agent.user_message(thread)]}, config=cfg(thread))
        ours = [m.message_id for m in (await cp.aget_state(cfg(thread))).context]
        assert len(ours) == 5
        rows_before = writer.sql(f"SELECT count(*) FROM messages WHERE thread_id = '{thread}'")

        theirs = writer.run(thread, "start")
        assert theirs.returncode != 0, theirs.stdout[-2000:]
        assert "was last written by tenxgraph" in theirs.stdout + theirs.stderr, (theirs.stdout + theirs.stderr)[-3000:]
        assert writer.sql(f"SELECT count(*) FROM states WHERE thread_id = '{thread}' AND state_data ? 'context'") == "0"
        assert writer.sql(f"SELECT count(*) FROM messages WHERE thread_id = '{thread}'") == rows_before
        assert [m.message_id for m in (await cp.aget_state(cfg(thread))).context] == ours
    finally:
        await cp.arelease()


async def test_10xgraph_still_writes_the_threads_it_wrote_last(writer: Writer) -> None:
    """The guard leaves 10xGraph's own threads alone: on a database tenxgraph migrated, a
    10xGraph worker still runs its threads (a fleet finishing its runs during the upgrade)."""
    thread = new_thread("theirs")
    PgCheckpointer(writer.dsn).setup()  # migrated to the current version first
    first = writer.run_to_completion(thread)
    assert first["status"] == "completed"
    assert writer.sql(f"SELECT count(*) FROM states WHERE thread_id = '{thread}' AND state_data ? 'context'") != "0"
