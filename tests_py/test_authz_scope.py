"""The per-call ``config["authz"]`` policy (10xGraph 0.10's block): with ``scope: "owner"`` another
user is refused on every entry point that takes a config (runs, stream, stop, every checkpointer
read and write, sync twins included), on checkpointers that do not isolate users themselves, and
neither learns nor changes anything of the owner's thread. Runs on memory, SQLite, Postgres and
Postgres+Redis (the ``checkpointer`` fixture, isolation off)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tenxgraph.core.authz import build_authz
from tenxgraph.core.exceptions import StorageError
from tenxgraph.core.state import AgentState, Message
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo
from tests_py.publisher_graphs import tool_graph

ALICE, MALLORY = "alice", "mallory"


def owner_cfg(tid: str, user: str, **extra: Any) -> dict[str, Any]:
    return {"thread_id": tid, "user_id": user, "authz": build_authz(user, scope="owner"), **extra}


async def _alice_thread(checkpointer, make_thread) -> tuple[Any, str, dict[str, Any]]:
    app = tool_graph(checkpointer=checkpointer)
    tid = make_thread("authz")
    await app.ainvoke({"messages": [Message.text_message("add")]}, owner_cfg(tid, ALICE))
    return app, tid, await _snapshot(checkpointer, tid)


async def _snapshot(cp, tid: str) -> dict[str, Any]:
    mine = {"thread_id": tid, "user_id": ALICE}
    state = await cp.aget_state(mine)
    tool_msg = next(m for m in state.context if m.role == "assistant" and m.tools_calls)
    return {
        "context": [(m.message_id, m.role, m.text()) for m in state.context],
        "status": str(state.execution_meta.status),
        "messages": [m.message_id for m in await cp.alist_messages(mine)],
        "ledger": await cp.aget_tool_result(mine, f"{tool_msg.message_id}:c1"),
        "ledger_key": f"{tool_msg.message_id}:c1",
        "stop": await cp.ais_stop_requested(mine),
        "owner": await cp.aget_thread_owner(tid, mine),
    }


def _forbidden(exc: BaseException) -> bool:
    return isinstance(exc, StorageError) and exc.error_code == "STORAGE_FORBIDDEN_001"


@pytest.mark.asyncio
async def test_another_user_is_refused_everywhere_and_changes_nothing(checkpointer, make_thread) -> None:
    cp = checkpointer
    app, tid, before = await _alice_thread(cp, make_thread)
    assert before["owner"] == ALICE and before["ledger"] is not None
    theirs = owner_cfg(tid, MALLORY)
    msg_id, key = before["context"][0][0], before["ledger_key"]

    async def astream_all() -> list[Any]:
        return [c async for c in app.astream({"messages": [Message.text_message("x")]}, dict(theirs))]

    calls: dict[str, Any] = {
        "ainvoke": lambda: app.ainvoke({"messages": [Message.text_message("mine now")]}, dict(theirs)),
        "ainvoke resume": lambda: app.ainvoke({}, dict(theirs)),
        "invoke": lambda: asyncio.to_thread(app.invoke, {"messages": [Message.text_message("x")]}, dict(theirs)),
        "astream": astream_all,
        "stream": lambda: asyncio.to_thread(lambda: list(app.stream({"messages": [Message.text_message("x")]},
                                                                     dict(theirs)))),
        "astop": lambda: app.astop(dict(theirs)),
        "stop": lambda: asyncio.to_thread(app.stop, dict(theirs)),
        "aget_state": lambda: cp.aget_state(dict(theirs)),
        "get_state": lambda: asyncio.to_thread(cp.get_state, dict(theirs)),
        "aget_state_cache": lambda: cp.aget_state_cache(dict(theirs)),
        "alist_messages": lambda: cp.alist_messages(dict(theirs)),
        "aget_message": lambda: cp.aget_message(dict(theirs), msg_id),
        "aget_thread": lambda: cp.aget_thread(dict(theirs)),
        "aget_thread_owner": lambda: cp.aget_thread_owner(tid, dict(theirs)),
        "aget_tool_result": lambda: cp.aget_tool_result(dict(theirs), key),
        "aget_tool_status": lambda: cp.aget_tool_status(dict(theirs), key),
        "aget_lease": lambda: cp.aget_lease(dict(theirs)),
        "ais_stop_requested": lambda: cp.ais_stop_requested(dict(theirs)),
        "aput_state": lambda: cp.aput_state(dict(theirs), cp.state_type()),
        "aput_messages": lambda: cp.aput_messages(dict(theirs), [Message.text_message("injected")]),
        "aput_tool_result": lambda: cp.aput_tool_result(dict(theirs), key, {"forged": True}),
        "aput_thread": lambda: cp.aput_thread(dict(theirs), ThreadInfo(thread_id=tid, thread_name="mine")),
        "aput_state_cache": lambda: cp.aput_state_cache(dict(theirs), cp.state_type()),
        "arequest_stop": lambda: cp.arequest_stop(dict(theirs)),
        "aclear_stop_request": lambda: cp.aclear_stop_request(dict(theirs)),
        "adelete_message": lambda: cp.adelete_message(dict(theirs), msg_id),
        "aclear_state": lambda: cp.aclear_state(dict(theirs)),
        "aclean_thread": lambda: cp.aclean_thread(dict(theirs)),
    }
    for name, call in calls.items():
        with pytest.raises(StorageError) as err:
            await call()
        assert _forbidden(err.value), (name, err.value)
        assert "alice" not in str(err.value), name  # the owner is not named
    # Listing is scoped to the caller, not refused.
    listed = await cp.alist_threads(dict(theirs))
    assert tid not in {str(t.thread_id) for t in listed}
    assert await _snapshot(cp, tid) == before
    # The owner, under the same policy, goes on as before.
    out = await app.ainvoke({"messages": [Message.text_message("add")]}, owner_cfg(tid, ALICE))
    assert out["messages"][-1].text() == "sum is 3"


@pytest.mark.asyncio
async def test_a_new_thread_becomes_the_callers(make_thread) -> None:
    cp: InMemoryCheckpointer[AgentState] = InMemoryCheckpointer()
    app = tool_graph(checkpointer=cp)
    tid = make_thread("new")
    await app.ainvoke({"messages": [Message.text_message("add")]}, owner_cfg(tid, MALLORY))
    assert await cp.aget_thread_owner(tid, owner_cfg(tid, MALLORY)) == MALLORY
    with pytest.raises(StorageError) as err:
        await cp.aget_state(owner_cfg(tid, ALICE))
    assert _forbidden(err.value)


@pytest.mark.asyncio
async def test_scope_none_does_not_loosen_an_isolating_checkpointer(make_thread) -> None:
    cp: InMemoryCheckpointer[AgentState] = InMemoryCheckpointer(enforce_user_isolation=True)
    app = tool_graph(checkpointer=cp)
    tid = make_thread("iso")
    await app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": tid, "user_id": ALICE})
    loose = {"thread_id": tid, "user_id": MALLORY, "authz": build_authz(MALLORY, scope="none")}
    assert await cp.aget_state(dict(loose)) is None  # 10xGraph: Alice's state
    with pytest.raises(StorageError) as err:
        await app.ainvoke({"messages": [Message.text_message("x")]}, dict(loose))
    assert err.value.error_code == "STORAGE_FORBIDDEN_001"


@pytest.mark.asyncio
@pytest.mark.parametrize("authz, why", [
    (build_authz(ALICE, scope="owner"), "another user"),        # claims Alice, config says Mallory
    ({"user_id": MALLORY, "scope": "owners"}, "scope"),          # a typo must not mean "no policy"
    ("owner", "must be a dict"),
])
async def test_a_malformed_or_contradicting_block_is_refused_before_anything(make_thread, authz, why) -> None:
    cp: InMemoryCheckpointer[AgentState] = InMemoryCheckpointer()
    app = tool_graph(checkpointer=cp)
    tid = make_thread("bad")
    bad = {"thread_id": tid, "user_id": MALLORY, "authz": authz}
    with pytest.raises(StorageError, match=why) as err:
        await app.ainvoke({"messages": [Message.text_message("add")]}, bad)
    assert err.value.error_code == "STORAGE_FORBIDDEN_003"
    with pytest.raises(StorageError):
        await cp.aget_state(dict(bad))
    assert await cp.aget_state({"thread_id": tid}) is None  # nothing was written


DIFF = """
import asyncio
from tenxgraph.core.authz import build_authz
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils import END

def cfg(user):
    return {"thread_id": "t1", "user_id": user, "authz": build_authz(user, scope="owner")}

async def outcome(coro):
    try:
        value = await coro
    except Exception as exc:
        return ["raised", type(exc).__name__]
    return ["returned", None if value is None else type(value).__name__]

async def main():
    cp = InMemoryCheckpointer()
    g = StateGraph(AgentState)
    g.add_node("n", lambda state: [Message.text_message("reply", role="assistant")])
    g.set_entry_point("n"); g.add_edge("n", END)
    app = g.compile(checkpointer=cp)
    await app.ainvoke({"messages": [Message.text_message("alice says")]}, cfg("alice"))
    out = {
        "invoke": await outcome(app.ainvoke({"messages": [Message.text_message("mallory says")]}, cfg("mallory"))),
        "aput_state": await outcome(cp.aput_state(cfg("mallory"), AgentState())),
        "aget_state": await outcome(cp.aget_state(cfg("mallory"))),
    }
    state = await cp.aget_state({"thread_id": "t1", "user_id": "alice"})
    out["alice_context"] = [m.text() for m in state.context]
    emit(out)

asyncio.run(main())
"""


def test_owner_scope_refuses_writes_as_10xgraph_and_reads_too(oracle) -> None:
    theirs, ours = oracle.run_both(DIFF)
    # Writes: both refuse another user under the owner scope, and Alice's thread is unchanged.
    for key in ("invoke", "aput_state", "alice_context"):
        assert ours[key] == theirs[key], key
    assert ours["invoke"] == ["raised", "StorageError"] and ours["alice_context"] == ["alice says", "reply"]
    # Reads: 10xGraph answers None (as for no thread); ours refuses (documented difference).
    assert theirs["aget_state"] == ["returned", None]
    assert ours["aget_state"] == ["raised", "StorageError"]
