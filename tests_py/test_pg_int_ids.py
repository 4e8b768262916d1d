"""PgCheckpointer(id_type="int" | "bigint", user_id_type=...): 10xGraph 0.10's integer-id schemas.

What is pinned here: a new integer schema is the one the real 10xGraph creates (column types,
sequences as defaults); a database the real 10xGraph wrote with bigint ids opens, upgrades in place
and resumes; a checkpointer with other id types than its database is refused and changes nothing;
every crafted id is a typed error (``InvalidConfigError`` ``STORAGE_CONFIG_002``) with nothing
written; ids read back are ints; user isolation, the authz owner scope, stop requests, leases and
the tool ledger across a SIGKILL hold on integer ids; and the same graph on both libraries gives the
same messages, state and ``ThreadInfo``.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import uuid
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import InvalidConfigError, StorageError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.storage.checkpointer.pg_checkpointer import CURRENT_SCHEMA_VERSION
from tenxgraph.utils.id_generator import BigIntIDGenerator

# 10xGraph's own tables: what an integer schema must have exactly as 10xGraph creates them.
TENX_TABLES = ("threads", "states", "messages", "tool_executions", "schema_version")


def dbname_of(dsn: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(dsn).path.lstrip("/"))


def sql(pg: Any, dsn: str, query: str) -> str:
    return pg.psql(query, dbname=dbname_of(dsn)).strip()


def msg(mid: int | str, role: str, text: str) -> Message:
    return Message(message_id=mid, role=role, content=[TextBlock(text=text)])


def columns(pg: Any, dsn: str, schema: str) -> set[tuple[str, ...]]:
    """(table, column, type, default) of 10xGraph's tables, defaults without the schema prefix."""
    tables = ", ".join(f"'{t}'" for t in TENX_TABLES)
    out = sql(pg, dsn, (
        "SELECT table_name || '|' || column_name || '|' || data_type || '|' || "
        f"replace(coalesce(column_default, ''), '{schema}.', '') FROM information_schema.columns "
        f"WHERE table_schema = '{schema}' AND table_name IN ({tables})"
    ))
    return {tuple(line.split("|")) for line in out.splitlines()}


def sequences(pg: Any, dsn: str, schema: str) -> set[tuple[str, str]]:
    out = sql(pg, dsn, f"SELECT sequencename || '|' || data_type FROM pg_sequences WHERE schemaname = '{schema}'")
    return {tuple(line.split("|")) for line in out.splitlines()}  # type: ignore[misc]


def row_counts(pg: Any, dsn: str, schema: str = "public") -> dict[str, str]:
    return {t: sql(pg, dsn, f'SELECT count(*) FROM "{schema}".{t}')
            for t in ("threads", "states", "messages", "tool_executions", "tenx_leases")}


def echo_graph(cp: PgCheckpointer, **graph_kw: Any):
    """One node answering each user message with a message of id 9000 + len(context)."""

    def model(state: AgentState) -> list[Message]:
        return [msg(9000 + len(state.context), "assistant", f"reply to {state.context[-1].text()}")]

    g = StateGraph(AgentState, **graph_kw)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=cp)


# -- the schema: as 10xGraph creates it, and a 10xGraph database upgraded in place ------------------

CREATE = """
import asyncio, os
import asyncpg
from tenxgraph.storage.checkpointer import PgCheckpointer

async def main():
    c = await asyncpg.connect(os.environ["TENX_DSN"])
    await c.execute("CREATE SCHEMA IF NOT EXISTS theirs")
    await c.close()
    cp = PgCheckpointer(postgres_dsn=os.environ["TENX_DSN"], redis_url=os.environ["TENX_REDIS"], schema="theirs",
                        id_type=os.environ["ID_TYPE"], user_id_type=os.environ["USER_ID_TYPE"])
    emit(await cp.asetup())

asyncio.run(main())
"""


@pytest.mark.parametrize(("id_type", "user_id_type"), [("bigint", "string"), ("int", "int"), ("string", "bigint")])
@pytest.mark.asyncio
async def test_new_integer_schema_is_the_one_10xgraph_creates(
    oracle: Any, tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, id_type: str, user_id_type: str
) -> None:
    env = {"TENX_DSN": pg_dsn, "TENX_REDIS": tenx_redis.url, "ID_TYPE": id_type, "USER_ID_TYPE": user_id_type}
    assert oracle.run_theirs(CREATE, env=env) is True
    cp = PgCheckpointer(pg_dsn, schema="ours", id_type=id_type, user_id_type=user_id_type)
    assert await cp.asetup() is True
    await cp.arelease()
    theirs, ours = columns(tenx_postgres, pg_dsn, "theirs"), columns(tenx_postgres, pg_dsn, "ours")
    assert theirs, "10xGraph created no tables"
    # Every column of 10xGraph's tables, with its type and default (the SERIAL / BIGSERIAL
    # sequences), exists as is; ours adds columns and tables of its own.
    assert theirs - ours == set(), sorted(theirs - ours)
    assert sequences(tenx_postgres, pg_dsn, "theirs") <= sequences(tenx_postgres, pg_dsn, "ours")
    expected = {"string": "character varying", "int": "integer", "bigint": "bigint"}
    assert ("threads", "thread_id", expected[id_type]) in {c[:3] for c in ours}
    assert ("messages", "message_id", expected[id_type]) in {c[:3] for c in ours}
    assert ("threads", "user_id", expected[user_id_type]) in {c[:3] for c in ours}


WRITE_10XGRAPH = """
import asyncio, os
import asyncpg
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils import END

def msg(mid, role, text):
    return Message(message_id=mid, role=role, content=[TextBlock(text=text)])

async def main():
    # The public schema: 10xGraph creates its message_role type there whatever its schema=.
    cp = PgCheckpointer(postgres_dsn=os.environ["TENX_DSN"], redis_url=os.environ["TENX_REDIS"], id_type="bigint")
    await cp.asetup()
    def model(state: AgentState):
        return [msg(9000 + len(state.context), "assistant", f"reply to {state.context[-1].text()}")]
    g = StateGraph()
    g.add_node("model", model); g.set_entry_point("model"); g.add_edge("model", END)
    app = g.compile(checkpointer=cp)
    # 10xGraph needs the thread id as a string (its ExecutionState.thread_id is a str); its
    # PgCheckpointer turns it into the int the column holds.
    r = await app.ainvoke({"messages": [msg(101, "user", "hello")]}, config={"thread_id": os.environ["THREAD"], "user_id": "alice"})
    emit([(m.message_id, m.text()) for m in r["messages"]])

asyncio.run(main())
"""


def write_with_10xgraph(oracle: Any, pg_dsn: str, redis_url: str) -> str:
    thread = str(int(uuid.uuid4().int >> 72))  # fresh: 10xGraph's Redis state cache is keyed by thread only
    written = oracle.run_theirs(WRITE_10XGRAPH, env={"TENX_DSN": pg_dsn, "TENX_REDIS": redis_url, "THREAD": thread})
    assert written == [[101, "hello"], [9001, "reply to hello"]]
    return thread


@pytest.mark.asyncio
async def test_bigint_database_10xgraph_wrote_upgrades_in_place_and_resumes(
    oracle: Any, tenx_postgres: Any, pg_dsn: str, tenx_redis: Any
) -> None:
    thread = write_with_10xgraph(oracle, pg_dsn, tenx_redis.url)
    assert sql(tenx_postgres, pg_dsn, "SELECT max(version) FROM public.schema_version") == "3"
    before = columns(tenx_postgres, pg_dsn, "public")

    cp = PgCheckpointer(pg_dsn, id_type="bigint")
    assert await cp.asetup() is True
    assert sql(tenx_postgres, pg_dsn, "SELECT max(version) FROM public.schema_version") == str(CURRENT_SCHEMA_VERSION)
    assert before <= columns(tenx_postgres, pg_dsn, "public")  # 10xGraph's columns kept, types and all
    cfg = {"thread_id": int(thread), "user_id": "alice"}
    state = await cp.aget_state(cfg)
    assert state is not None
    assert [(m.message_id, m.text()) for m in state.context] == [(101, "hello"), (9001, "reply to hello")]
    info = await cp.aget_thread(cfg)
    assert info is not None and info.thread_id == int(thread) and info.user_id == "alice"

    result = await echo_graph(cp).ainvoke({"messages": [msg(102, "user", "again")]}, dict(cfg))
    assert [(m.message_id, m.text()) for m in result["messages"]] == [(102, "again"), (9003, "reply to again")]
    state = await cp.aget_state(cfg)
    assert [m.message_id for m in state.context] == [101, 9001, 102, 9003]
    listed = await cp.alist_messages(cfg)
    assert [m.message_id for m in listed] == [101, 9001, 102, 9003]
    assert sql(tenx_postgres, pg_dsn, f"SELECT string_agg(message_id::text, ',' ORDER BY message_id) "
                                      f"FROM public.messages WHERE thread_id = {thread}") == "101,102,9001,9003"
    await cp.arelease()


@pytest.mark.asyncio
async def test_other_id_types_than_the_database_are_refused_and_change_nothing(
    oracle: Any, tenx_postgres: Any, pg_dsn: str, tenx_redis: Any
) -> None:
    thread = write_with_10xgraph(oracle, pg_dsn, tenx_redis.url)
    for kw in ({}, {"id_type": "int"}, {"user_id_type": "bigint"}):
        cp = PgCheckpointer(pg_dsn, **kw)
        with pytest.raises(ValueError, match="id_type=\"bigint\"") as err:
            await cp.asetup()
        assert "created with" in str(err.value)
        # Not migrated: the upgrade is one transaction and the check comes first.
        assert sql(tenx_postgres, pg_dsn, "SELECT max(version) FROM public.schema_version") == "3"
        await cp.arelease()
    # A schema of its own in the same database gets the types it is asked for.
    other = PgCheckpointer(pg_dsn, schema="fresh")
    await echo_graph(other).ainvoke({"messages": [msg("u-1", "user", "hi")]}, {"thread_id": "t-1"})
    await other.arelease()
    assert sql(tenx_postgres, pg_dsn, f"SELECT count(*) FROM public.messages WHERE thread_id = {thread}") == "2"


# -- bad ids: a typed error, nothing written -----------------------------------------------------

CRAFTED_THREADS = [
    pytest.param("abc", id="string-on-int"),
    pytest.param(True, id="bool"),
    pytest.param(1.5, id="float"),
    pytest.param(2.0, id="integral-float"),
    pytest.param(-3, id="negative"),
    pytest.param(0, id="zero"),
    pytest.param(2**63, id="beyond-bigint"),
    pytest.param("1:2", id="colon"),
    pytest.param("007", id="leading-zeros"),
    pytest.param(" 7 ", id="spaces"),
]


@pytest.mark.parametrize("thread_id", CRAFTED_THREADS)
@pytest.mark.asyncio
async def test_crafted_thread_id_is_a_typed_error_and_nothing_is_written(
    tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, thread_id: Any
) -> None:
    cp = PgCheckpointer(pg_dsn, redis_url=tenx_redis.url, id_type="bigint")
    await cp.asetup()
    app = echo_graph(cp, id_generator=BigIntIDGenerator())
    cfg = {"thread_id": thread_id, "user_id": "alice"}
    calls = {
        "ainvoke": lambda: app.ainvoke({"messages": [msg(101, "user", "hello")]}, dict(cfg)),
        "aput_messages": lambda: cp.aput_messages(dict(cfg), [msg(101, "user", "hello")]),
        "aget_state": lambda: cp.aget_state(dict(cfg)),
        "aget_thread": lambda: cp.aget_thread(dict(cfg)),
        "astop": lambda: app.astop(dict(cfg)),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidConfigError) as err:
            await call()
        assert err.value.error_code == "STORAGE_CONFIG_002", name
        assert err.value.context["field"] == "thread_id", name
    assert set(row_counts(tenx_postgres, pg_dsn).values()) == {"0"}
    await cp.arelease()


@pytest.mark.asyncio
async def test_int_schema_refuses_ids_beyond_32_bits(tenx_postgres: Any, pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn, id_type="int")
    with pytest.raises(InvalidConfigError) as err:
        await echo_graph(cp).ainvoke({"messages": [msg(101, "user", "x")]}, {"thread_id": 2**31, "user_id": "a"})
    assert err.value.error_code == "STORAGE_CONFIG_002"
    # The largest int it holds is fine.
    result = await echo_graph(cp).ainvoke({"messages": [msg(101, "user", "x")]}, {"thread_id": 2**31 - 1, "user_id": "a"})
    assert [m.message_id for m in result["messages"]] == [101, 9001]
    await cp.arelease()


@pytest.mark.asyncio
async def test_crafted_user_id_and_message_id_are_typed_errors_and_nothing_is_written(
    tenx_postgres: Any, pg_dsn: str
) -> None:
    cp = PgCheckpointer(pg_dsn, id_type="bigint", user_id_type="int")
    for cfg, message, field in [
        ({"thread_id": 5, "user_id": "alice"}, msg(101, "user", "x"), "user_id"),
        ({"thread_id": 5, "user_id": True}, msg(101, "user", "x"), "user_id"),
        # A string message id (a uuid, the default id without an integer generator).
        ({"thread_id": 5, "user_id": 7}, msg(str(uuid.uuid4()), "user", "x"), "message_id"),
        ({"thread_id": 5, "user_id": 7}, msg("1:2", "user", "x"), "message_id"),
    ]:
        with pytest.raises(InvalidConfigError) as err:
            await echo_graph(cp).ainvoke({"messages": [message]}, dict(cfg))
        assert err.value.error_code == "STORAGE_CONFIG_002"
        assert err.value.context["field"] == field
    with pytest.raises(InvalidConfigError):
        await cp.aget_message({"thread_id": 5, "user_id": 7}, "not-a-number")
    assert set(row_counts(tenx_postgres, pg_dsn).values()) == {"0"}
    await cp.arelease()


@pytest.mark.parametrize("bad", ["integer", "uuid", 64, None])
def test_unknown_id_type_option_is_a_value_error(pg_dsn: str, bad: Any) -> None:
    for key in ("id_type", "user_id_type"):
        with pytest.raises(ValueError, match=f"{key} must be one of 'string', 'int', 'bigint'"):
            PgCheckpointer(pg_dsn, **{key: bad})
    # The three names, and IDType members by their value, are accepted.
    from tenxgraph.utils.id_generator import IDType

    assert PgCheckpointer(pg_dsn, id_type=IDType.BIGINT).id_type == "bigint"


# -- what reads give back, isolation and the authz owner scope ---------------------------------------

@pytest.mark.asyncio
async def test_ids_read_back_as_ints(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn, id_type="bigint", user_id_type="bigint")
    app = echo_graph(cp, id_generator=BigIntIDGenerator())
    cfg = {"thread_id": "31337", "user_id": 77}  # a digit string is the same thread as the int
    result = await app.ainvoke({"messages": [msg(101, "user", "hi")]}, dict(cfg))
    assert [m.message_id for m in result["messages"]] == [101, 9001]
    info = await cp.aget_thread({"thread_id": 31337, "user_id": 77})
    assert info is not None
    assert (info.thread_id, info.user_id) == (31337, 77)
    listed = await cp.alist_threads({"user_id": 77})
    assert [(t.thread_id, t.user_id) for t in listed] == [(31337, 77)]
    assert await cp.aget_thread_owner(31337, {"user_id": 77}) == 77
    assert cp.get_thread({"thread_id": 31337, "user_id": "77"}).thread_id == 31337  # the sync twin
    message = await cp.aget_message({"thread_id": 31337, "user_id": 77}, 9001)
    assert message.message_id == 9001 and message.text() == "reply to hi"
    await cp.arelease()


@pytest.mark.asyncio
async def test_prune_removes_a_finished_integer_thread_with_its_lease_row(pg_dsn: str) -> None:
    """The thread rule's statement compares integer thread ids with the text ids of the lease
    table (and locks the lease rows first): run on a bigint schema, not only a text one."""
    cp = PgCheckpointer(pg_dsn, id_type="bigint", enforce_user_isolation=False)
    app = echo_graph(cp, id_generator=BigIntIDGenerator())
    await app.ainvoke({"messages": [msg(101, "user", "hi")]}, {"thread_id": 4242})
    assert await cp.aget_lease({"thread_id": 4242}) is not None
    dry = await cp.aprune(finished_older_than=0, dry_run=True)
    assert dry["threads"] == 1 and await cp.aget_thread({"thread_id": 4242}) is not None
    report = await cp.aprune(finished_older_than=0)
    assert report["threads"] == 1, report
    assert await cp.aget_thread({"thread_id": 4242}) is None
    assert await cp.aget_lease({"thread_id": 4242}) is None
    await cp.arelease()


@pytest.mark.asyncio
async def test_isolation_and_the_authz_owner_scope_hold_on_integer_ids(pg_dsn: str) -> None:
    from tenxgraph.core.authz import build_authz

    cp = PgCheckpointer(pg_dsn, id_type="bigint", user_id_type="bigint")
    app = echo_graph(cp)
    await app.ainvoke({"messages": [msg(101, "user", "mine")]}, {"thread_id": 500, "user_id": 1})
    intruder = {"thread_id": 500, "user_id": 2}
    assert await cp.aget_state(dict(intruder)) is None
    assert await cp.aget_thread(dict(intruder)) is None
    with pytest.raises(StorageError) as err:
        await app.ainvoke({"messages": [msg(102, "user", "theirs now")]}, dict(intruder))
    assert err.value.error_code == "STORAGE_FORBIDDEN_001"
    scoped = {**intruder, "authz": build_authz(2, scope="owner")}
    with pytest.raises(StorageError) as err:
        await cp.aget_state(scoped)
    assert err.value.error_code == "STORAGE_FORBIDDEN_001"
    owner = {"thread_id": 500, "user_id": 1, "authz": build_authz(1, scope="owner")}
    state = await cp.aget_state(owner)
    assert [m.message_id for m in state.context] == [101, 9001]
    await cp.arelease()


# -- stop requests, leases and the ledger across a SIGKILL ---------------------------------------------

@pytest.mark.asyncio
async def test_stop_request_ends_a_run_on_a_bigint_thread(pg_dsn: str, tenx_redis: Any) -> None:
    entered = asyncio.Event()

    async def hang() -> str:
        """Never returns."""
        entered.set()
        await asyncio.Event().wait()
        return "unreachable"

    def model(state: AgentState) -> list[Message]:
        m = msg(9000 + len(state.context), "assistant", "")
        m.tools_calls = [{"id": "h1", "type": "function", "function": {"name": "hang", "arguments": "{}"}}]
        return [m]

    cp = PgCheckpointer(pg_dsn, redis_url=tenx_redis.url, id_type="bigint")
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([hang]))
    g.add_edge(START, "model")
    g.add_edge("model", "tools")
    g.add_edge("tools", END)
    app = g.compile(checkpointer=cp)
    cfg = {"thread_id": 8080, "user_id": "alice"}
    run = asyncio.create_task(app.ainvoke({"messages": [msg(101, "user", "go")]}, dict(cfg)))
    await asyncio.wait_for(entered.wait(), 60)
    lease = await cp.aget_lease(dict(cfg))
    assert lease is not None and lease["released"] is False and lease["token"] >= 1
    assert (await app.astop(dict(cfg)))["running"] is True
    await asyncio.wait_for(run, 60)  # ended by the stop (tool_timeout is 300 s)
    state = await cp.aget_state(cfg)
    assert state.execution_meta.interrupt_reason == "stop_requested"
    assert (await cp.aget_lease(dict(cfg)))["released"] is True
    await cp.arelease()


@pytest.mark.parametrize("bad", [{"thread_id": "007", "user_id": "alice"}, {"thread_id": -1, "user_id": "alice"},
                                 {"thread_id": "abc", "user_id": "alice"}, {"thread_id": 7, "user_id": "007"}])
@pytest.mark.asyncio
async def test_stop_request_calls_refuse_ids_the_schema_cannot_hold(pg_dsn: str, tenx_postgres: Any,
                                                                    bad: dict[str, Any]) -> None:
    """They wrote a key no run reads ("007:alice" for thread 7's "7:alice") and answered True
    (red-team, session 35): refused as every other entry point refuses such an id."""
    cp = PgCheckpointer(pg_dsn, id_type="bigint", user_id_type="bigint" if bad["user_id"] == "007" else "string")
    await cp.asetup()
    for call in (cp.arequest_stop, cp.ais_stop_requested, cp.aclear_stop_request):
        with pytest.raises(InvalidConfigError) as err:
            await call(dict(bad))
        assert err.value.error_code == "STORAGE_CONFIG_002"
    assert sql(tenx_postgres, pg_dsn, "SELECT count(*) FROM public.tenx_cache") == "0"
    await cp.arelease()


CRASH_10XGRAPH = '''
import os, subprocess, sys

CHILD = """
import asyncio, os, sys
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils import END

def msg(mid, role, text):
    return Message(message_id=mid, role=role, content=[TextBlock(text=text)])

async def main():
    thread, base = sys.argv[1], int(sys.argv[2])
    cp = PgCheckpointer(postgres_dsn=os.environ["TENX_DSN"], redis_url=os.environ["TENX_REDIS"], id_type="bigint")
    await cp.asetup()
    def a(state):
        return [msg(base + len(state.context), "assistant", "step a")]
    def b(state):
        os._exit(9)  # the process dies in its second node: the thread stays running
    g = StateGraph()
    g.add_node("a", a); g.add_node("b", b); g.set_entry_point("a"); g.add_edge("a", "b"); g.add_edge("b", END)
    await g.compile(checkpointer=cp).ainvoke({"messages": [msg(base, "user", "hello")]},
                                             config={"thread_id": thread, "user_id": "alice"})

asyncio.run(main())
"""
codes = [subprocess.run([sys.executable, "-c", CHILD, t, b]).returncode
         for t, b in ((os.environ["BAD"], "200"), (os.environ["GOOD"], "100"))]
emit(codes)
'''


@pytest.mark.asyncio
async def test_recovery_and_the_listing_go_past_a_10xgraph_thread_id_this_schema_refuses(
    oracle: Any, tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, tmp_path: Any
) -> None:
    """10xGraph stored a thread id of 0 or below on an int schema, which every call here refuses
    (STORAGE_CONFIG_002). One such crashed thread made the whole recovery pass raise, every other
    crashed thread left running, and `tenxgraph threads list` fail (red-team, session 35)."""
    from tenxgraph.recovery import recover
    from tests_py.test_cli import cli

    good = int(uuid.uuid4().int >> 72) + 1  # fresh: 10xGraph's Redis state cache is keyed by thread only
    bad = -good
    codes = oracle.run_theirs(CRASH_10XGRAPH, env={"TENX_DSN": pg_dsn, "TENX_REDIS": tenx_redis.url,
                                                   "BAD": str(bad), "GOOD": str(good)})
    assert codes == [9, 9]
    assert sql(tenx_postgres, pg_dsn, f"SELECT count(*) FROM public.threads WHERE thread_id IN ({good}, {bad})") == "2"

    cp = PgCheckpointer(pg_dsn, id_type="bigint")

    def step_b(state: AgentState) -> list[Message]:
        return [msg(6000 + len(state.context), "assistant", "step b")]

    g = StateGraph(AgentState)
    g.add_node("a", lambda state: [msg(5000 + len(state.context), "assistant", "step a")])
    g.add_node("b", step_b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    report = await recover(g.compile(checkpointer=cp))
    assert [t.thread_id for t in report.resumed] == [str(good)]
    assert [(t.thread_id, t.error_code, t.status) for t in report.failed] == [
        (str(bad), "STORAGE_CONFIG_002", "running")]
    state = await cp.aget_state({"thread_id": good, "user_id": "alice"})
    assert state.execution_meta.status == "completed" and state.context[-1].text() == "step b"
    await cp.arelease()

    listed = cli("threads", "list", "--dsn", pg_dsn, "--id-type", "bigint", "--json", cwd=tmp_path)
    assert listed.rc == 0, listed.err
    status = {r["thread_id"]: r["status"] for r in listed.json()}
    assert (status[str(good)], status[str(bad)]) == ("completed", "id-refused")


def test_sigkill_after_the_tool_recorded_resumes_without_calling_it_again(crash_kit: Any, pg_dsn: str,
                                                                          tenx_postgres: Any) -> None:
    from tests_py.crash_agents.int_id_agent import DONE

    target, thread = "tests_py.crash_agents.int_id_agent:build", "90001"
    kw = {"db": pg_dsn, "checkpointer_kwargs": {"id_type": "bigint"}}
    crashed = crash_kit.run_until_crash(target, thread, failpoints="after_record:charge=kill",
                                        input={"messages": [msg(7001, "user", "charge me")]}, **kw)
    assert crashed.killed
    assert crash_kit.effects.count("charge") == 1
    # The ledger row is the thread's, keyed by the (bigint) id of the message that asked.
    key = sql(tenx_postgres, pg_dsn, f"SELECT tool_call_id FROM tool_executions WHERE thread_id = {thread}")
    origin, call = json.loads(key)  # our key: [message id, call id], the id a JSON number
    assert call == "call_1" and isinstance(origin, int) and origin > 0

    resumed = crash_kit.resume(target, thread, **kw)
    assert resumed.status == "completed"
    assert resumed.last == DONE
    assert crash_kit.effects.count("charge") == 1  # answered from the ledger, not called again
    ids = [m["message_id"] for m in resumed.message_dicts]
    assert ids[0] == 7001 and all(isinstance(i, int) for i in ids), ids
    assert sql(tenx_postgres, pg_dsn, f"SELECT token > 1 AND released FROM tenx_leases WHERE thread_id = '{thread}'") == "t"


# -- the same graph on 10xGraph 0.10.0 and on tenxgraph ------------------------------------------

SAME_GRAPH = """
import asyncio, os
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils import END

def msg(mid, role, text):
    return Message(message_id=mid, role=role, content=[TextBlock(text=text)])

def rows(messages):
    return [(m.message_id, type(m.message_id).__name__, m.role, m.text()) for m in messages]

async def main():
    schema = os.environ["SCHEMA"]
    try:
        import asyncpg  # 10xGraph's PgCheckpointer needs the schema to exist
        c = await asyncpg.connect(os.environ["TENX_DSN"])
        await c.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await c.close()
    except ImportError:
        pass
    cp = PgCheckpointer(postgres_dsn=os.environ["TENX_DSN"], redis_url=os.environ["TENX_REDIS"], schema=schema,
                        id_type="bigint")
    await cp.asetup()
    def model(state: AgentState):
        return [msg(9000 + len(state.context), "assistant", f"reply to {state.context[-1].text()}")]
    g = StateGraph()
    g.add_node("model", model); g.set_entry_point("model"); g.add_edge("model", END)
    app = g.compile(checkpointer=cp)
    cfg = {"thread_id": os.environ["THREAD"], "user_id": "alice"}
    r1 = await app.ainvoke({"messages": [msg(101, "user", "hello")]}, config=dict(cfg))
    r2 = await app.ainvoke({"messages": [msg(102, "user", "again")]}, config=dict(cfg))
    state = await cp.aget_state(dict(cfg))
    info = await cp.aget_thread(dict(cfg))
    emit({
        "r1": rows(r1["messages"]), "r2": rows(r2["messages"]),
        "state": rows(state.context), "status": str(state.execution_meta.status),
        # As an int: 10xGraph's alist_messages does not convert a string thread id (asyncpg DataError).
        "listed": rows(await cp.alist_messages({**cfg, "thread_id": int(cfg["thread_id"])})),
        "thread": [info.thread_id, type(info.thread_id).__name__, info.user_id, info.thread_name],
    })

asyncio.run(main())
"""


@pytest.mark.asyncio
async def test_same_graph_on_bigint_ids_as_10xgraph(oracle: Any, pg_dsn: str, tenx_redis: Any) -> None:
    env = {"TENX_DSN": pg_dsn, "TENX_REDIS": tenx_redis.url}
    # Two threads: 10xGraph's Redis state cache is keyed by thread and user only, not by schema.
    their_thread, our_thread = (uuid.uuid4().int >> 72 for _ in range(2))
    theirs = oracle.run_theirs(SAME_GRAPH, env={**env, "SCHEMA": "theirs", "THREAD": str(their_thread)})
    ours = oracle.run_ours(SAME_GRAPH, env={**env, "SCHEMA": "ours", "THREAD": str(our_thread)})
    for key in ("r1", "r2", "state", "status", "listed"):
        assert ours[key] == theirs[key], key
    assert theirs["state"] == [[101, "int", "user", "hello"], [9001, "int", "assistant", "reply to hello"],
                               [102, "int", "user", "again"], [9003, "int", "assistant", "reply to again"]]
    # ThreadInfo: the thread id the int the column holds, the user as given, and the name both
    # give a thread on its first write whatever the id type.
    assert theirs["thread"] == [their_thread, "int", "alice", f"Thread {their_thread}"]
    assert ours["thread"] == [our_thread, "int", "alice", f"Thread {our_thread}"]


# -- the command line on an integer schema ----------------------------------------------------------

def test_cli_opens_an_integer_database_with_its_id_types(pg_dsn: str, tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    cp = PgCheckpointer(pg_dsn, id_type="bigint", enforce_user_isolation=False)
    echo_graph(cp).invoke({"messages": [msg(101, "user", "hello")]}, {"thread_id": 4821})
    cp.release()
    env = {k: v for k, v in os.environ.items() if k != "TENXGRAPH_DSN"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tenxgraph", *args, "--dsn", pg_dsn], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path, env=env)

    refused = cli("migrate", "--json")
    assert refused.returncode == 4, refused  # a store it cannot open: says which types the database has
    assert 'id_type="bigint"' in refused.stderr
    ok = cli("migrate", "--json", "--id-type", "bigint")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["schema_version"] == CURRENT_SCHEMA_VERSION
    shown = cli("threads", "messages", "4821", "--json", "--id-type", "bigint")
    assert shown.returncode == 0, shown.stderr
    assert "reply to hello" in shown.stdout


@pytest.mark.asyncio
async def test_recover_finishes_crashed_bigint_threads_without_calling_their_tools_again(
    crash_kit: Any, pg_dsn: str
) -> None:
    from tenxgraph.recovery import recover
    from tests_py.crash_agents.int_id_agent import DONE, build

    target, kw = "tests_py.crash_agents.int_id_agent:build", {"db": pg_dsn, "checkpointer_kwargs": {"id_type": "bigint"}}
    # Thread ids that sort differently as text and as numbers, so the pass pages in the column's order.
    threads = ["9", "10", "100"]
    for i, thread in enumerate(threads):
        crashed = crash_kit.run_until_crash(target, thread, failpoints="after_record:charge=kill",
                                            input={"messages": [msg(8000 + i, "user", "charge me")]}, **kw)
        assert crashed.killed
    assert crash_kit.effects.count("charge") == 3
    cp = PgCheckpointer(pg_dsn, id_type="bigint")
    report = await recover(build(cp), concurrency=2, config={"lease_ttl": 5})
    assert report.ok, report
    assert sorted(int(t.thread_id) for t in report.resumed) == [9, 10, 100]
    assert crash_kit.effects.count("charge") == 3  # every call answered from the ledger
    for thread in threads:
        state = await cp.aget_state({"thread_id": int(thread)})
        assert state.context[-1].text() == DONE
    await cp.arelease()
