"""User isolation (``enforce_user_isolation=True``, PgCheckpointer's default; the option of every
checkpointer): another user, on the owner's thread, reads nothing of it through any public read,
changes nothing of it through any write or run (its lease row included), and learns nothing of
the owner's runs from a busy error. Every test runs on memory, SQLite, Postgres and
Postgres+Redis, each with isolation on."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import StorageError, ThreadBusyError
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.utils.interrupt import interrupt
from tenxgraph.utils.thread_info import ThreadInfo
from tests_py.conftest import BACKENDS, make_checkpointer
from tests_py.tool_graphs import call, tool_graph

pytestmark = pytest.mark.asyncio

ALICE, BOB = "alice", "bob"


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
def isolated(request: pytest.FixtureRequest, tmp_path: Path) -> BaseCheckpointer:
    return make_checkpointer(request.param, request, tmp_path, enforce_user_isolation=True)


def cfg(thread_id: str, user: str | None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"thread_id": thread_id, **extra}
    if user is not None:
        c["user_id"] = user
    return c


async def alice_ran_a_tool(cp: BaseCheckpointer, thread_id: str) -> tuple[str, str]:
    """Alice's completed run on ``thread_id`` with one recorded tool call: (ledger key, secret)."""
    secret = f"alice-private-{uuid.uuid4().hex}"

    async def lookup(order: int) -> str:
        return secret

    app = tool_graph(AgentState, [lookup], [[call("c1", "lookup", {"order": 7})]], checkpointer=cp)
    await app.ainvoke({"messages": [Message.text_message("look it up")]}, cfg(thread_id, ALICE, run_id="alice-run-1"))
    state = await cp.aget_state(cfg(thread_id, ALICE))
    asking = next(m for m in state.context if m.tools_calls)
    key = f"{asking.message_id}:c1"
    assert secret in json.dumps(await cp.aget_tool_result(cfg(thread_id, ALICE), key))
    return key, secret


def lease_row(lease: dict[str, Any] | None) -> dict[str, Any] | None:
    """The lease without its relative expiry, which moves with the clock."""
    return None if lease is None else {k: v for k, v in lease.items() if k != "expires_in"}


async def test_another_user_cannot_read_tool_results(isolated: BaseCheckpointer, make_thread: Any) -> None:
    tid = make_thread("iso")
    key, _secret = await alice_ran_a_tool(isolated, tid)
    assert await isolated.aget_tool_result(cfg(tid, BOB), key) is None
    assert await isolated.aget_tool_result(cfg(tid, None), key) is None  # the anonymous user
    assert await isolated.aget_tool_result(cfg(tid, ALICE), key) is not None


async def test_another_user_cannot_read_tool_status(isolated: BaseCheckpointer, make_thread: Any) -> None:
    tid = make_thread("iso")
    key, _secret = await alice_ran_a_tool(isolated, tid)
    assert await isolated.aget_tool_status(cfg(tid, BOB), key) is None
    assert await isolated.aget_tool_status(cfg(tid, None), key) is None
    assert await isolated.aget_tool_status(cfg(tid, ALICE), key) == "completed"


async def test_another_user_cannot_read_the_lease(isolated: BaseCheckpointer, make_thread: Any) -> None:
    tid = make_thread("iso")
    await alice_ran_a_tool(isolated, tid)
    assert await isolated.aget_lease(cfg(tid, BOB)) is None
    assert await isolated.aget_lease(cfg(tid, None)) is None
    mine = await isolated.aget_lease(cfg(tid, ALICE))
    assert mine is not None and mine["holder"] == "alice-run-1" and mine["released"]


async def test_another_user_cannot_learn_the_thread_owner(isolated: BaseCheckpointer, make_thread: Any) -> None:
    tid = make_thread("iso")
    await alice_ran_a_tool(isolated, tid)
    assert await isolated.aget_thread_owner(tid, cfg(tid, BOB)) is None
    # Without a config the caller is the anonymous user, as for every other method.
    assert await isolated.aget_thread_owner(tid) is None
    assert await isolated.aget_thread_owner(tid, cfg(tid, ALICE)) == ALICE
    # The config's user decides, not its thread id (the method names its thread itself).
    assert await isolated.aget_thread_owner(tid, {"user_id": ALICE}) == ALICE


async def test_listing_threads_shows_only_the_callers_threads(isolated: BaseCheckpointer, make_thread: Any) -> None:
    mine, theirs, anon = make_thread("alice"), make_thread("bob"), make_thread("anon")
    await isolated.aput_state(cfg(mine, ALICE), AgentState())
    await isolated.aput_state(cfg(theirs, BOB), AgentState())
    await isolated.aput_state(cfg(anon, None), AgentState())
    assert [t.thread_id for t in await isolated.alist_threads({"user_id": BOB})] == [theirs]
    assert [t.thread_id for t in await isolated.alist_threads({"user_id": ALICE})] == [mine]
    assert [t.thread_id for t in await isolated.alist_threads({"user_id": ALICE}, search="bob")] == []


async def test_listing_threads_without_a_user_shows_only_the_anonymous_users_threads(
    isolated: BaseCheckpointer, make_thread: Any
) -> None:
    mine, anon = make_thread("alice"), make_thread("anon")
    await isolated.aput_state(cfg(mine, ALICE), AgentState())
    await isolated.aput_state(cfg(anon, None), AgentState())
    for config in ({}, {"thread_id": mine}, {"user_id": None}, {"user_id": ""}):
        listed = await isolated.alist_threads(config)
        assert [(t.thread_id, t.user_id) for t in listed] == [(anon, "anonymous")], config


async def test_without_isolation_listing_without_a_user_shows_every_thread(
    request: pytest.FixtureRequest, tmp_path: Path, make_thread: Any
) -> None:
    cp = make_checkpointer("memory", request, tmp_path, enforce_user_isolation=False)
    mine, anon = make_thread("alice"), make_thread("anon")
    await cp.aput_state(cfg(mine, ALICE), AgentState())
    await cp.aput_state(cfg(anon, None), AgentState())
    assert {t.thread_id for t in await cp.alist_threads({})} == {mine, anon}
    assert await cp.aget_thread_owner(mine) == ALICE


def paused_app(cp: BaseCheckpointer) -> Any:
    async def ask(state: AgentState) -> str:
        return f"approved: {interrupt('approve?')}"

    g = StateGraph(AgentState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=cp)


@pytest.mark.parametrize("bobs_input", ["new-input", "empty", "resume"])
async def test_another_users_invoke_leaves_the_lease_row_unchanged(
    isolated: BaseCheckpointer, make_thread: Any, bobs_input: str
) -> None:
    tid = make_thread("iso")
    app = paused_app(isolated)
    await app.ainvoke({"messages": [Message.text_message("refund me")]}, cfg(tid, ALICE, run_id="alice-run-1"))
    before = lease_row(await isolated.aget_lease(cfg(tid, ALICE)))
    state_before = (await isolated.aget_state(cfg(tid, ALICE))).model_dump(mode="json")
    assert before is not None and before["holder"] == "alice-run-1"
    payload = {"new-input": {"messages": [Message.text_message("mine now")]}, "empty": {},
               "resume": {"resume": "yes"}}[bobs_input]
    with pytest.raises(StorageError) as exc:
        await app.ainvoke(payload, cfg(tid, BOB, run_id="bob-run-1"))
    # The error aput_state gives a non-owner, and nothing of alice's in it.
    assert exc.value.error_code == "STORAGE_FORBIDDEN_001" and not isinstance(exc.value, ThreadBusyError)
    assert "alice" not in str(exc.value) + repr(exc.value.context)
    with pytest.raises(StorageError) as direct:
        await isolated.aput_state(cfg(tid, BOB), AgentState())
    assert direct.value.error_code == exc.value.error_code
    assert lease_row(await isolated.aget_lease(cfg(tid, ALICE))) == before
    assert (await isolated.aget_state(cfg(tid, ALICE))).model_dump(mode="json") == state_before
    # Alice's paused run is still hers to resume.
    done = await app.ainvoke({"resume": "yes"}, cfg(tid, ALICE), response_granularity="full")
    assert done["state"].execution_meta.status == "completed"


@pytest.mark.parametrize("on_busy", ["reject", "wait", "interrupt"])
async def test_another_users_invoke_on_a_running_thread_is_refused_without_touching_the_run(
    isolated: BaseCheckpointer, make_thread: Any, on_busy: str
) -> None:
    tid = make_thread("iso")
    started, release = asyncio.Event(), asyncio.Event()

    async def work(state: AgentState) -> str:
        started.set()
        await release.wait()
        return "finished"

    g = StateGraph(AgentState)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    app = g.compile(checkpointer=isolated)
    alice = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("go")]},
                                            cfg(tid, ALICE, run_id="alice-run-busy", lease_ttl=60),
                                            response_granularity="full"))
    try:
        await asyncio.wait_for(started.wait(), timeout=60)
        held = lease_row(await isolated.aget_lease(cfg(tid, ALICE)))
        assert held is not None and held["holder"] == "alice-run-busy" and not held["released"]
        with pytest.raises(StorageError) as exc:
            await asyncio.wait_for(
                app.ainvoke({"messages": [Message.text_message("mine now")]},
                            cfg(tid, BOB, run_id="bob-run-busy", on_busy=on_busy, busy_timeout=30)),
                timeout=20)  # refused at once, not after busy_timeout
        assert exc.value.error_code == "STORAGE_FORBIDDEN_001" and not isinstance(exc.value, ThreadBusyError)
        assert "alice-run-busy" not in str(exc.value) + repr(exc.value.context)
        assert lease_row(await isolated.aget_lease(cfg(tid, ALICE))) == held
    finally:
        release.set()
    done = await asyncio.wait_for(alice, timeout=60)
    # Not preempted, not stopped: alice's run finished its node.
    assert done["state"].execution_meta.status == "completed"
    assert done["messages"][-1].text() == "finished"


async def test_a_busy_error_does_not_reveal_another_users_holder(isolated: BaseCheckpointer, make_thread: Any) -> None:
    """Alice's run holds the lease of a new thread and has not written it yet (held there by a
    failpoint), so no owner is recorded: bob is told the thread is busy, and nothing about whose
    run holds it."""
    tid = make_thread("iso")
    g = StateGraph(AgentState)
    g.add_node("work", lambda state: "done")
    g.add_edge(START, "work")
    g.add_edge("work", END)
    app = g.compile(checkpointer=isolated)
    alice = asyncio.create_task(app.ainvoke(
        {"messages": [Message.text_message("go")]},
        cfg(tid, ALICE, run_id="alice-run-hidden", lease_ttl=60, failpoints=f"after_lease:{tid}=delay(20000)")))
    try:
        # The store's own view (no user scope), to know alice's run holds the lease.
        for _ in range(600):
            raw = await isolated._native.lease_get(tid)
            if raw is not None and not json.loads(raw)["released"]:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("alice's run never took the lease")
        holder = json.loads(raw)
        with pytest.raises(ThreadBusyError) as busy:
            await app.ainvoke({"messages": [Message.text_message("me too")]}, cfg(tid, BOB, run_id="bob-run-2"))
        text = str(busy.value) + repr(busy.value.context)
        assert busy.value.error_code == "STORAGE_BUSY_002" and tid in text
        for secret in ("alice-run-hidden", holder["host"], str(holder["pid"])):
            assert secret not in text, secret
        assert not {"holder_run_id", "holder_pid", "lease_token"} & set(busy.value.context)
        assert await isolated.aget_lease(cfg(tid, BOB)) is None
    finally:
        alice.cancel()
        await asyncio.gather(alice, return_exceptions=True)


async def test_another_users_writes_change_nothing_of_the_owners(isolated: BaseCheckpointer, make_thread: Any) -> None:
    tid = make_thread("iso")
    key, _secret = await alice_ran_a_tool(isolated, tid)
    owner = cfg(tid, ALICE)
    before = {
        "state": (await isolated.aget_state(owner)).model_dump(mode="json"),
        "messages": [m.model_dump(mode="json") for m in await isolated.alist_messages(owner)],
        "result": await isolated.aget_tool_result(owner, key),
        "thread": (await isolated.aget_thread(owner)).model_dump(mode="json"),
        "lease": lease_row(await isolated.aget_lease(owner)),
    }
    first_id = before["messages"][0]["message_id"]
    bob = cfg(tid, BOB)
    writes = {
        "aput_state": isolated.aput_state(bob, AgentState()),
        "aput_tool_result": isolated.aput_tool_result(bob, key, {"__kind__": "raw", "value": "forged"}),
        "aput_messages": isolated.aput_messages(bob, [Message.text_message("forged")]),
        "adelete_message": isolated.adelete_message(bob, first_id),
        "aput_thread": isolated.aput_thread(bob, ThreadInfo(thread_id=tid, thread_name="forged")),
        "aclear_state": isolated.aclear_state(bob),
        "aclean_thread": isolated.aclean_thread(bob),
    }
    for name, write in writes.items():
        with pytest.raises(StorageError) as exc:
            await write
        assert exc.value.error_code == "STORAGE_FORBIDDEN_001", name
    after = {
        "state": (await isolated.aget_state(owner)).model_dump(mode="json"),
        "messages": [m.model_dump(mode="json") for m in await isolated.alist_messages(owner)],
        "result": await isolated.aget_tool_result(owner, key),
        "thread": (await isolated.aget_thread(owner)).model_dump(mode="json"),
        "lease": lease_row(await isolated.aget_lease(owner)),
    }
    assert after == before
