"""Two maintenance calls on one thread at once: a message call (``adelete_message``,
``aput_messages``) next to a thread-wide one (``aclear_state``, ``aclean_thread``). The message
delete took the message row and then the latest state row; the clear took every state row and
then the message rows (the clean's cascade too): a lock cycle, and the server aborted the message
call with ``STORAGE_TRANSIENT_001`` (red-team, session 38). Each now takes the thread row first.

Deterministic: a ``psql`` session holds the thread's first message row, so the thread-wide call
stops among the message rows holding what it took before them; the message call starts on the
later message and waits; the session lets go. Every wait is found through
``pg_blocking_pids``, not a sleep."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import MessageNotFoundError
from tenxgraph.storage.checkpointer import PgCheckpointer
from tenxgraph.testing.postgres_server import find_pg_binary

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not DSN, reason="needs TENXGRAPH_TEST_PG_DSN (python -m tenxgraph.testing serve ENV)")


def _psql(sql: str) -> str:
    res = subprocess.run([find_pg_binary("psql"), "-X", "-Atq", "-v", "ON_ERROR_STOP=1", "-d", str(DSN), "-c", sql],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


async def _waiting_on(pid: str, task: "asyncio.Task[Any]") -> str:
    """A backend that waits on ``pid``'s locks, or '' once ``task`` ended without one."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not task.done():
        found = _psql(f"SELECT min(pid) FROM pg_stat_activity WHERE {pid} = ANY(pg_blocking_pids(pid))")
        if found:
            return found
        await asyncio.sleep(0.02)
    return ""


@pytest.mark.asyncio
@pytest.mark.parametrize("wide", ["clear", "clean"])
@pytest.mark.parametrize("small", ["delete", "put"])
async def test_a_message_call_next_to_a_clear_or_clean_of_its_thread_both_complete(small: str, wide: str) -> None:
    schema = f"ml_{uuid.uuid4().hex[:10]}"
    cp = PgCheckpointer(postgres_dsn=DSN, schema=schema)

    def work(state: AgentState) -> Message:
        return Message.text_message("worked", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    app = g.compile(checkpointer=cp)
    cfg = {"thread_id": "t:1"}
    first = Message.text_message("go")
    out = await app.ainvoke({"messages": [first]}, cfg)
    later = out["messages"][-1].message_id
    locker = subprocess.Popen([find_pg_binary("psql"), "-X", "-Atq", "-d", str(DSN)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert locker.stdin is not None and locker.stdout is not None

    def ask(sql: str) -> str:
        assert locker.stdin is not None and locker.stdout is not None
        locker.stdin.write(sql + "\n")
        locker.stdin.flush()
        return locker.stdout.readline().strip()

    try:
        held = await asyncio.to_thread(
            ask, f"BEGIN; SELECT pg_backend_pid() FROM \"{schema}\".messages "
                 f"WHERE message_id = '{first.message_id}' FOR UPDATE;")
        assert held.isdigit(), held
        wide_call = cp.aclear_state(dict(cfg)) if wide == "clear" else cp.aclean_thread(dict(cfg))
        wide_task = asyncio.create_task(wide_call)
        wide_pid = await _waiting_on(held, wide_task)
        assert wide_pid, f"the {wide} never waited on the held message row"
        edited = Message(message_id=later, role="assistant", content=Message.text_message("edited").content)
        small_call = cp.adelete_message(dict(cfg), later) if small == "delete" else cp.aput_messages(dict(cfg), [edited])
        small_task = asyncio.create_task(small_call)
        # It waits on the wide call (for the thread row now; before, it took its message and
        # waited for the state row the wide call held).
        assert await _waiting_on(wide_pid, small_task), f"the {small} did not wait on the {wide}"
        assert await asyncio.to_thread(ask, "ROLLBACK; SELECT 'let go';") == "let go"
        done = await asyncio.wait_for(asyncio.gather(wide_task, small_task, return_exceptions=True), 60)
    finally:
        if locker.poll() is None:
            locker.stdin.write("ROLLBACK;\n\\q\n")
            locker.stdin.flush()
            locker.wait(30)
    # The wide call ran first and the message call after it: a delete finds the message gone
    # (the typed answer 10xGraph gives), a put writes it again. Never the lock-conflict error.
    wide_done, small_done = done
    assert wide_done is None, wide_done
    if small == "delete":
        assert isinstance(small_done, MessageNotFoundError), small_done
    else:
        assert small_done is None, small_done
    assert _psql(f"SELECT count(*) FROM \"{schema}\".states WHERE thread_id = 't:1'") == "0"
    left = _psql(f"SELECT string_agg(content::jsonb->0->>'text', '|') FROM \"{schema}\".messages WHERE thread_id = 't:1'")
    assert left == ("" if small == "delete" else "edited"), left
    await cp.arelease()
