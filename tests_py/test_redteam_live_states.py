"""Red team of live states kept between runs (tenxgraph._live_states).

The reference is a fresh process: a turn on a thread must see what a process that loads the thread
from the store sees (here: a graph with ``live_states=0``, or ``aget_state`` just before the turn).
Each test below fails while a kept live state can carry something the store does not hold into the
thread's next turn: an object somebody else still holds after the run ended, or an index that no
longer describes the context.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.utils import interrupt


class Ticket(AgentState):
    decision: dict = {}
    summary: str = ""
    cancelled: int = 0


def user(text: str) -> Message:
    return Message.text_message(text, role="user")


def one_node(cp: Any, node: Any, **compile_kw: Any) -> Any:
    g = StateGraph(Ticket())
    g.add_node("n", node)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    return g.compile(checkpointer=cp, **compile_kw)


def turn_of(state: AgentState) -> int:
    return sum(1 for m in state.context if m.role == "user")


async def stored_view(cp: Any, thread: str) -> tuple[dict[str, Any], list[str]]:
    """What a fresh process would start the thread's next turn from."""
    st = await cp.aget_state({"thread_id": thread})
    return st.model_dump(include={"decision", "summary", "cancelled"}), [m.text() for m in st.context]


@pytest.mark.asyncio
@pytest.mark.parametrize("live_states", [None, 0], ids=["kept", "fresh"])
async def test_a_resume_answer_the_caller_changes_afterwards_stays_out_of_the_next_turn(
    checkpointer: Any, make_thread: Any, live_states: Any
) -> None:
    # interrupt() hands the node the caller's resume object; a node that keeps it in the state
    # (the usual `state.decision = interrupt(...)`) put the caller's dict into the live state kept
    # for the next turn, so the caller's later change reached that turn (and was then stored).
    seen: list[dict[str, Any]] = []

    async def approve(state: Ticket, config: dict[str, Any]) -> Ticket:
        seen.append(dict(state.decision))
        if turn_of(state) == 1 and not state.decision:
            state.decision = interrupt("approve the refund?")
        state.context.append(Message.text_message(f"done {turn_of(state)}", role="assistant"))
        return state

    app, t = one_node(checkpointer, approve, live_states=live_states), make_thread()
    await app.ainvoke({"messages": [user("refund 40 EUR")]}, {"thread_id": t})
    answer = {"approved": True}
    await app.ainvoke({"resume": answer}, {"thread_id": t})
    answer["approved"] = False  # the caller reuses its dict (a form object, a request body)
    await app.ainvoke({"messages": [user("thanks")]}, {"thread_id": t})
    assert seen[-1] == {"approved": True}
    assert (await checkpointer.aget_state({"thread_id": t})).decision == {"approved": True}


@pytest.mark.asyncio
@pytest.mark.parametrize("live_states", [None, 0], ids=["kept", "fresh"])
async def test_a_state_changed_after_its_run_ended_is_not_what_the_next_turn_starts_from(
    checkpointer: Any, make_thread: Any, live_states: Any
) -> None:
    # A node hands its state to a background task (a summariser, 10xGraph's BackgroundTaskManager
    # pattern) that changes it after the run's last commit. Nothing of that is stored; the kept
    # live state has it, and its appended message even counts as stored (the cursor), so it is
    # never written while the model of this process keeps seeing it.
    go, done = asyncio.Event(), asyncio.Event()
    seen: list[tuple[str, list[str]]] = []
    tasks: list[asyncio.Task[None]] = []

    async def node(state: Ticket, config: dict[str, Any]) -> Ticket:
        seen.append((state.summary, [m.text() for m in state.context]))
        if turn_of(state) == 1:
            async def summarise_later() -> None:
                await go.wait()
                state.summary = "summarised in the background"
                state.context.append(Message.text_message("background note", role="assistant"))
                done.set()

            tasks.append(asyncio.get_running_loop().create_task(summarise_later()))
        state.context.append(Message.text_message(f"reply {turn_of(state)}", role="assistant"))
        return state

    app, t = one_node(checkpointer, node, live_states=live_states), make_thread()
    await app.ainvoke({"messages": [user("one")]}, {"thread_id": t})
    go.set()
    await done.wait()
    fields, texts = await stored_view(checkpointer, t)
    await app.ainvoke({"messages": [user("two")]}, {"thread_id": t})
    assert seen[-1] == (fields["summary"], texts + ["two"]) == ("", ["one", "reply 1", "two"])
    stored = await checkpointer.aget_state({"thread_id": t})
    assert [m.text() for m in stored.context] == ["one", "reply 1", "two", "reply 2"]
    assert stored.summary == ""


@pytest.mark.asyncio
@pytest.mark.parametrize("live_states", [None, 0], ids=["kept", "fresh"])
async def test_a_stopped_node_s_cleanup_after_the_stop_commit_is_not_part_of_the_next_turn(
    checkpointer: Any, make_thread: Any, live_states: Any
) -> None:
    # stop() cancels the node's task without waiting for it: the run commits the stop and
    # returns (stopped), its live state is kept, and the cancelled node's cleanup (here after an
    # await, as a call telling a remote job to stop would be) changes that kept state afterwards.
    started, cleanup, cleaned = asyncio.Event(), asyncio.Event(), asyncio.Event()
    seen: list[tuple[int, list[str]]] = []

    async def node(state: Ticket, config: dict[str, Any]) -> Ticket:
        seen.append((state.cancelled, [m.text() for m in state.context]))
        if turn_of(state) == 1:
            try:
                started.set()
                await asyncio.Event().wait()  # a long job
            except asyncio.CancelledError:
                await cleanup.wait()
                state.cancelled += 1
                state.context.append(Message.text_message("cancelled the job", role="assistant"))
                cleaned.set()
                raise
        state.context.append(Message.text_message(f"reply {turn_of(state)}", role="assistant"))
        return state

    app, t = one_node(checkpointer, node, live_states=live_states), make_thread()
    run = asyncio.create_task(app.ainvoke({"messages": [user("one")]}, {"thread_id": t}))
    await started.wait()
    await app.astop({"thread_id": t})
    await run  # the stop is committed and the run has returned
    cleanup.set()
    await cleaned.wait()
    fields, texts = await stored_view(checkpointer, t)
    await app.ainvoke({"messages": [user("two")]}, {"thread_id": t})
    assert seen[-1] == (fields["cancelled"], texts + ["two"]) == (0, ["one", "two"])
    stored = await checkpointer.aget_state({"thread_id": t})
    assert stored.cancelled == 0 and [m.text() for m in stored.context] == ["one", "two", "reply 2"]


@pytest.mark.asyncio
@pytest.mark.parametrize("live_states", [None, 0], ids=["kept", "fresh"])
async def test_a_message_renamed_in_place_does_not_hide_a_later_message_with_its_old_id(
    checkpointer: Any, make_thread: Any, live_states: Any
) -> None:
    # The context index travels with the kept state. A node that gives the last message a new id
    # in place gets the context rewritten at its step (stored under the new id), but the kept
    # index still holds the old id: at the next turn a message with that id is taken for a
    # duplicate and dropped. A fresh load (and 10xGraph 0.10, run: its add_messages appends it)
    # keeps it.
    async def draft(state: Ticket, config: dict[str, Any]) -> Any:
        text = "draft" if turn_of(state) == 1 else "draft again"
        return [Message.text_message(text, role="assistant", message_id=f"d-{config['thread_id']}")]

    async def finalise(state: Ticket, config: dict[str, Any]) -> Ticket:
        last = state.context[-1]
        if last.text() == "draft":
            last.message_id = f"f-{config['thread_id']}"
        return state

    g = StateGraph(Ticket())
    g.add_node("draft", draft)
    g.add_node("finalise", finalise)
    g.add_edge(START, "draft")
    g.add_edge("draft", "finalise")
    g.add_edge("finalise", END)
    app, t = g.compile(checkpointer=checkpointer, live_states=live_states), make_thread()
    await app.ainvoke({"messages": [user("u0")]}, {"thread_id": t})
    await app.ainvoke({"messages": [user("u1")]}, {"thread_id": t})
    stored = await checkpointer.aget_state({"thread_id": t})
    assert [m.text() for m in stored.context] == ["u0", "draft", "u1", "draft again"]
    assert [str(m.message_id) for m in stored.context if m.role == "assistant"] == [f"f-{t}", f"d-{t}"]
