"""A database the real 10xGraph 0.10.0 created in a schema other than ``public``.

10xGraph creates its ``message_role`` enum with an unqualified name on a connection whose path is
the default, so the type lands in ``public`` while its tables land in the schema. Pinned here: on
such a database (string and integer ids) ours upgrades in place, resumes 10xGraph's thread, runs a
turn, and 10xGraph reads the turn back (its messages and the state's status: the context of our
state rows is in the messages table, which 10xGraph's ``aget_state`` does not read); functions that an earlier tenxgraph left casting to a type
the schema does not hold are rewritten by the next setup; and our own fresh custom schema keeps
its own type.
"""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.storage.checkpointer import PgCheckpointer

SCHEMA = "agents"

WRITE = """
import asyncio, os
import asyncpg
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils import END

ints = os.environ["ID_TYPE"] != "string"

def mid(n):
    return n if ints else f"m{n}-{os.environ['THREAD']}"

def msg(n, role, text):
    return Message(message_id=mid(n), role=role, content=[TextBlock(text=text)])

async def main():
    c = await asyncpg.connect(os.environ["TENX_DSN"])
    await c.execute(f"CREATE SCHEMA IF NOT EXISTS {os.environ['SCHEMA']}")
    await c.close()
    cp = PgCheckpointer(postgres_dsn=os.environ["TENX_DSN"], redis_url=os.environ["TENX_REDIS"],
                        schema=os.environ["SCHEMA"], id_type=os.environ["ID_TYPE"])
    await cp.asetup()
    def model(state: AgentState):
        return [msg(9000 + len(state.context), "assistant", f"reply to {state.context[-1].text()}")]
    g = StateGraph()
    g.add_node("model", model); g.set_entry_point("model"); g.add_edge("model", END)
    app = g.compile(checkpointer=cp)
    r = await app.ainvoke({"messages": [msg(101, "user", "hello")]},
                          config={"thread_id": os.environ["THREAD"], "user_id": "alice"})
    emit([m.text() for m in r["messages"]])

asyncio.run(main())
"""

READ = """
import asyncio, os
from tenxgraph.storage.checkpointer import PgCheckpointer

async def main():
    cp = PgCheckpointer(postgres_dsn=os.environ["TENX_DSN"], redis_url=os.environ["TENX_REDIS"],
                        schema=os.environ["SCHEMA"], id_type=os.environ["ID_TYPE"])
    thread = os.environ["THREAD"]
    tid = thread if os.environ["ID_TYPE"] == "string" else int(thread)
    cfg = {"thread_id": tid, "user_id": "alice"}
    state = await cp.aget_state(dict(cfg))
    listed = await cp.alist_messages(dict(cfg))
    emit({"status": str(state.execution_meta.status.value), "listed": [[m.role, m.text()] for m in listed]})

asyncio.run(main())
"""

UNQUALIFIED_CASTS = ("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                     f"WHERE n.nspname = '{SCHEMA}' AND p.prosrc LIKE '%::message_role%'")

TURN_ONE = [["user", "hello"], ["assistant", "reply to hello"]]
TURN_TWO = [["user", "again"], ["assistant", "reply to again"]]
BOTH_TURNS = TURN_ONE + TURN_TWO


def sql(pg: Any, dsn: str, query: str) -> str:
    return pg.psql(query, dbname=urllib.parse.unquote(urllib.parse.urlsplit(dsn).path.lstrip("/"))).strip()


def role_type_schemas(pg: Any, dsn: str) -> str:
    return sql(pg, dsn, "SELECT string_agg(n.nspname, ',' ORDER BY n.nspname) FROM pg_type t "
                        "JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.typname = 'message_role'")


def thread_for(id_type: str) -> str:
    # Fresh per test: 10xGraph's Redis state cache is keyed by thread and user, not by database.
    n = uuid.uuid4().int >> 100
    return f"t-{uuid.uuid4().hex[:10]}" if id_type == "string" else str(n or 1)


def one_turn(cp: PgCheckpointer, id_type: str, thread: str):
    def model(state: AgentState) -> list[Message]:
        n = 9000 + len(state.context)
        return [Message(message_id=n if id_type != "string" else f"m{n}-{thread}", role="assistant",
                        content=[TextBlock(text=f"reply to {state.context[-1].text()}")])]

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=cp)
    mid: int | str = 102 if id_type != "string" else f"m102-{thread}"
    return app.ainvoke({"messages": [Message(message_id=mid, role="user", content=[TextBlock(text="again")])]},
                       {"thread_id": thread if id_type == "string" else int(thread), "user_id": "alice"})


def env_for(pg_dsn: str, redis_url: str, id_type: str, thread: str) -> dict[str, str]:
    return {"TENX_DSN": pg_dsn, "TENX_REDIS": redis_url, "SCHEMA": SCHEMA, "ID_TYPE": id_type, "THREAD": thread}


@pytest.mark.parametrize("id_type", ["string", "int"])
@pytest.mark.asyncio
async def test_ours_runs_on_a_custom_schema_10xgraph_created_and_10xgraph_reads_the_turn(
    oracle: Any, tenx_postgres: Any, pg_dsn: str, tenx_redis: Any, id_type: str
) -> None:
    thread = thread_for(id_type)
    env = env_for(pg_dsn, tenx_redis.url, id_type, thread)
    assert oracle.run_theirs(WRITE, env=env) == ["hello", "reply to hello"]
    # The premise: the type is in public, not in the schema that holds 10xGraph's tables.
    assert role_type_schemas(tenx_postgres, pg_dsn) == "public"

    cp = PgCheckpointer(pg_dsn, schema=SCHEMA, id_type=id_type)
    assert await cp.asetup() is True
    cfg = {"thread_id": thread if id_type == "string" else int(thread), "user_id": "alice"}
    state = await cp.aget_state(dict(cfg))
    assert state is not None and [m.text() for m in state.context] == ["hello", "reply to hello"]
    result = await one_turn(cp, id_type, thread)
    assert [[m.role, m.text()] for m in result["messages"]] == TURN_TWO
    await cp.arelease()

    assert oracle.run_theirs(READ, env=env) == {"status": "completed", "listed": BOTH_TURNS}
    assert role_type_schemas(tenx_postgres, pg_dsn) == "public"  # no second type made on the way


@pytest.mark.asyncio
async def test_functions_an_earlier_tenxgraph_left_unresolvable_are_rewritten_by_setup(
    oracle: Any, tenx_postgres: Any, pg_dsn: str, tenx_redis: Any
) -> None:
    thread = thread_for("string")
    env = env_for(pg_dsn, tenx_redis.url, "string", thread)
    assert oracle.run_theirs(WRITE, env=env) == ["hello", "reply to hello"]
    cp = PgCheckpointer(pg_dsn, schema=SCHEMA)
    assert await cp.asetup() is True
    await cp.arelease()
    # What an upgrade by a tenxgraph without the rewrite left: the same functions, their casts
    # naming the type unqualified (so, under their pinned path, a type the schema lacks).
    sql(tenx_postgres, pg_dsn, f"""DO $$ DECLARE f record; BEGIN
      FOR f IN SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE n.nspname = '{SCHEMA}' AND p.prosrc LIKE '%::public.message_role%' LOOP
        EXECUTE replace(pg_get_functiondef(f.oid), '::public.message_role', '::message_role');
      END LOOP; END $$""")
    assert int(sql(tenx_postgres, pg_dsn, UNQUALIFIED_CASTS)) >= 2  # tenx_put_step, tenx_put_step_legacy...

    cp = PgCheckpointer(pg_dsn, schema=SCHEMA)
    assert await cp.asetup() is True
    result = await one_turn(cp, "string", thread)
    assert [[m.role, m.text()] for m in result["messages"]] == TURN_TWO
    await cp.arelease()
    assert sql(tenx_postgres, pg_dsn, UNQUALIFIED_CASTS) == "0"
    assert oracle.run_theirs(READ, env=env) == {"status": "completed", "listed": BOTH_TURNS}


@pytest.mark.asyncio
async def test_our_fresh_custom_schema_keeps_its_own_role_type(tenx_postgres: Any, pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn, schema="fresh")
    assert await cp.asetup() is True
    thread = thread_for("string")
    await cp.aput_messages({"thread_id": thread, "user_id": "alice"},
                           [Message(message_id=f"m1-{thread}", role="user", content=[TextBlock(text="hi")])])
    state_roles = [m.role for m in await cp.alist_messages({"thread_id": thread, "user_id": "alice"})]
    assert state_roles == ["user"]
    await cp.arelease()
    assert role_type_schemas(tenx_postgres, pg_dsn) == "fresh"
    assert sql(tenx_postgres, pg_dsn, "SELECT atttypid::regtype::text FROM pg_attribute "
                                      "WHERE attrelid = 'fresh.messages'::regclass AND attname = 'role'") == "fresh.message_role"
