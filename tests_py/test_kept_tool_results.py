"""Tool results that could not be recorded, kept by the store for the thread's next attempt in
the process (src/store/unrecorded.rs), and the ledger reads next to a refused write. Found by a
red-team of session 28's first version of the feature (each test failed on it)."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import TransientStorageError
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils import tool

from tests_py.one_tool_graph import tool_calls_graph


def _tool_texts(messages) -> list[str]:
    return [b.output for m in messages if m.role == "tool" for b in m.content if hasattr(b, "output")]


@pytest.mark.asyncio
@pytest.mark.parametrize("side_effects", ["idempotent", "at_most_once"])
async def test_a_thread_deleted_while_its_tool_runs_is_not_answered_with_that_result_when_made_again(
    checkpointer, make_thread, side_effects: str
) -> None:
    runs: list[int] = []
    entered, release = asyncio.Event(), asyncio.Event()

    @tool(side_effects=side_effects)
    async def pay(amount: int) -> str:
        """Pay an amount."""
        runs.append(amount)
        if len(runs) == 1:
            entered.set()
            await release.wait()
        return f"paid, run {len(runs)}"

    app = tool_calls_graph(checkpointer, [pay], [("pay", {"amount": 5})])
    config = {"thread_id": make_thread("deleted")}
    first = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config))
    await asyncio.wait_for(entered.wait(), 30)
    await checkpointer.aclean_thread(config)
    release.set()
    with pytest.raises(Exception):  # the run lost its thread (LeaseLostError, or a conflict)
        await asyncio.wait_for(first, 30)

    # The same id, the same user message: the same ledger keys, a new thread.
    result = await asyncio.wait_for(
        app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config), 30)
    assert runs == [5, 5], "the new thread's call runs"
    assert _tool_texts(result["messages"]) == ["paid, run 2"]


@pytest.fixture
def refusing_database(tenx_postgres):
    """A database whose ledger, state and message writes are refused with SQLSTATE 25006 (what a
    read-only server answers) while ``rt_flag.v`` says so: 'all', or 'ledger' (ledger writes only).
    The lease table is never refused."""
    name = f"tenx_kept_{uuid.uuid4().hex[:12]}"
    dsn = tenx_postgres.create_database(name)
    yield name, dsn
    tenx_postgres.drop_database(name)


_REFUSING = """
CREATE TABLE rt_flag (v text); INSERT INTO rt_flag VALUES ('off');
CREATE FUNCTION rt_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  IF (SELECT v FROM rt_flag) = 'all' OR ((SELECT v FROM rt_flag) = 'ledger' AND TG_TABLE_NAME = 'tool_executions') THEN
    RAISE EXCEPTION 'cannot execute % in a read-only transaction', TG_OP USING ERRCODE = '25006';
  END IF;
  RETURN NEW; END $$;
CREATE TRIGGER rt_refuse_ledger BEFORE INSERT OR UPDATE ON tool_executions FOR EACH ROW EXECUTE FUNCTION rt_refuse();
CREATE TRIGGER rt_refuse_states BEFORE INSERT OR UPDATE ON states FOR EACH ROW EXECUTE FUNCTION rt_refuse();
CREATE TRIGGER rt_refuse_messages BEFORE INSERT OR UPDATE ON messages FOR EACH ROW EXECUTE FUNCTION rt_refuse();
"""


@pytest.mark.asyncio
async def test_a_refused_intent_write_still_replays_what_the_ledger_holds(tenx_postgres, refusing_database) -> None:
    """PostgreSQL writes a node's intents and reads its ledger in one statement: a refused write
    lost the read, so a recorded at-most-once call was answered "not run" and a recorded
    idempotent one ran again."""
    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING, dbname=name)
    runs: collections.Counter[str] = collections.Counter()
    both_recorded = asyncio.Event()

    @tool(side_effects="at_most_once")
    async def charge(x: int) -> str:
        """Charge once."""
        runs["charge"] += 1
        return "charged"

    @tool
    async def notify(x: int) -> str:
        """Notify (idempotent)."""
        runs["notify"] += 1
        return "notified"

    @tool
    async def slow(x: int) -> str:
        """Returns last, once the server refuses everything."""
        runs["slow"] += 1
        await asyncio.wait_for(both_recorded.wait(), 30)
        await asyncio.to_thread(tenx_postgres.psql, "UPDATE rt_flag SET v = 'all'", dbname=name)
        return "slow done"

    app = tool_calls_graph(cp, [charge, notify, slow], [("charge", {"x": 1}), ("notify", {"x": 2}), ("slow", {"x": 3})])
    config = {"thread_id": "t-intents"}

    async def watch_ledger() -> None:  # charge and notify recorded before slow returns
        while True:
            rows = await asyncio.to_thread(
                tenx_postgres.psql,
                "SELECT count(*) FROM tool_executions WHERE result->>'__kind__' IS DISTINCT FROM 'started'",
                dbname=name)
            if int(rows.strip()) >= 2:
                both_recorded.set()
                return
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_ledger())
    try:
        with pytest.raises(TransientStorageError):
            await asyncio.wait_for(
                app.ainvoke({"messages": [Message.text_message("go", message_id="u-1")]}, config), 60)
        await watcher
        # Only the ledger refuses now: the resume's intent write fails, its read must not.
        tenx_postgres.psql("UPDATE rt_flag SET v = 'ledger'", dbname=name)
        result = await asyncio.wait_for(app.ainvoke({}, config), 60)
        texts = _tool_texts(result["messages"])
        assert texts == ["charged", "notified", "slow done"], texts
        assert runs == {"charge": 1, "notify": 1, "slow": 1}, runs
    finally:
        watcher.cancel()
        await cp.arelease()


@pytest.mark.asyncio
async def test_a_result_kept_by_a_turn_that_then_completed_is_not_replayed_into_a_thread_made_again(
    tenx_postgres, refusing_database
) -> None:
    """Only the ledger refuses: the tools' rows are kept, the step is written without them and the
    turn completes. The thread is pruned and made again with the same ids: its calls run (a kept
    result outlived its turn and answered the new thread's call, the helper's 4 of 4)."""
    name, dsn = refusing_database
    cp = PgCheckpointer(dsn, pool_config={"max_size": 4})
    await cp.asetup()
    tenx_postgres.psql(_REFUSING + "UPDATE rt_flag SET v = 'ledger';", dbname=name)
    runs: list[int] = []

    @tool
    async def pay(amount: int) -> str:
        """Pay an amount."""
        runs.append(amount)
        return f"paid, run {len(runs)}"

    # One asking message id for every turn: the new thread's call has the old one's ledger key.
    app = tool_calls_graph(cp, [pay], [("pay", {"amount": 5})], asking_id="a-fixed")
    config = {"thread_id": "t-pruned"}
    try:
        result = await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-1")]}, config)
        assert _tool_texts(result["messages"]) == ["paid, run 1"]
        tenx_postgres.psql("UPDATE rt_flag SET v = 'off'", dbname=name)
        pruned = await cp.aprune(finished_older_than=0)
        assert pruned["threads"] == 1, pruned
        assert await cp.aget_state(config) is None

        result = await app.ainvoke({"messages": [Message.text_message("pay", message_id="u-2")]}, config)
        assert _tool_texts(result["messages"]) == ["paid, run 2"]
        assert runs == [5, 5]
    finally:
        await cp.arelease()
