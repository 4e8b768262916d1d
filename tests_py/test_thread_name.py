"""A new thread's name: "Thread <id>", as 10xGraph 0.10's PgCheckpointer names it on its first write.

Pinned here: the same graph and calls on 10xGraph and on tenxgraph give the same names in
``aget_thread`` and ``alist_threads`` (string and integer ids), 10xGraph reads the name from the
row ours wrote, every backend names a thread the same way, an explicit name wins and a later
``aput_thread`` without one keeps it, and a thread id too long for the prefix gets a name cut to
the column's 255 characters.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.utils.thread_info import ThreadInfo

SCRIPT = """
import asyncio, os
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.utils import END
from tenxgraph.utils.thread_info import ThreadInfo

ints = os.environ["ID_TYPE"] != "string"
run_thread, put_thread = os.environ["RUN_THREAD"], os.environ["PUT_THREAD"]

def tid(t):
    return int(t) if ints else t

def msg(n, role, text, thread):
    return Message(message_id=n if ints else f"m{n}-{thread}", role=role, content=[TextBlock(text=text)])

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
                        id_type=os.environ["ID_TYPE"])
    await cp.asetup()
    def model(state: AgentState):
        return [msg(9000 + len(state.context), "assistant", "reply", run_thread)]
    g = StateGraph()
    g.add_node("model", model); g.set_entry_point("model"); g.add_edge("model", END)
    app = g.compile(checkpointer=cp)
    # 10xGraph's run needs a str thread id (its ExecutionState.thread_id), whatever the id type.
    await app.ainvoke({"messages": [msg(101, "user", "hello", run_thread)]},
                      config={"thread_id": run_thread, "user_id": "alice"})
    run_cfg = {"thread_id": tid(run_thread), "user_id": "alice"}
    put_cfg = {"thread_id": tid(put_thread), "user_id": "alice"}
    await cp.aput_messages(dict(put_cfg), [msg(201, "user", "stored", put_thread)])
    names = {"run": (await cp.aget_thread(dict(run_cfg))).thread_name,
             "put_messages": (await cp.aget_thread(dict(put_cfg))).thread_name,
             "listed": sorted(t.thread_name for t in await cp.alist_threads({"user_id": "alice"}))}
    await cp.aput_thread(dict(put_cfg), ThreadInfo(thread_id=tid(put_thread), thread_name="Renamed"))
    names["renamed"] = (await cp.aget_thread(dict(put_cfg))).thread_name
    # A second turn does not rename the thread.
    await app.ainvoke({"messages": [msg(102, "user", "again", run_thread)]},
                      config={"thread_id": run_thread, "user_id": "alice"})
    names["after_second_turn"] = (await cp.aget_thread(dict(run_cfg))).thread_name
    emit({k: (v.replace(run_thread, "<run>").replace(put_thread, "<put>") if isinstance(v, str)
              else sorted(x.replace(run_thread, "<run>").replace(put_thread, "<put>") for x in v))
          for k, v in names.items()})

asyncio.run(main())
"""

READ_NAME = """
import asyncio, os
from tenxgraph.storage.checkpointer import PgCheckpointer

async def main():
    cp = PgCheckpointer(postgres_dsn=os.environ["TENX_DSN"], redis_url=os.environ["TENX_REDIS"],
                        schema=os.environ["SCHEMA"], id_type=os.environ["ID_TYPE"])
    t = os.environ["RUN_THREAD"]
    info = await cp.aget_thread({"thread_id": int(t) if os.environ["ID_TYPE"] != "string" else t, "user_id": "alice"})
    emit(info.thread_name)

asyncio.run(main())
"""

EXPECTED = {"run": "Thread <run>", "put_messages": "Thread <put>", "listed": ["Thread <put>", "Thread <run>"],
            "renamed": "Renamed", "after_second_turn": "Thread <run>"}


def fresh_threads(id_type: str) -> tuple[str, str]:
    # Distinct per side and test: 10xGraph's Redis state cache is keyed by thread and user only.
    if id_type == "string":
        return f"run-{uuid.uuid4().hex[:10]}", f"put-{uuid.uuid4().hex[:10]}"
    base = (uuid.uuid4().int >> 80) * 2 + 2
    return str(base), str(base + 1)


@pytest.mark.parametrize("id_type", ["string", "bigint"])
@pytest.mark.asyncio
async def test_thread_names_are_10xgraphs(oracle: Any, pg_dsn: str, tenx_redis: Any, id_type: str) -> None:
    env = {"TENX_DSN": pg_dsn, "TENX_REDIS": tenx_redis.url, "ID_TYPE": id_type}
    their_run, their_put = fresh_threads(id_type)
    our_run, our_put = fresh_threads(id_type)
    theirs = oracle.run_theirs(SCRIPT, env={**env, "SCHEMA": "theirs", "RUN_THREAD": their_run, "PUT_THREAD": their_put})
    ours = oracle.run_ours(SCRIPT, env={**env, "SCHEMA": "ours", "RUN_THREAD": our_run, "PUT_THREAD": our_put})
    assert theirs == EXPECTED  # what 10xGraph does, so a change in the oracle is seen as such
    assert ours == theirs
    # 10xGraph reads the name from the row ours wrote.
    assert oracle.run_theirs(READ_NAME, env={**env, "SCHEMA": "ours", "RUN_THREAD": our_run}) == f"Thread {our_run}"


def echo_app(cp: Any):
    def model(state: AgentState) -> list[Message]:
        return [Message(message_id=f"r-{uuid.uuid4().hex}", role="assistant", content=[TextBlock(text="reply")])]

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=cp)


def user_msg() -> Message:
    return Message(message_id=f"m-{uuid.uuid4().hex}", role="user", content=[TextBlock(text="hi")])


@pytest.mark.asyncio
async def test_every_backend_names_a_new_thread_the_same_way(checkpointer: Any, make_thread: Any) -> None:
    ran, put, named = make_thread("ran"), make_thread("put"), make_thread("named")
    await echo_app(checkpointer).ainvoke({"messages": [user_msg()]}, {"thread_id": ran, "user_id": "u1"})
    await checkpointer.aput_messages({"thread_id": put, "user_id": "u1"}, [user_msg()])
    await checkpointer.aput_thread({"thread_id": named, "user_id": "u1"}, ThreadInfo(thread_id=named, thread_name="Mine"))
    names = {t.thread_id: t.thread_name for t in await checkpointer.alist_threads({"user_id": "u1"})}
    assert names == {ran: f"Thread {ran}", put: f"Thread {put}", named: "Mine"}
    # aput_thread without a name keeps the one the thread has.
    await checkpointer.aput_thread({"thread_id": ran, "user_id": "u1"}, ThreadInfo(thread_id=ran, metadata={"k": 1}))
    info = await checkpointer.aget_thread({"thread_id": ran, "user_id": "u1"})
    assert (info.thread_name, info.metadata) == (f"Thread {ran}", {"k": 1})
    await checkpointer.arelease()


@pytest.mark.asyncio
async def test_a_thread_id_too_long_for_the_prefix_gets_a_name_cut_to_255(checkpointer: Any, make_thread: Any) -> None:
    thread = (make_thread() + "x" * 255)[:255]
    await echo_app(checkpointer).ainvoke({"messages": [user_msg()]}, {"thread_id": thread, "user_id": "u1"})
    info = await checkpointer.aget_thread({"thread_id": thread, "user_id": "u1"})
    assert info.thread_name == f"Thread {thread}"[:255]
    await checkpointer.arelease()
