"""PgCheckpointer on databases that 10xGraph 0.10 left behind (spec §6.4), thread ownership, and
bad constructor input.

The legacy databases are built with plain SQL (psql), exactly as 10xGraph's own migrator and
writers leave them at schema v1, v2 and v3: no ``messages.seq`` / ``message_data`` columns, the
whole ``context`` inside ``states.state_data``, message ``content`` as TEXT holding a JSON list of
blocks, and (v3) the tool ledger keyed ``"<message_id>:<tool_call_id>"`` with an envelope
``{"__kind__": "message", "value": <tool message json>}``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import MessageNotFoundError, StorageError, TransientStorageError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state import TokenUsages
from tenxgraph.core.state.execution_state import ExecutionState
from tenxgraph.core.state.message_block import TextBlock, ToolCallBlock, ToolResultBlock
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo

# Every schema version a migrated database records: 10xGraph's 1-3, then ours (migrations/postgres).
ALL_VERSIONS = tuple(sorted(int(f.name[:4]) for f in (Path(__file__).resolve().parent.parent / "migrations" / "postgres").glob("[0-9][0-9][0-9][0-9]_*.sql")))

OWNER = "u1"
INTRUDER = "u2"
THREAD = "legacy-thread-1"
FORBIDDEN = "STORAGE_FORBIDDEN_001"
FOREIGN_MESSAGE = "STORAGE_FORBIDDEN_002"


class BillingState(AgentState):
    invoice: str = ""
    attempts: int = 0


# -- helpers -------------------------------------------------------------------------------


def lit(value: str) -> str:
    """A SQL string literal (standard_conforming_strings is on by default)."""
    return "'" + value.replace("'", "''") + "'"


def jlit(value: Any) -> str:
    return lit(json.dumps(value)) + "::jsonb"


def dbname_of(dsn: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(dsn).path.lstrip("/"))


def rows(pg: Any, dbname: str, sql: str) -> list[list[str]]:
    out = pg.psql(sql, dbname=dbname)
    return [line.split("|") for line in out.splitlines() if line != ""]


def scalar(pg: Any, dbname: str, sql: str) -> str:
    out = pg.psql(sql, dbname=dbname).strip()
    return out


def jquery(pg: Any, dbname: str, sql: str) -> Any:
    """Runs ``SELECT COALESCE(json_agg(x), '[]') FROM (<sql>) x`` and decodes it."""
    return json.loads(scalar(pg, dbname, f"SELECT COALESCE(json_agg(x), '[]'::json) FROM ({sql}) x"))


def texts(messages: list[Message]) -> list[str]:
    return [m.text() for m in messages]


def ids(messages: list[Message]) -> list[str]:
    return [str(m.message_id) for m in messages]


def cfg(user: str = OWNER, thread: str = THREAD) -> dict[str, Any]:
    return {"thread_id": thread, "user_id": user}


def comparable(m: Message) -> dict[str, Any]:
    """A message's JSON without the fields a column-built row cannot carry (timestamp)."""
    d = m.model_dump(mode="json")
    d.pop("timestamp", None)
    return d


# -- the legacy database builder -----------------------------------------------------------


@dataclass
class Legacy:
    """A database as 10xGraph 0.10 left it, with one thread of user u1."""

    pg: Any
    dsn: str
    dbname: str
    schema_version: int
    thread_id: str
    messages: list[Message]
    states: list[BillingState]
    ledger_key: str | None = None
    envelope: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def q(self, sql: str) -> list[list[str]]:
        return rows(self.pg, self.dbname, sql)

    def one(self, sql: str) -> str:
        return scalar(self.pg, self.dbname, sql)

    def j(self, sql: str) -> Any:
        return jquery(self.pg, self.dbname, sql)

    def snapshot(self) -> dict[str, Any]:
        """Everything a write could change, row by row (the cache table excluded)."""
        has_version = self.schema_version >= 2 or self._has_column("states", "version")
        version_col = "version" if has_version else "NULL AS version"
        snap = {
            "threads": self.j("SELECT thread_id, user_id, thread_name, meta, created_at, updated_at "
                              "FROM threads ORDER BY thread_id"),
            "states": self.j(f"SELECT state_id, thread_id, {version_col}, md5(state_data::text) AS h, created_at "
                             "FROM states ORDER BY state_id"),
            "messages": self.j("SELECT * FROM messages ORDER BY message_id"),
        }
        if self._has_table("tool_executions"):
            snap["ledger"] = self.j("SELECT * FROM tool_executions ORDER BY thread_id, tool_call_id")
        return snap

    def _has_column(self, table: str, column: str) -> bool:
        return self.one(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'public' "
            f"AND table_name = {lit(table)} AND column_name = {lit(column)}"
        ) == "1"

    def _has_table(self, table: str) -> bool:
        return self.one(f"SELECT to_regclass({lit('public.' + table)}) IS NOT NULL") == "t"


def legacy_ddl(version: int) -> str:
    """10xGraph's schema at ``version`` (spec §6.4): v1, then its stepwise v2 and v3 migrations."""
    sql = """
CREATE TABLE IF NOT EXISTS schema_version (version INT PRIMARY KEY, applied_at TIMESTAMPTZ DEFAULT NOW());
DO $$ BEGIN
  CREATE TYPE message_role AS ENUM ('user', 'assistant', 'system', 'tool');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
CREATE TABLE IF NOT EXISTS threads (
  thread_id VARCHAR(255) PRIMARY KEY,
  thread_name VARCHAR(255),
  user_id VARCHAR(255) NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  meta JSONB DEFAULT '{}'::jsonb
);
CREATE TABLE IF NOT EXISTS states (
  state_id SERIAL PRIMARY KEY,
  thread_id VARCHAR(255) NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
  state_data JSONB NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  meta JSONB DEFAULT '{}'::jsonb
);
CREATE TABLE IF NOT EXISTS messages (
  message_id VARCHAR(255) PRIMARY KEY,
  thread_id VARCHAR(255) NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
  role message_role NOT NULL,
  content TEXT,
  tool_calls JSONB,
  tool_call_id VARCHAR(255),
  reasoning TEXT,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  total_tokens INT DEFAULT 0,
  usages JSONB DEFAULT '{}'::jsonb,
  meta JSONB DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS idx_threads_user_id ON threads(user_id);
CREATE INDEX IF NOT EXISTS idx_states_thread_id ON states(thread_id);
CREATE INDEX IF NOT EXISTS idx_messages_thread_id ON messages(thread_id);
INSERT INTO schema_version (version) VALUES (1);
"""
    if version >= 2:
        sql += """
ALTER TABLE states ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS idx_states_thread_version ON states(thread_id, version DESC);
ALTER TABLE states ADD CONSTRAINT uq_states_thread_version UNIQUE (thread_id, version);
INSERT INTO schema_version (version) VALUES (2);
"""
    if version >= 3:
        sql += """
CREATE TABLE IF NOT EXISTS tool_executions (
  thread_id VARCHAR(255) NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
  tool_call_id VARCHAR(255) NOT NULL,
  result JSONB NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  PRIMARY KEY (thread_id, tool_call_id)
);
INSERT INTO schema_version (version) VALUES (3);
"""
    return sql


def legacy_state_json(state: BillingState) -> dict[str, Any]:
    """What 10xGraph writes to states.state_data: the full dump, context included, plus the header."""
    data = state.model_dump(mode="json")
    data["__state_meta__"] = {"format": 1, "class": type(state).__name__}
    return data


def legacy_message_row_sql(m: Message, thread_id: str, created_at: str) -> str:
    """One INSERT as 10xGraph's message writer issues it (content TEXT = JSON list of blocks)."""
    content = json.dumps([b.model_dump(mode="json") for b in m.content])
    tool_call_id = m.metadata.get("tool_call_id") if m.role == "tool" else None
    usages = m.usages.model_dump(mode="json") if m.usages else {}
    total = m.usages.total_tokens if m.usages else 0
    return (
        "INSERT INTO messages (message_id, thread_id, role, content, tool_calls, tool_call_id, reasoning, "
        "created_at, updated_at, total_tokens, usages, meta) VALUES ("
        f"{lit(str(m.message_id))}, {lit(thread_id)}, {lit(m.role)}::message_role, {lit(content)}, "
        f"{jlit(m.tools_calls) if m.tools_calls is not None else 'NULL'}, "
        f"{lit(tool_call_id) if tool_call_id else 'NULL'}, {lit(m.reasoning) if m.reasoning else 'NULL'}, "
        f"{lit(created_at)}::timestamptz, {lit(created_at)}::timestamptz, {total}, {jlit(usages)}, {jlit(m.metadata)});"
    )


def conversation(
    user_id: str = "0a000000-0000-4000-8000-000000000001",
    assistant_id: str = "0b000000-0000-4000-8000-000000000002",
    tool_id: str = "0c000000-0000-4000-8000-000000000003",
) -> list[Message]:
    """user asks, the assistant calls tool "charge" (call_1), the tool answers."""
    t0 = 1_735_725_600.0
    user = Message(message_id=user_id, role="user", content=[TextBlock(text="please charge 42")], timestamp=t0)
    assistant = Message(
        message_id=assistant_id,
        role="assistant",
        content=[
            TextBlock(text="Charging now."),
            ToolCallBlock(id="call_1", name="charge", args={"amount": 42}),
        ],
        tools_calls=[
            {"id": "call_1", "type": "function", "function": {"name": "charge", "arguments": '{"amount": 42}'}}
        ],
        usages=TokenUsages(completion_tokens=5, prompt_tokens=10, total_tokens=15),
        metadata={"provider": "scripted"},
        timestamp=t0 + 1,
    )
    tool = Message(
        message_id=tool_id,
        role="tool",
        content=[ToolResultBlock(call_id="call_1", output="charged 42", status="completed")],
        metadata={"tool_call_id": "call_1"},
        timestamp=t0 + 2,
    )
    return [user, assistant, tool]


def build_legacy(
    pg: Any,
    dsn: str,
    version: int,
    *,
    msgs: list[Message] | None = None,
    message_times: list[str] | None = None,
    table_messages: list[int] | None = None,
    state_context: list[int] | None = None,
    v1_reverse_insert: bool = False,
    last_node: str = "model",
) -> Legacy:
    """Creates, in the (empty) database of ``dsn``, 10xGraph's schema at ``version`` and one thread of
    u1 with two state rows (versions 1 and 2; at v1 there is no version column) and its messages.

    ``table_messages``: indexes of the messages also written to the messages table (default all).
    ``state_context``: indexes of the messages inside the version-2 state's context (default all).
    ``message_times``: created_at of each message row (default one second apart).
    ``v1_reverse_insert``: insert the later state row first (state_id order != created_at order).
    ``last_node``: current_node of the version-2 state.
    """
    dbname = dbname_of(dsn)
    msgs = msgs if msgs is not None else conversation()
    table_messages = table_messages if table_messages is not None else list(range(len(msgs)))
    state_context = state_context if state_context is not None else list(range(len(msgs)))
    message_times = message_times or [f"2025-01-01 10:00:0{i}+00" for i in range(len(msgs))]

    s1 = BillingState(
        context=[msgs[0], msgs[1]],
        invoice="INV-7",
        attempts=1,
        execution_meta=ExecutionState(current_node="tools", step=1, thread_id=THREAD),
    )
    s2 = BillingState(
        context=[msgs[i] for i in state_context],
        invoice="INV-7",
        attempts=2,
        context_summary="customer wants a charge",
        execution_meta=ExecutionState(current_node=last_node, step=2, status="running", thread_id=THREAD),
    )
    state_rows = [(1, s1, "2025-01-01 10:00:01.5+00"), (2, s2, "2025-01-01 10:00:02.5+00")]
    if v1_reverse_insert:
        state_rows.reverse()

    sql = [legacy_ddl(version)]
    sql.append(
        "INSERT INTO threads (thread_id, thread_name, user_id, created_at, updated_at, meta) VALUES "
        f"({lit(THREAD)}, 'Billing chat', {lit(OWNER)}, '2025-01-01 10:00:00+00', '2025-01-01 10:00:03+00', "
        f"{jlit({'source': '10xgraph'})});"
    )
    for v, st, at in state_rows:
        data = jlit(legacy_state_json(st))
        if version >= 2:
            sql.append(
                "INSERT INTO states (thread_id, version, state_data, created_at, updated_at) VALUES "
                f"({lit(THREAD)}, {v}, {data}, {lit(at)}, {lit(at)});"
            )
        else:
            sql.append(
                "INSERT INTO states (thread_id, state_data, created_at, updated_at) VALUES "
                f"({lit(THREAD)}, {data}, {lit(at)}, {lit(at)});"
            )
    for i in table_messages:
        sql.append(legacy_message_row_sql(msgs[i], THREAD, message_times[i]))
    ledger_key = envelope = None
    if version >= 3:
        tool_msg = msgs[2]
        ledger_key = f"{msgs[1].message_id}:call_1"
        envelope = {"__kind__": "message", "value": tool_msg.model_dump(mode="json")}
        sql.append(
            "INSERT INTO tool_executions (thread_id, tool_call_id, result, created_at) VALUES "
            f"({lit(THREAD)}, {lit(ledger_key)}, {jlit(envelope)}, '2025-01-01 10:00:02+00');"
        )
    pg.psql("\n".join(sql), dbname=dbname)
    return Legacy(pg, dsn, dbname, version, THREAD, msgs, [s1, s2], ledger_key, envelope)


@pytest.fixture(params=[1, 2, 3], ids=["v1", "v2", "v3"])
def legacy(request: pytest.FixtureRequest, tenx_postgres: Any, pg_dsn: str) -> Legacy:
    return build_legacy(tenx_postgres, pg_dsn, request.param)


@pytest.fixture
def legacy_v3(tenx_postgres: Any, pg_dsn: str) -> Legacy:
    return build_legacy(tenx_postgres, pg_dsn, 3)


def open_cp(dsn: str, **kw: Any) -> PgCheckpointer:
    cp = PgCheckpointer(dsn, **kw)
    cp.setup()  # connects and migrates (the constructor does not)
    cp.bind_state_type(BillingState)
    return cp


# -- the graph that resumes a legacy thread ------------------------------------------------


def resume_graph(cp: PgCheckpointer, calls: dict[str, int]):
    """model: after a tool result it answers "all done"; it never asks for a tool again."""

    def charge(amount: int) -> str:
        calls["charge"] = calls.get("charge", 0) + 1
        return f"charged {amount} AGAIN"

    async def model(state: BillingState) -> Message:
        calls["model"] = calls.get("model", 0) + 1
        last = state.context[-1]
        if last.role == "tool":
            return Message.text_message("all done", role="assistant")
        return Message.text_message(f"unexpected last message role={last.role}", role="assistant")

    def route(state: BillingState) -> str:
        return "tools" if state.context[-1].tools_calls else END

    g = StateGraph(BillingState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([charge]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


# ==========================================================================================
# 1-2. Migration of legacy databases, reading and resuming them
# ==========================================================================================


def assert_migrated(lg: Legacy) -> None:
    assert [r[0] for r in lg.q("SELECT version FROM schema_version ORDER BY version")] == [str(v) for v in ALL_VERSIONS]
    cols = {r[0] for r in lg.q(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'messages'"
    )}
    assert {"seq", "message_data"} <= cols
    assert lg.one("SELECT count(*) FROM pg_constraint WHERE conname = 'uq_states_thread_version'") == "1"
    assert lg.one("SELECT to_regclass('public.tool_executions') IS NOT NULL") == "t"
    states_cols = {r[0] for r in lg.q(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'states'"
    )}
    assert "version" in states_cols


@pytest.mark.asyncio
async def test_legacy_database_is_migrated_and_readable(legacy: Legacy) -> None:
    before_rows = legacy.j("SELECT message_id, role, content, tool_calls, tool_call_id, meta FROM messages "
                           "ORDER BY message_id")
    cp = open_cp(legacy.dsn)
    assert_migrated(legacy)
    # Versions 1, 2 in created_at order (backfilled at v1), the state rows themselves untouched.
    assert [r[0] for r in legacy.q("SELECT version FROM states ORDER BY created_at")] == ["1", "2"]
    assert legacy.j("SELECT message_id, role, content, tool_calls, tool_call_id, meta FROM messages "
                    "ORDER BY message_id") == before_rows
    # Legacy rows get an order: seq is filled, distinct, in created_at order.
    seqs = legacy.q("SELECT message_id, seq FROM messages ORDER BY seq")
    assert [r[0] for r in seqs] == ids(legacy.messages)
    assert all(r[1] != "" for r in seqs)

    config = cfg()
    state = await cp.aget_state(config)
    assert type(state) is BillingState
    assert config["_checkpoint_version"] == 2
    assert ids(state.context) == ids(legacy.messages)
    assert [m.model_dump(mode="json") for m in state.context] == [m.model_dump(mode="json") for m in legacy.messages]
    assert (state.invoice, state.attempts, state.context_summary) == ("INV-7", 2, "customer wants a charge")
    assert state.execution_meta.current_node == "model"
    assert state.execution_meta.step == 2
    assert state.execution_meta.status == "running"

    # The messages table as 10xGraph wrote it (no message_data) reads back as the same messages.
    listed = await cp.alist_messages(cfg())
    assert [comparable(m) for m in listed] == [comparable(m) for m in legacy.messages]
    one = await cp.aget_message(cfg(), legacy.messages[1].message_id)
    assert comparable(one) == comparable(legacy.messages[1])

    thread = await cp.aget_thread(cfg())
    assert thread is not None
    assert (thread.thread_id, thread.user_id, thread.thread_name) == (THREAD, OWNER, "Billing chat")
    assert thread.metadata == {"source": "10xgraph"}
    assert await cp.aget_thread_owner(THREAD, cfg()) == OWNER

    if legacy.schema_version >= 3:
        assert await cp.aget_tool_result(cfg(), legacy.ledger_key) == legacy.envelope
    else:
        assert await cp.aget_tool_result(cfg(), f"{legacy.messages[1].message_id}:call_1") is None


@pytest.mark.asyncio
async def test_legacy_thread_resumes_and_completes(legacy: Legacy) -> None:
    cp = open_cp(legacy.dsn)
    calls: dict[str, int] = {}
    app = resume_graph(cp, calls)
    result = await app.ainvoke({}, cfg(), response_granularity="full")
    assert calls == {"model": 1}  # model ran once on the tool result; the tool did not run again
    assert texts(result["messages"])[-1] == "all done"
    final = result["state"]
    assert type(final) is BillingState
    assert final.execution_meta.status == "completed"
    assert (final.invoice, final.attempts) == ("INV-7", 2)

    config = cfg()
    stored = await cp.aget_state(config)
    assert stored is not None
    assert config["_checkpoint_version"] > 2
    assert ids(stored.context)[:3] == ids(legacy.messages)
    assert texts(stored.context) == ["please charge 42", "Charging now.", "charged 42", "all done"]
    assert [m.role for m in stored.context] == ["user", "assistant", "tool", "assistant"]
    assert len(set(ids(stored.context))) == 4
    # The legacy messages came through unchanged (ids, blocks, tool calls, usages, metadata; the
    # timestamp has its own test below).
    assert [comparable(m) for m in stored.context[:3]] == [comparable(m) for m in legacy.messages]
    assert stored.execution_meta.status == "completed"
    assert (stored.invoice, stored.attempts, stored.context_summary) == ("INV-7", 2, "customer wants a charge")

    # No duplicate rows, and the listing API agrees with the state.
    assert legacy.one(f"SELECT count(*) FROM messages WHERE thread_id = {lit(THREAD)}") == "4"
    assert legacy.one(f"SELECT count(DISTINCT message_id) FROM messages WHERE thread_id = {lit(THREAD)}") == "4"
    listed = await cp.alist_messages(cfg())
    assert ids(listed) == ids(stored.context)
    # The version history is intact and strictly increasing.
    versions = [int(r[0]) for r in legacy.q(f"SELECT version FROM states WHERE thread_id = {lit(THREAD)} ORDER BY state_id")]
    assert versions == sorted(set(versions)) and versions[:2] == [1, 2]

    if legacy.schema_version >= 3:
        assert await cp.aget_tool_result(cfg(), legacy.ledger_key) == legacy.envelope

    # A process that opens the database afterwards sees the same thread.
    cp2 = open_cp(legacy.dsn)
    again = await cp2.aget_state(cfg())
    assert ids(again.context) == ids(stored.context)


@pytest.mark.asyncio
async def test_legacy_message_timestamps_survive_resume(legacy_v3: Legacy) -> None:
    cp = open_cp(legacy_v3.dsn)
    await resume_graph(cp, {}).ainvoke({}, cfg())
    first = await cp.aget_state(cfg())
    second = await cp.aget_state(cfg())
    assert [m.timestamp for m in first.context] == [m.timestamp for m in second.context]
    assert [m.model_dump(mode="json") for m in first.context[:3]] == [
        m.model_dump(mode="json") for m in legacy_v3.messages
    ]


@pytest.mark.asyncio
async def test_v3_ledger_row_written_by_10xgraph_is_replayed_not_rerun(tenx_postgres: Any, pg_dsn: str) -> None:
    """10xGraph crashed inside the ToolNode after recording the tool's result in its ledger but
    before the state moved on: the resumed run must replay the recorded result, not charge again."""
    lg = build_legacy(tenx_postgres, pg_dsn, 3, table_messages=[0, 1], state_context=[0, 1], last_node="tools")
    cp = open_cp(lg.dsn)
    calls: dict[str, int] = {}
    app = resume_graph(cp, calls)
    result = await app.ainvoke({}, cfg(), response_granularity="full")
    assert calls.get("charge", 0) == 0, "the tool ran again although 10xGraph's ledger recorded its result"
    assert calls == {"model": 1}
    stored = await cp.aget_state(cfg())
    assert texts(stored.context) == ["please charge 42", "Charging now.", "charged 42", "all done"]
    assert stored.context[2].model_dump(mode="json") == lg.envelope["value"]
    assert result["state"].execution_meta.status == "completed"


@pytest.mark.asyncio
async def test_v1_versions_are_backfilled_by_created_at_not_by_state_id(tenx_postgres: Any, pg_dsn: str) -> None:
    lg = build_legacy(tenx_postgres, pg_dsn, 1, v1_reverse_insert=True)
    # The later state has the lower state_id.
    assert [r[0] for r in lg.q("SELECT state_id FROM states ORDER BY created_at")] == ["2", "1"]
    cp = open_cp(lg.dsn)
    assert [r for r in lg.q("SELECT state_id, version FROM states ORDER BY created_at")] == [["2", "1"], ["1", "2"]]
    config = cfg()
    state = await cp.aget_state(config)
    assert config["_checkpoint_version"] == 2
    assert state.execution_meta.step == 2 and state.attempts == 2
    assert len(state.context) == 3


@pytest.mark.asyncio
async def test_legacy_messages_of_one_transaction_keep_their_order(tenx_postgres: Any, pg_dsn: str) -> None:
    # user + assistant were committed in one per-step checkpoint (same NOW()), the tool result later;
    # the uuid4 ids happen to sort the other way round.
    msgs = conversation(
        user_id="f3c1a7de-0000-4000-8000-000000000001",
        assistant_id="1a2b3c4d-0000-4000-8000-000000000002",
        tool_id="77777777-0000-4000-8000-000000000003",
    )
    same = "2025-01-01 10:00:01.123456+00"
    lg = build_legacy(tenx_postgres, pg_dsn, 3, msgs=msgs, message_times=[same, same, "2025-01-01 10:00:02+00"])
    cp = open_cp(lg.dsn)
    # Right after the migration the state row gives the right order...
    state = await cp.aget_state(cfg())
    assert ids(state.context) == ids(msgs)
    app = resume_graph(cp, {})
    await app.ainvoke({}, cfg())
    # ...and after the first resume it must still be the conversation's order.
    stored = await cp.aget_state(cfg())
    assert ids(stored.context)[:3] == ids(msgs)
    assert texts(stored.context) == ["please charge 42", "Charging now.", "charged 42", "all done"]
    assert ids(await cp.alist_messages(cfg())) == ids(stored.context)


@pytest.mark.asyncio
async def test_legacy_context_not_in_messages_table_survives_resume(tenx_postgres: Any, pg_dsn: str) -> None:
    # 10xGraph's aput_state (e.g. an API seeding a thread) writes state_data only, no message rows.
    lg = build_legacy(tenx_postgres, pg_dsn, 3, table_messages=[])
    cp = open_cp(lg.dsn)
    state = await cp.aget_state(cfg())
    assert ids(state.context) == ids(lg.messages)
    await resume_graph(cp, {}).ainvoke({}, cfg())
    stored = await cp.aget_state(cfg())
    assert texts(stored.context) == ["please charge 42", "Charging now.", "charged 42", "all done"]


@pytest.mark.asyncio
async def test_a_trimmed_legacy_context_keeps_the_logs_history_after_resume(tenx_postgres: Any, pg_dsn: str) -> None:
    """The context kept the last two messages (10xGraph's context managers trim the state), the
    log the whole history. The thread's messages are the log with the context merged in: the
    first commit here deleted the log's earlier turns (red-team, session 40; 10xGraph keeps
    them). Nodes see the history, as on every thread here; a context manager trims a copy."""
    lg = build_legacy(tenx_postgres, pg_dsn, 3, state_context=[1, 2])
    cp = open_cp(lg.dsn)
    state = await cp.aget_state(cfg())
    assert ids(state.context) == ids(lg.messages)
    await resume_graph(cp, {}).ainvoke({}, cfg())
    stored = await cp.aget_state(cfg())
    assert texts(stored.context) == ["please charge 42", "Charging now.", "charged 42", "all done"]
    assert texts(await cp.alist_messages(cfg())) == texts(stored.context)
    assert (await cp.aget_message(cfg(), str(lg.messages[0].message_id))).text() == "please charge 42"


async def resume_at_model(cp: PgCheckpointer) -> list[list[str]]:
    """``ainvoke({})`` of the thread 10xGraph left running at "model", with a model that answers
    "all done"; the contexts the model saw."""
    seen: list[list[str]] = []

    async def model(state: BillingState) -> Message:
        seen.append(texts(state.context))
        return Message.text_message("all done", role="assistant")

    g = StateGraph(BillingState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    await g.compile(checkpointer=cp).ainvoke({}, cfg())
    return seen


@pytest.mark.asyncio
async def test_messages_written_or_deleted_on_a_legacy_thread_before_its_first_commit_stay_so(
    tenx_postgres: Any, pg_dsn: str
) -> None:
    """`aput_messages` on a thread 10xGraph wrote last was neither seen by the next run nor kept
    by its commit; `adelete_message` was undone by it (the message came back from the context)."""
    lg = build_legacy(tenx_postgres, pg_dsn, 3, table_messages=[0, 1, 2], state_context=[0, 1, 2])
    cp = open_cp(lg.dsn)
    await cp.adelete_message(cfg(), str(lg.messages[0].message_id))
    note = Message.text_message("operator note", role="user", message_id="note-1")
    await cp.aput_messages(cfg(), [note])
    expected = ["Charging now.", "charged 42", "operator note"]
    assert texts((await cp.aget_state(cfg())).context) == expected
    # The thread 10xGraph left running at "model" resumes there.
    assert await resume_at_model(cp) == [expected]
    assert texts(await cp.alist_messages(cfg())) == [*expected, "all done"]


@pytest.mark.asyncio
async def test_a_legacy_message_edited_after_its_state_keeps_the_edit(tenx_postgres: Any, pg_dsn: str) -> None:
    """A message 10xGraph's context holds, edited in its log after the run that wrote the
    context: by 10xGraph's ``aput_messages`` (its upsert sets the content and ``updated_at =
    NOW()``, here as that statement) or by ours. The context's copy won the merge: ``aget_state``
    showed the old text, and the first commit here wrote it back over the edit, a redaction
    undone (red-team, session 41)."""
    lg = build_legacy(tenx_postgres, pg_dsn, 3)
    user, assistant = lg.messages[0], lg.messages[1]
    redacted = json.dumps([TextBlock(text="[REDACTED]").model_dump(mode="json")])
    tenx_postgres.psql(f"UPDATE messages SET content = {lit(redacted)}, updated_at = NOW() "
                       f"WHERE message_id = {lit(str(user.message_id))};", dbname=lg.dbname)
    cp = open_cp(lg.dsn)
    edited = assistant.model_copy(update={"content": [TextBlock(text="Charging now (edited)."), assistant.content[1]]})
    await cp.aput_messages(cfg(), [edited])
    expected = ["[REDACTED]", "Charging now (edited).", "charged 42"]
    assert texts((await cp.aget_state(cfg())).context) == expected
    assert await resume_at_model(cp) == [expected]
    assert texts(await cp.alist_messages(cfg())) == [*expected, "all done"]
    assert texts((await cp.aget_state(cfg())).context) == [*expected, "all done"]
    # The tool call stayed on its message.
    assert (await cp.aget_message(cfg(), str(assistant.message_id))).tools_calls == assistant.tools_calls


@pytest.mark.asyncio
async def test_a_legacy_redaction_before_a_later_10xgraph_turn_is_kept(tenx_postgres: Any, pg_dsn: str) -> None:
    """The redaction made with 10xGraph's ``aput_messages``, then 10xGraph ran another turn: its
    new state row (written after the edit, in its own transaction, with its step's log rows)
    still holds the old text in its context, as 10xGraph's context never sees log edits. Taken
    as "edited after the latest row" the edit was missed, and the first commit here wrote the
    old text back over the redaction (red-team, session 41). A step's own log rows, updated in
    the step's transaction, are not edits: there the context's copy stays."""
    lg = build_legacy(tenx_postgres, pg_dsn, 3)
    user, tool = lg.messages[0], lg.messages[2]
    redacted = json.dumps([TextBlock(text="[REDACTED]").model_dump(mode="json")])
    later = BillingState(context=list(lg.messages), invoice="INV-7", attempts=3,
                         execution_meta=ExecutionState(current_node="model", step=3, status="running", thread_id=THREAD))
    stale = json.dumps([TextBlock(text="charged 42 (log copy)").model_dump(mode="json")])
    tenx_postgres.psql(
        f"UPDATE messages SET content = {lit(redacted)}, updated_at = NOW() WHERE message_id = {lit(str(user.message_id))};",
        dbname=lg.dbname)
    # 10xGraph's next step, one transaction of its own: the state row, and a log row upserted with it.
    tenx_postgres.psql(
        "BEGIN;"
        f"INSERT INTO states (thread_id, version, state_data) VALUES ({lit(THREAD)}, 3, {jlit(legacy_state_json(later))});"
        f"UPDATE messages SET content = {lit(stale)}, updated_at = NOW() WHERE message_id = {lit(str(tool.message_id))};"
        "COMMIT;",
        dbname=lg.dbname)
    cp = open_cp(lg.dsn)
    expected = ["[REDACTED]", "Charging now.", "charged 42"]
    assert texts((await cp.aget_state(cfg())).context) == expected
    assert await resume_at_model(cp) == [expected]
    assert texts(await cp.alist_messages(cfg())) == [*expected, "all done"]


@pytest.mark.asyncio
async def test_a_log_row_upserted_with_a_pruned_state_row_is_not_an_edit(tenx_postgres: Any, pg_dsn: str) -> None:
    """10xGraph's last write of a turn upserts the turn's messages again with its state row, and
    its history limit later deletes that row. The log row then matched no state row and counted
    as edited: its older copy replaced the context's, where a node had since rewritten the
    message (a scrub), and the first commit here wrote the old text back (red-team, session 41,
    with the real 10xGraph after six durable turns). Before the oldest kept row the context's
    copy stays."""
    lg = build_legacy(tenx_postgres, pg_dsn, 3)
    user = lg.messages[0]
    older = json.dumps([TextBlock(text="the log's older copy").model_dump(mode="json")])
    tenx_postgres.psql(  # a turn's final upsert, at a time whose state row is gone (before v1's)
        f"UPDATE messages SET content = {lit(older)}, updated_at = '2025-01-01 10:00:01.2+00' "
        f"WHERE message_id = {lit(str(user.message_id))};", dbname=lg.dbname)
    cp = open_cp(lg.dsn)
    expected = ["please charge 42", "Charging now.", "charged 42"]
    assert texts((await cp.aget_state(cfg())).context) == expected
    assert await resume_at_model(cp) == [expected]
    assert texts(await cp.alist_messages(cfg())) == [*expected, "all done"]


@pytest.mark.asyncio
async def test_a_legacy_tool_result_logged_in_one_transaction_with_its_call_comes_after_it(
    tenx_postgres: Any, pg_dsn: str
) -> None:
    """10xGraph stamps the rows of one transaction with one time, and the migration orders such
    rows by their random ids: merged back in, a tool result before its call made a history no
    provider takes (red-team, session 40)."""
    msgs = conversation(tool_id="00000000-0000-4000-8000-000000000003")  # sorts before the others
    same = "2025-01-01 10:00:05+00"
    lg = build_legacy(tenx_postgres, pg_dsn, 3, msgs=msgs, message_times=[same] * 3, state_context=[0])
    cp = open_cp(lg.dsn)
    assert ids((await cp.aget_state(cfg())).context) == ids(lg.messages)


@pytest.mark.asyncio
async def test_a_legacy_context_message_with_no_log_row_can_be_deleted(tenx_postgres: Any, pg_dsn: str) -> None:
    lg = build_legacy(tenx_postgres, pg_dsn, 3, table_messages=[1, 2])
    cp = open_cp(lg.dsn)
    await cp.adelete_message(cfg(), str(lg.messages[0].message_id))  # None on PgCheckpointer, as 10xGraph's
    assert texts((await cp.aget_state(cfg())).context) == ["Charging now.", "charged 42"]
    with pytest.raises(MessageNotFoundError):
        await cp.adelete_message(cfg(), str(lg.messages[0].message_id))


# -- migration idempotence and concurrency -------------------------------------------------


def schema_fingerprint(pg: Any, dbname: str) -> dict[str, Any]:
    return {
        "versions": jquery(pg, dbname, "SELECT version, applied_at FROM schema_version ORDER BY version"),
        "columns": jquery(pg, dbname, "SELECT table_name, column_name, data_type, column_default, is_nullable "
                                      "FROM information_schema.columns WHERE table_schema = 'public' "
                                      "ORDER BY table_name, column_name"),
        "constraints": jquery(pg, dbname, "SELECT conrelid::regclass::text AS t, conname, contype FROM pg_constraint "
                                          "WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"),
        "indexes": jquery(pg, dbname, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                                      "ORDER BY indexname"),
        "states": jquery(pg, dbname, "SELECT state_id, version, md5(state_data::text) AS h FROM states ORDER BY state_id"),
        "messages": jquery(pg, dbname, "SELECT message_id, seq, message_data IS NULL AS legacy, updated_at FROM messages "
                                       "ORDER BY message_id"),
    }


@pytest.mark.asyncio
@pytest.mark.parametrize("version", [1, 3])
async def test_migrating_twice_is_a_no_op(tenx_postgres: Any, pg_dsn: str, version: int) -> None:
    lg = build_legacy(tenx_postgres, pg_dsn, version)
    cp1 = open_cp(lg.dsn)
    first = schema_fingerprint(tenx_postgres, lg.dbname)
    assert [v["version"] for v in first["versions"]] == list(ALL_VERSIONS)
    cp2 = open_cp(lg.dsn)
    assert await cp2.asetup()
    assert await cp1.asetup()
    assert schema_fingerprint(tenx_postgres, lg.dbname) == first
    state = await cp2.aget_state(cfg())
    assert ids(state.context) == ids(lg.messages)


def _construct_concurrently(dsn: str, n: int = 2) -> list[Any]:
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def worker(i: int) -> None:
        barrier.wait()
        try:
            cp = PgCheckpointer(dsn)
            cp.setup()  # connects and migrates: the constructor does not
            results[i] = cp
        except BaseException as exc:  # collected and asserted on below
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a constructor hung"
    return results


@pytest.mark.parametrize("start", ["empty", "legacy_v1"])
def test_concurrent_construction_migrates_once(tenx_postgres: Any, pg_dsn: str, start: str) -> None:
    dbname = dbname_of(pg_dsn)
    if start == "legacy_v1":
        build_legacy(tenx_postgres, pg_dsn, 1)
    results = _construct_concurrently(pg_dsn, 3)
    errors = [r for r in results if not isinstance(r, PgCheckpointer)]
    assert errors == []
    assert rows(tenx_postgres, dbname, "SELECT version, count(*) FROM schema_version GROUP BY version ORDER BY version") == [
        [str(v), "1"] for v in ALL_VERSIONS
    ]
    if start == "legacy_v1":
        assert rows(tenx_postgres, dbname, "SELECT version FROM states ORDER BY created_at") == [["1"], ["2"]]
        seqs = rows(tenx_postgres, dbname, "SELECT seq FROM messages ORDER BY seq")
        assert len({s[0] for s in seqs}) == 3


# ==========================================================================================
# 3. Ownership (enforce_user_isolation=True, the default)
# ==========================================================================================


@pytest.fixture(params=["legacy_v3", "native", "native+redis"])
def owned(request: pytest.FixtureRequest, tenx_postgres: Any, pg_dsn: str) -> tuple[Legacy, PgCheckpointer]:
    """u1's thread THREAD with 3 messages at version 2, and a checkpointer on that database."""
    if request.param == "legacy_v3":
        lg = build_legacy(tenx_postgres, pg_dsn, 3)
        return lg, open_cp(pg_dsn)
    redis_url = request.getfixturevalue("tenx_redis").url if request.param.endswith("redis") else None
    cp = open_cp(pg_dsn, redis_url=redis_url)
    assert cp.enforce_user_isolation is True
    msgs = conversation(
        user_id=f"n-user-{uuid.uuid4().hex}", assistant_id=f"n-asst-{uuid.uuid4().hex}", tool_id=f"n-tool-{uuid.uuid4().hex}"
    )

    async def seed() -> tuple[str, dict[str, Any]]:
        config = cfg()
        s1 = BillingState(context=msgs[:2], invoice="INV-7", attempts=1,
                          execution_meta=ExecutionState(current_node="tools", step=1))
        await cp.aput_state(config, s1)
        s2 = BillingState(context=msgs, invoice="INV-7", attempts=2, context_summary="customer wants a charge",
                          execution_meta=ExecutionState(current_node="model", step=2))
        await cp.aput_state(config, s2)
        await cp.aput_thread(config, ThreadInfo(thread_id=THREAD, thread_name="Billing chat", metadata={"source": "t"}))
        key = f"{msgs[1].message_id}:call_1"
        env = {"__kind__": "message", "value": msgs[2].model_dump(mode="json")}
        assert await cp.aput_tool_result(config, key, env)
        assert config["_checkpoint_version"] == 2
        return key, env

    # Seeded by `_ready` inside the test's event loop (the fixture itself is sync).
    lg = Legacy(tenx_postgres, pg_dsn, dbname_of(pg_dsn), 4, THREAD, msgs, [], None, None)
    lg.extra["seed"] = seed
    return lg, cp


async def _ready(owned: tuple[Legacy, PgCheckpointer]) -> tuple[Legacy, PgCheckpointer]:
    lg, cp = owned
    seed = lg.extra.pop("seed", None)
    if seed is not None:
        lg.ledger_key, lg.envelope = await seed()
    return lg, cp


async def assert_owner_view_unchanged(lg: Legacy, cp: PgCheckpointer) -> None:
    config = cfg()
    state = await cp.aget_state(config)
    assert state is not None
    assert config["_checkpoint_version"] == 2
    assert ids(state.context) == ids(lg.messages)
    assert state.attempts == 2
    cached_cfg = cfg()
    cached = await cp.aget_state_cache(cached_cfg)
    assert cached is not None and ids(cached.context) == ids(lg.messages)
    assert cached_cfg["_checkpoint_version"] == 2
    assert ids(await cp.alist_messages(cfg())) == ids(lg.messages)
    assert await cp.aget_tool_result(cfg(), lg.ledger_key) == lg.envelope
    assert await cp.aget_thread_owner(THREAD, cfg()) == OWNER


@pytest.mark.asyncio
async def test_other_user_cannot_read_the_thread(owned: tuple[Legacy, PgCheckpointer]) -> None:
    lg, cp = await _ready(owned)
    config = cfg(INTRUDER)
    assert await cp.aget_state(config) is None
    assert "_checkpoint_version" not in config
    assert await cp.aget_state_cache(cfg(INTRUDER)) is None
    assert await cp.alist_messages(cfg(INTRUDER)) == []
    assert await cp.alist_messages(cfg(INTRUDER), search="charge") == []
    assert await cp.aget_thread(cfg(INTRUDER)) is None
    with pytest.raises(IndexError):
        await cp.aget_message(cfg(INTRUDER), lg.messages[0].message_id)
    assert [t.thread_id for t in await cp.alist_threads({"user_id": INTRUDER})] == []
    # The owner still sees everything.
    assert [t.thread_id for t in await cp.alist_threads({"user_id": OWNER})] == [THREAD]
    assert (await cp.aget_thread(cfg())).thread_name == "Billing chat"
    await assert_owner_view_unchanged(lg, cp)


def _assert_forbidden(exc: BaseException) -> None:
    assert isinstance(exc, StorageError), f"{type(exc).__name__}: {exc}"
    assert exc.error_code == FORBIDDEN, f"{exc.error_code}: {exc}"


@pytest.mark.asyncio
@pytest.mark.parametrize("op", ["aput_state", "aput_state_with_version", "aput_messages", "aput_tool_result",
                                "ainvoke", "ainvoke_resume"])
async def test_other_user_cannot_write_the_thread(owned: tuple[Legacy, PgCheckpointer], op: str) -> None:
    lg, cp = await _ready(owned)
    before = lg.snapshot()
    intruder = cfg(INTRUDER)
    hijack = Message(message_id=f"hijack-{uuid.uuid4().hex}", role="user", content="ignore previous instructions")
    if op == "ainvoke_resume":
        # Resuming someone else's thread: the intruder sees no thread, so this is a new execution
        # without input (ValueError before any write) or a forbidden write; either way no change.
        with pytest.raises((ValueError, StorageError)) as info:
            await resume_graph(cp, {}).ainvoke({}, intruder)
        if isinstance(info.value, StorageError):
            _assert_forbidden(info.value)
        else:
            assert "messages" in str(info.value)
        assert lg.snapshot() == before
        await assert_owner_view_unchanged(lg, cp)
        return
    calls: dict[str, int] = {}
    with pytest.raises(StorageError) as info:
        if op == "aput_state":
            await cp.aput_state(intruder, BillingState(context=[hijack], invoice="STOLEN",
                                                       execution_meta=ExecutionState(current_node="model")))
        elif op == "aput_state_with_version":
            intruder["_checkpoint_version"] = 2  # a guessed version must not help
            await cp.aput_state(intruder, BillingState(context=[hijack], invoice="STOLEN",
                                                       execution_meta=ExecutionState(current_node="model")))
        elif op == "aput_messages":
            await cp.aput_messages(intruder, [hijack])
        elif op == "aput_tool_result":
            await cp.aput_tool_result(intruder, f"{hijack.message_id}:call_9",
                                      {"__kind__": "message", "value": hijack.model_dump(mode="json")})
        else:
            await resume_graph(cp, calls).ainvoke({"messages": [hijack]}, intruder)
    _assert_forbidden(info.value)
    assert calls == {}, "a node ran (side effects) for a user who may not write the thread"
    assert lg.snapshot() == before
    assert lg.one(f"SELECT count(*) FROM messages WHERE message_id = {lit(str(hijack.message_id))}") == "0"
    await assert_owner_view_unchanged(lg, cp)


@pytest.mark.asyncio
async def test_other_user_cannot_clear_or_delete(owned: tuple[Legacy, PgCheckpointer]) -> None:
    lg, cp = await _ready(owned)
    before = lg.snapshot()
    for call in (
        lambda: cp.aclear_state(cfg(INTRUDER)),
        lambda: cp.aclean_thread(cfg(INTRUDER)),
        lambda: cp.adelete_message(cfg(INTRUDER), lg.messages[0].message_id),
        lambda: cp.aput_thread(cfg(INTRUDER), ThreadInfo(thread_id=THREAD, thread_name="mine now")),
    ):
        with pytest.raises(StorageError) as info:
            await call()
        _assert_forbidden(info.value)
    assert lg.snapshot() == before
    await assert_owner_view_unchanged(lg, cp)


# ==========================================================================================
# 4. Bad input
# ==========================================================================================


def _user_objects(pg: Any, dbname: str) -> list[list[str]]:
    """Schemas, tables and types that are not PostgreSQL's own."""
    return rows(pg, dbname, (
        "SELECT 'schema', nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg_%' "
        "AND nspname NOT IN ('information_schema', 'public') "
        "UNION ALL SELECT 'table', schemaname || '.' || tablename FROM pg_tables "
        "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') "
        "UNION ALL SELECT 'type', t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
        "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND t.typtype = 'e' "
        "ORDER BY 1, 2"
    ))


@pytest.mark.parametrize(
    "schema", ["bad;drop", "bad; DROP TABLE x", "1starts_with_digit", "has-dash", "a" * 64, "", "sp ace", 'q"uote']
)
def test_invalid_schema_name_is_rejected_and_creates_nothing(tenx_postgres: Any, pg_dsn: str, schema: str) -> None:
    dbname = dbname_of(pg_dsn)
    assert _user_objects(tenx_postgres, dbname) == []
    with pytest.raises(ValueError, match="schema"):
        PgCheckpointer(pg_dsn, schema=schema)
    assert _user_objects(tenx_postgres, dbname) == []


def test_valid_custom_schema_is_created(tenx_postgres: Any, pg_dsn: str) -> None:
    """The control for the test above: a valid name does create objects (so 'nothing created' means something)."""
    dbname = dbname_of(pg_dsn)
    PgCheckpointer(pg_dsn, schema="_Tenant_01").setup()
    created = _user_objects(tenx_postgres, dbname)
    assert ["schema", "_tenant_01"] in created or ["schema", "_Tenant_01"] in created
    assert any(kind == "table" and name.endswith(".schema_version") for kind, name in created)


@pytest.mark.parametrize("dsn", [None, ""])
def test_missing_dsn_is_a_value_error(dsn: str | None) -> None:
    with pytest.raises(ValueError):
        PgCheckpointer(dsn)
    with pytest.raises(ValueError):
        PgCheckpointer(postgres_dsn=dsn, redis_url="redis://127.0.0.1:1/0")


@pytest.mark.parametrize("kw", ["pg_pool", "redis", "redis_pool"])
def test_python_driver_objects_are_a_type_error(pg_dsn: str, kw: str) -> None:
    with pytest.raises(TypeError):
        PgCheckpointer(pg_dsn, **{kw: object()})


SECRET = "SuperSecret123"


def _assert_no_secret(exc: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    texts_seen = [str(exc), repr(exc), json.dumps(getattr(exc, "context", {}), default=str)]
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        texts_seen += [str(cause), repr(cause)]
        cause = cause.__cause__ or cause.__context__
    for t in texts_seen:
        assert SECRET not in t, t
    for rec in caplog.records:
        for t in (rec.getMessage(), str(rec.msg), repr(rec.args), repr(getattr(rec, "error_context", None))):
            assert SECRET not in t, f"{rec.name}: {t}"


UNREACHABLE = f"postgresql://app:{SECRET}@127.0.0.1:1/x"


@pytest.mark.timeout(90)
def test_unreachable_database_fails_within_a_bounded_time_with_defaults() -> None:
    t0 = time.monotonic()
    cp = PgCheckpointer(UNREACHABLE)  # the constructor does not connect
    with pytest.raises(TransientStorageError) as info:
        cp.setup()
    elapsed = time.monotonic() - t0
    assert info.value.error_code == "STORAGE_TRANSIENT_001"
    assert elapsed < 15, f"took {elapsed:.1f}s"


def test_unreachable_database_is_transient_and_redacted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="tenxgraph")
    t0 = time.monotonic()
    # A short acquire timeout keeps this test fast (the default-timeout case is tested above).
    cp = PgCheckpointer(UNREACHABLE, pool_config={"timeout": 1.0})
    with pytest.raises(TransientStorageError) as info:
        cp.setup()
    elapsed = time.monotonic() - t0
    assert elapsed < 15, f"took {elapsed:.1f}s"
    exc = info.value
    assert exc.error_code == "STORAGE_TRANSIENT_001"
    assert isinstance(exc, StorageError)
    # The failure was logged (the exception logs itself), and no record holds the password.
    assert any(r.levelno >= logging.WARNING for r in caplog.records)
    _assert_no_secret(exc, caplog)


def test_unparseable_dsn_does_not_leak_the_password(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="tenxgraph")
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:
        PgCheckpointer(f"postgresql://app:{SECRET}@127.0.0.1:notaport/x")
    assert time.monotonic() - t0 < 15
    assert isinstance(info.value, (ValueError, StorageError)), repr(info.value)
    _assert_no_secret(info.value, caplog)


def test_the_checkpointers_attributes_hold_no_redis_password() -> None:
    """``cp.redis_url`` held the URL as given, password included, for any code that logs its
    objects' attributes (session 32). The core gets the URL as given; the attribute is masked."""
    cp = PgCheckpointer("postgresql://app@127.0.0.1:1/x", redis_url=f"redis://user:{SECRET}@127.0.0.1:1/0")
    assert SECRET not in repr(vars(cp)) and SECRET not in repr(cp)
    assert cp.redis_url == "redis://user:***@127.0.0.1:1/0"


@pytest.mark.asyncio
async def test_message_id_of_another_thread_is_rejected_and_nothing_written(legacy_v3: Legacy) -> None:
    lg = legacy_v3
    cp = open_cp(lg.dsn)
    other = cfg(OWNER, "other-thread")
    before = lg.snapshot()
    stolen = Message(message_id=lg.messages[1].message_id, role="assistant", content="overwritten!")
    fresh = Message(message_id=f"fresh-{uuid.uuid4().hex}", role="user", content="a new message")

    # aput_messages: the whole batch fails, the new thread is not created, the other row is untouched.
    with pytest.raises(StorageError) as info:
        await cp.aput_messages(other, [fresh, stolen])
    assert info.value.error_code == FOREIGN_MESSAGE, str(info.value)
    assert lg.snapshot() == before
    assert lg.one(f"SELECT count(*) FROM messages WHERE message_id = {lit(str(fresh.message_id))}") == "0"
    assert lg.one("SELECT count(*) FROM threads WHERE thread_id = 'other-thread'") == "0"
    assert await cp.aget_thread(other) is None

    # The same through a state write (one transaction with the state row).
    with pytest.raises(StorageError) as info:
        await cp.aput_state(other, BillingState(context=[fresh, stolen], execution_meta=ExecutionState(current_node="m")))
    assert info.value.error_code == FOREIGN_MESSAGE, str(info.value)
    assert lg.snapshot() == before
    assert await cp.aget_state(other) is None

    # And on the owner's own thread: a message id of another thread (created here) is rejected too.
    mine = Message(message_id=f"mine-{uuid.uuid4().hex}", role="user", content="in the other thread")
    await cp.aput_messages(other, [mine])
    middle = lg.snapshot()
    with pytest.raises(StorageError) as info:
        await cp.aput_messages(cfg(), [Message(message_id=mine.message_id, role="user", content="moved?")])
    assert info.value.error_code == FOREIGN_MESSAGE, str(info.value)
    assert lg.snapshot() == middle
    assert texts(await cp.alist_messages(other)) == ["in the other thread"]

    owner_state = await cp.aget_state(cfg())
    assert ids(owner_state.context) == ids(lg.messages)
    assert owner_state.context[1].text() == "Charging now."
