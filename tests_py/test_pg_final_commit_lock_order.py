"""A run's last commit (it frees the thread's lease) next to another transaction of the same run
that checks the lease and then locks the thread: the late ledger record of a tool call cut off
by ``stop()`` or ``node_timeout``. The commit read the lease row under a share lock, locked the
thread row, and then updated the lease row; the record, holding its own share lock on the lease
row, waited for the thread row. PostgreSQL broke that deadlock by aborting one of them, and the
stopped run raised ``STORAGE_TRANSIENT_001`` (a fresh-clone CI run, session 37). The commit now
takes the lease row for update first, so the other transaction waits for it or it for the other,
never both.

The other transaction is played here by a ``psql`` session that takes the same locks in the same
order, at the moment the commit waits on it (found through ``pg_blocking_pids``, not a sleep).
A commit the server aborts to break a lock cycle is sent again, with a warning; the second test
makes one with a transaction that is not ours and checks it is."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import TransientStorageError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import PgCheckpointer
from .pg_sessions import Holder, blocked_by, psql
from .reply_graph import reply_graph
from .tool_graphs import call, route

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not DSN, reason="needs TENXGRAPH_TEST_PG_DSN (python -m tenxgraph.testing serve ENV)")


def _psql(sql: str) -> str:
    return psql(str(DSN), sql)


def _graph(cp: PgCheckpointer, shape: str, entered: asyncio.Event, go: asyncio.Event) -> Any:
    """``plain``: one node, then the run's last commit. ``tool``: a model asks for one call and the
    tool node's commit (its result's ledger row with it) is the run's last."""

    async def wait_for_the_lock() -> str:
        """Wait."""
        entered.set()
        await go.wait()
        return "waited"

    g = StateGraph(AgentState)
    if shape == "plain":
        async def work(state: AgentState) -> Message:
            await wait_for_the_lock()
            return Message.text_message("worked", role="assistant")

        g.add_node("work", work)
        g.add_edge(START, "work")
        g.add_edge("work", END)
    else:
        def model(state: AgentState) -> Message:
            return Message(role="assistant", content=[], tools_calls=[call("c1", "wait_for_the_lock")])

        g.add_node("model", model)
        g.add_node("tools", ToolNode([wait_for_the_lock]))
        g.add_edge(START, "model")
        g.add_conditional_edges("model", route, {"tools": "tools", END: END})
        g.add_edge("tools", END)
    return g.compile(checkpointer=cp)


@pytest.mark.asyncio
@pytest.mark.parametrize("shape", ["plain", "tool"])
async def test_the_last_commit_does_not_deadlock_with_a_lease_check_that_then_locks_the_thread(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    schema = f"lo_{uuid.uuid4().hex[:10]}"
    cp = PgCheckpointer(postgres_dsn=DSN, schema=schema)
    entered, go = asyncio.Event(), asyncio.Event()
    app = _graph(cp, shape, entered, go)
    run = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": "t:1"}))
    locker = Holder(str(DSN))
    try:
        await asyncio.wait_for(entered.wait(), 60)
        # The run's own lease check, as the late record makes it (the lease row under a share lock).
        holder = await locker.ask_async(
            f"BEGIN; SELECT pg_backend_pid() FROM \"{schema}\".tenx_leases WHERE thread_id = 't:1' FOR SHARE;")
        assert holder.isdigit(), f"no lease row to check: {holder!r}"
        go.set()
        assert await blocked_by(str(DSN), holder, run), "the run's last commit never waited on the lease row"
        # The record goes on to lock the thread row: it must get it (the commit holds nothing it
        # needs yet), or the server aborts one of the two.
        locked = await locker.ask_async(
            f"SELECT 'locked' FROM \"{schema}\".threads WHERE thread_id = 't:1' FOR UPDATE; COMMIT; SELECT 'committed';")
        assert locked == "locked"
        out = await asyncio.wait_for(run, 60)
    finally:
        go.set()
        locker.close()
    assert out["messages"][-1].text() == ("worked" if shape == "plain" else "waited")
    # A commit the server aborted is sent again (and says so): the order of the locks is what is
    # tested, so no retry may have been needed.
    assert not [r for r in caplog.records if "resolve a lock conflict" in r.getMessage()]
    assert _psql(f"SELECT released FROM \"{schema}\".tenx_leases WHERE thread_id = 't:1'") == "t"
    await cp.arelease()


@pytest.mark.asyncio
@pytest.mark.parametrize("aborted", [1, 3])
@pytest.mark.parametrize("commit", ["input", "step"])
async def test_a_commit_the_server_aborts_for_a_lock_cycle_is_sent_again(
    commit: str, aborted: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The server aborts the first ``aborted`` commits of the run's input (version 1) or of its
    step (version 2) with 40P01 (a trigger on the state table raises it, counted by a sequence,
    which a rollback does not undo): a lock cycle with a transaction that is not ours. Once is
    sent again; three times is the typed transient error, with nothing of that commit written."""
    schema = f"lv_{uuid.uuid4().hex[:10]}"
    cp = PgCheckpointer(postgres_dsn=DSN, schema=schema)
    await cp.asetup()
    version = 1 if commit == "input" else 2
    _psql(f"""CREATE SEQUENCE "{schema}".aborts;
              CREATE FUNCTION "{schema}".abort_first() RETURNS trigger LANGUAGE plpgsql AS $$
              BEGIN
                IF NEW.version = {version} AND nextval('"{schema}".aborts') <= {aborted} THEN
                  RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01';
                END IF;
                RETURN NEW;
              END $$;
              CREATE TRIGGER abort_first BEFORE INSERT ON "{schema}".states
                FOR EACH ROW EXECUTE FUNCTION "{schema}".abort_first();""")

    app = reply_graph(cp)
    cfg = {"thread_id": "t"}

    def retried() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "resolve a lock conflict" in r.getMessage()]

    def stored(table: str) -> str:
        return _psql(f"SELECT count(*) FROM \"{schema}\".{table} WHERE thread_id = 't'")

    if aborted == 1:
        out = await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("go")]}, cfg), 60)
        assert out["messages"][-1].text() == "reply to go"
        assert len(retried()) == 1
        assert (stored("states"), stored("messages")) == ("2", "2")
    else:
        with pytest.raises(TransientStorageError) as raised:
            await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("go")]}, cfg), 60)
        assert raised.value.error_code == "STORAGE_TRANSIENT_001"
        assert len(retried()) == 2
        # What came before stands; the aborted commit wrote nothing.
        assert (stored("states"), stored("messages")) == (("0", "0") if commit == "input" else ("1", "1"))
    await cp.arelease()
