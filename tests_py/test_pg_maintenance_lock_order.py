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
import uuid

import pytest

from tenxgraph import Message
from tenxgraph.core.exceptions import MessageNotFoundError
from tenxgraph.storage.checkpointer import PgCheckpointer

from .pg_sessions import Holder, blocked_by, psql
from .reply_graph import reply_graph

DSN = os.environ.get("TENXGRAPH_TEST_PG_DSN")
pytestmark = pytest.mark.skipif(not DSN, reason="needs TENXGRAPH_TEST_PG_DSN (python -m tenxgraph.testing serve ENV)")


def _psql(sql: str) -> str:
    return psql(str(DSN), sql)


@pytest.mark.asyncio
@pytest.mark.parametrize("wide", ["clear", "clean"])
@pytest.mark.parametrize("small", ["delete", "put"])
async def test_a_message_call_next_to_a_clear_or_clean_of_its_thread_both_complete(small: str, wide: str) -> None:
    schema = f"ml_{uuid.uuid4().hex[:10]}"
    cp = PgCheckpointer(postgres_dsn=DSN, schema=schema)

    app = reply_graph(cp)
    cfg = {"thread_id": "t:1"}
    first = Message.text_message("go")
    out = await app.ainvoke({"messages": [first]}, cfg)
    later = out["messages"][-1].message_id
    locker = Holder(str(DSN))
    try:
        held = await locker.ask_async(
            f"BEGIN; SELECT pg_backend_pid() FROM \"{schema}\".messages WHERE message_id = '{first.message_id}' FOR UPDATE;")
        assert held.isdigit(), held
        wide_call = cp.aclear_state(dict(cfg)) if wide == "clear" else cp.aclean_thread(dict(cfg))
        wide_task = asyncio.create_task(wide_call)
        wide_pid = await blocked_by(str(DSN), held, wide_task)
        assert wide_pid, f"the {wide} never waited on the held message row"
        edited = Message(message_id=later, role="assistant", content=Message.text_message("edited").content)
        small_call = cp.adelete_message(dict(cfg), later) if small == "delete" else cp.aput_messages(dict(cfg), [edited])
        small_task = asyncio.create_task(small_call)
        # It waits on the wide call (for the thread row now; before, it took its message and
        # waited for the state row the wide call held).
        assert await blocked_by(str(DSN), wide_pid, small_task), f"the {small} did not wait on the {wide}"
        assert await locker.ask_async("ROLLBACK; SELECT 'let go';") == "let go"
        done = await asyncio.wait_for(asyncio.gather(wide_task, small_task, return_exceptions=True), 60)
    finally:
        locker.close()
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
