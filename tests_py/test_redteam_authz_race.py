"""Red team (session 9): the ``config["authz"]`` owner scope must hold when another user creates
the thread *between* the scope check and the run's first write.

The owner check used to run once, in Python, before the run (``check_authz``): a brand-new thread
has no owner, so the check lets the call through, and on a checkpointer that does not isolate
users by itself nothing looked again. Two callers on the same new thread id (two API requests
at once) then both pass; the second appends its messages to the thread the first just created
and now owns, and runs its model and tools on the owner's history.

The race is made deterministic with an input validator (it runs after the authz check and before
the run reads or writes anything): Mallory's validator lets Alice's whole turn run to completion
first. Every backend, isolation off (the ``checkpointer`` fixture).
"""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.authz import build_authz
from tenxgraph.core.exceptions import StorageError
from tenxgraph.utils import CallbackManager
from tenxgraph.utils.callbacks import BaseValidator

ALICE, MALLORY = "alice", "mallory"


def owner_cfg(tid: str, user: str) -> dict[str, Any]:
    return {"thread_id": tid, "user_id": user, "authz": build_authz(user, scope="owner")}


class LetOtherGoFirst(BaseValidator):
    """On Mallory's input, runs Alice's whole turn before letting Mallory's run go on."""

    def __init__(self) -> None:
        self.other: Any = None
        self.fired = False

    async def validate(self, messages: list[Message]) -> bool:
        if self.other is not None and any(m.text() == "mallory's" for m in messages):
            other, self.other = self.other, None
            await other()
            self.fired = True
        return True


def graph(cp: Any, validator: BaseValidator, seen: list[list[str]]) -> Any:
    async def model(state: AgentState) -> Message:
        seen.append([m.text() for m in state.context])
        return Message.text_message(f"answer {len(seen)}", role="assistant")

    mgr = CallbackManager()
    mgr.register_input_validator(validator)
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=cp, callback_manager=mgr)


@pytest.mark.asyncio
async def test_owner_scope_holds_when_another_user_creates_the_thread_during_the_check(
    checkpointer, make_thread
) -> None:
    cp = checkpointer
    tid = make_thread("authz-race")
    gate = LetOtherGoFirst()
    seen: list[list[str]] = []
    app = graph(cp, gate, seen)

    async def alice_turn() -> None:
        await app.ainvoke({"messages": [Message.text_message("alice's secret")]}, owner_cfg(tid, ALICE))

    gate.other = alice_turn
    with pytest.raises(StorageError) as info:
        await app.ainvoke({"messages": [Message.text_message("mallory's")]}, owner_cfg(tid, MALLORY))
    assert gate.fired, "the barrier did not run: the test proves nothing"
    assert info.value.error_code == "STORAGE_FORBIDDEN_001"
    # Mallory's model never saw Alice's history, and Alice's thread is exactly her turn.
    assert seen == [["alice's secret"]]
    state = await cp.aget_state({"thread_id": tid, "user_id": ALICE})
    assert [m.text() for m in state.context] == ["alice's secret", "answer 1"]
    assert await cp.aget_thread_owner(tid, {"thread_id": tid, "user_id": ALICE}) == ALICE


@pytest.mark.asyncio
@pytest.mark.parametrize("entry", ["ainvoke", "astream", "aput_state"])
async def test_owner_scope_holds_on_every_entry_point_when_the_thread_is_created_after_the_check(
    checkpointer, make_thread, monkeypatch, entry: str
) -> None:
    """The same race with no validator in between: Alice's turn runs right after the scope
    check's own owner read (which answered "nobody") and before Mallory's call goes on."""
    cp = checkpointer
    tid = make_thread(f"authz-race-{entry}")
    seen: list[list[str]] = []
    app = graph(cp, LetOtherGoFirst(), seen)
    import tenxgraph.storage.checkpointer.authz_guard as guard

    real_owner = guard._owner
    fired: list[bool] = []

    async def owner_then_alice(checkpointer: Any, thread_id: str) -> str | None:
        owner = await real_owner(checkpointer, thread_id)
        if not fired:
            fired.append(True)
            await app.ainvoke({"messages": [Message.text_message("alice's secret")]}, owner_cfg(tid, ALICE))
        return owner

    monkeypatch.setattr(guard, "_owner", owner_then_alice)
    theirs = owner_cfg(tid, MALLORY)
    with pytest.raises(StorageError) as info:
        if entry == "ainvoke":
            await app.ainvoke({"messages": [Message.text_message("mallory's")]}, theirs)
        elif entry == "astream":
            async for _ in app.astream({"messages": [Message.text_message("mallory's")]}, theirs):
                pass
        else:
            await cp.aput_state(theirs, AgentState(context=[Message.text_message("mallory's")]))
    assert fired
    assert info.value.error_code == "STORAGE_FORBIDDEN_001"
    assert seen == [["alice's secret"]]
    state = await cp.aget_state({"thread_id": tid, "user_id": ALICE})
    assert [m.text() for m in state.context] == ["alice's secret", "answer 1"]
    assert await cp.aget_thread_owner(tid, {"thread_id": tid, "user_id": ALICE}) == ALICE


@pytest.mark.asyncio
async def test_a_busy_error_names_no_holder_to_an_owner_scoped_caller_who_raced_the_check(
    checkpointer, make_thread, monkeypatch
) -> None:
    """Alice's run is in flight on her thread; Mallory's call got past the scope check (the race
    above: the check read the thread before Alice's first commit). Her run is refused as busy,
    and the error must not describe Alice's run (run id, pid, lease token) to her."""
    import asyncio

    import tenxgraph.storage.checkpointer.authz_guard as guard
    from tenxgraph.core.exceptions import ThreadBusyError

    cp = checkpointer
    tid = make_thread("authz-busy")
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(state: AgentState) -> Message:
        started.set()
        await release.wait()
        return Message.text_message("alice done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", slow)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=cp)
    alice = asyncio.create_task(app.ainvoke({"messages": [Message.text_message("alice's")]}, owner_cfg(tid, ALICE)))
    try:
        await asyncio.wait_for(started.wait(), 30)

        async def nobody(checkpointer: Any, thread_id: str) -> str | None:
            return None  # what the check read before Alice's first commit

        monkeypatch.setattr(guard, "_owner", nobody)
        with pytest.raises(StorageError) as info:
            await app.ainvoke({"messages": [Message.text_message("mallory's")]}, owner_cfg(tid, MALLORY))
        # Refused as another user's thread by the lease take itself (as under isolation), or as
        # busy: either way nothing of Alice's run is described.
        err = info.value
        assert err.error_code == "STORAGE_FORBIDDEN_001" or isinstance(err, ThreadBusyError), err
        assert "holder_run_id" not in err.context and "lease_token" not in err.context, err.context
    finally:
        release.set()
        await asyncio.wait_for(alice, 30)
    state = await cp.aget_state({"thread_id": tid, "user_id": ALICE})
    assert [m.text() for m in state.context] == ["alice's", "alice done"]


@pytest.mark.asyncio
async def test_a_raced_owner_scoped_resume_does_not_move_the_owners_lease_row(checkpointer, make_thread, monkeypatch) -> None:
    """Mallory's ``ainvoke({})`` takes the lease before it loads (a resume). Past a raced scope
    check it was refused only after its take had committed: the owner's lease row carried
    Mallory's run as holder and a new fencing token. As under an isolating store, the take itself
    now refuses another user's thread and leaves the row as it was."""
    import tenxgraph.storage.checkpointer.authz_guard as guard

    cp = checkpointer
    tid = make_thread("authz-lease")
    app = graph(cp, LetOtherGoFirst(), [])
    await app.ainvoke({"messages": [Message.text_message("alice's")]}, owner_cfg(tid, ALICE))
    mine = {"thread_id": tid, "user_id": ALICE}
    before = await cp.aget_lease(dict(mine))

    async def nobody(checkpointer: Any, thread_id: str) -> str | None:
        return None

    monkeypatch.setattr(guard, "_owner", nobody)
    with pytest.raises(StorageError) as info:
        await app.ainvoke({}, owner_cfg(tid, MALLORY))
    assert info.value.error_code == "STORAGE_FORBIDDEN_001"
    after = await cp.aget_lease(dict(mine))
    fields = ("token", "holder", "pid", "released")
    assert {k: after[k] for k in fields} == {k: before[k] for k in fields}
