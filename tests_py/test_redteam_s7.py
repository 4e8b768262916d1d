"""Hostile pass over session 6's additions (session 7): each test here failed on the code before
its fix. Graph swaps after compile, lifecycle hooks around refused starts."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import StorageError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.utils import CallbackManager, GraphLifecycleHook
from tests_py.conftest import make_checkpointer
from tests_py.tool_graphs import call, route, scripted_model, tool_graph, tool_texts


def _counting_tool(count: dict[str, int]) -> Any:
    def charge(amount: int) -> str:
        """Charges ``amount``."""
        count["n"] += 1
        return f"charged {amount}"

    return charge


@pytest.mark.asyncio
async def test_override_after_compile_swaps_a_tool_node_for_a_plain_node(checkpointer: Any, make_thread: Any) -> None:
    """The Rust loop drove the replaced node as a tool node still (AttributeError
    'function' object has no attribute 'takes_state'): the plain function now runs."""
    count = {"n": 0}
    app = tool_graph(AgentState, [_counting_tool(count)], [[call("c1", "charge", {"amount": 3})]],
                     checkpointer=checkpointer)

    def plain(state: AgentState) -> Message:
        return Message.text_message("plain ran", role="assistant")

    app.override_node("tools", plain)
    out = await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": make_thread()})
    assert [m.text() for m in out["messages"]][-2:] == ["plain ran", "done"]
    assert count["n"] == 0


@pytest.mark.asyncio
async def test_override_after_compile_swaps_a_plain_node_for_a_tool_node_which_uses_the_ledger(
    checkpointer: Any, make_thread: Any
) -> None:
    """The other way round the loop called the ToolNode as a plain function (NODE_001 'ToolNode'
    object is not callable): now its tools run through the handler and are recorded, so running
    the tool node again on the same state replays the result instead of charging again."""
    count = {"n": 0}
    g = StateGraph(AgentState)
    g.add_node("model", scripted_model([[call("c1", "charge", {"amount": 3})]]))
    g.add_node("tools", lambda state: Message.text_message("placeholder", role="tool"))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=checkpointer)
    app.override_node("tools", ToolNode([_counting_tool(count)]))
    tid = make_thread()
    out = await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid})
    assert tool_texts(out["messages"]) == {"c1": "charged 3"}
    assert count["n"] == 1
    recorded = await checkpointer.aget_tool_result({"thread_id": tid},
                                                   f"{out['messages'][1].message_id}:c1")
    assert recorded is not None


class _Starts(GraphLifecycleHook):
    """Counts on_graph_start per user and stamps a message on the state it returns."""

    def __init__(self) -> None:
        self.users: list[str] = []

    async def on_graph_start(self, ctx: Any, state: Any) -> Any:
        self.users.append(str(ctx.config.get("user_id")))
        return state


def _hooked_app(checkpointer: Any, hook: GraphLifecycleHook) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", lambda s: Message.text_message(f"reply to {s.context[-1].text()}", role="assistant"))
    g.add_edge(START, "model")
    g.add_edge("model", END)
    mgr = CallbackManager()
    mgr.register_lifecycle_hook(hook)
    return g.compile(checkpointer=checkpointer, callback_manager=mgr)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_on_graph_start_does_not_fire_for_a_run_refused_by_user_isolation(
    kind: str, request: pytest.FixtureRequest, tmp_path: Any, make_thread: Any
) -> None:
    """Mallory's turn on Alice's thread is refused (STORAGE_FORBIDDEN_001); before, the refusal
    came at the input commit, after on_graph_start had fired for Mallory."""
    cp = make_checkpointer(kind, request, tmp_path, enforce_user_isolation=True)
    hook = _Starts()
    app = _hooked_app(cp, hook)
    tid = make_thread()
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid, "user_id": "alice"})
    for stream in (False, True):
        with pytest.raises(StorageError) as err:
            cfg = {"thread_id": tid, "user_id": "mallory"}
            if stream:
                async for _ in app.astream({"messages": [Message.text_message("x")]}, cfg):
                    pass
            else:
                await app.ainvoke({"messages": [Message.text_message("x")]}, cfg)
        assert err.value.error_code == "STORAGE_FORBIDDEN_001"
    assert hook.users == ["alice"]
    state = await cp.aget_state({"thread_id": tid, "user_id": "alice"})
    assert [m.text() for m in state.context] == ["hi", "reply to hi"]


class _StartStamps(GraphLifecycleHook):
    """At the first start of ``mine``, another turn commits (the thread moves between this run's
    load and its input commit); every start stamps ``note`` and adds a message."""

    def __init__(self, app_box: list[Any], tid: str) -> None:
        self.app_box, self.tid = app_box, tid
        self.starts: list[str] = []
        self.moved = False

    async def on_graph_start(self, ctx: Any, state: Any) -> Any:
        text = state.context[-1].text()
        self.starts.append(text)
        if text == "mine" and not self.moved:
            self.moved = True
            await self.app_box[0].ainvoke({"messages": [Message.text_message("other")]},
                                          {"thread_id": self.tid, "run_id": "other-run"})
        if text == "mine":
            state.note = f"stamped {len(self.starts)}"
            state.context.append(Message.text_message("hook says hi", role="assistant"))
        return state


class _NoteState(AgentState):
    note: str = ""


@pytest.mark.asyncio
async def test_on_graph_start_fires_once_when_the_input_commit_is_refused_in_a_race(
    checkpointer: Any, make_thread: Any
) -> None:
    """The refused optimistic start fired the hooks, then the start under the lease fired them
    again (``starts`` was first, mine, other, mine). Now once; what the hook changed still lands
    on the state the turn commits (its field and its message, once)."""
    tid = make_thread()
    box: list[Any] = []
    hook = _StartStamps(box, tid)
    g = StateGraph(_NoteState)
    g.add_node("model", lambda s: Message.text_message(f"reply to {s.context[-1].text()}", role="assistant"))
    g.add_edge(START, "model")
    g.add_edge("model", END)
    mgr = CallbackManager()
    mgr.register_lifecycle_hook(hook)
    app = g.compile(checkpointer=checkpointer, callback_manager=mgr)
    box.append(app)
    await app.ainvoke({"messages": [Message.text_message("first")]}, {"thread_id": tid})
    await app.ainvoke({"messages": [Message.text_message("mine")]}, {"thread_id": tid, "run_id": "my-run"})
    assert hook.starts == ["first", "mine", "other"]
    state = await checkpointer.aget_state({"thread_id": tid})
    texts = [m.text() for m in state.context]
    assert texts == ["first", "reply to first", "other", "reply to other", "mine", "hook says hi",
                     "reply to hook says hi"]
    assert state.note == "stamped 3"  # stamped once, after the other turn started


def _waiting_app(checkpointer: Any, started: dict[str, asyncio.Event], release: dict[str, asyncio.Event]) -> Any:
    """One node that signals it started (per thread) and waits for its release."""

    async def work(state: AgentState, config: dict[str, Any]) -> Message:
        tid = str(config["thread_id"])
        started[tid].set()
        await asyncio.wait_for(release[tid].wait(), timeout=120)
        return Message.text_message(f"finished {tid}", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
async def test_a_stop_for_thread_a_of_user_b_c_does_not_stop_thread_a_b_of_user_c(checkpointer: Any) -> None:
    """The stop key was ``f"{thread_id}:{user_id}"`` (10xGraph's too): thread ``a`` of user ``b:c``
    and thread ``a:b`` of user ``c`` shared it, so one user stopping their own run stopped the
    other user's. Now the parts are escaped when they hold ``:`` (ids without it keep 10xGraph's
    key, so its stop requests in a shared Redis still reach us)."""
    sfx = uuid.uuid4().hex[:6]
    victim = {"thread_id": f"{sfx}:b", "user_id": "c"}
    attacker = {"thread_id": sfx, "user_id": "b:c"}
    started = {victim["thread_id"]: asyncio.Event(), attacker["thread_id"]: asyncio.Event()}
    release = {victim["thread_id"]: asyncio.Event(), attacker["thread_id"]: asyncio.Event()}
    app = _waiting_app(checkpointer, started, release)
    runs = {name: asyncio.create_task(app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg), "full"))
            for name, cfg in (("victim", victim), ("attacker", attacker))}
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), timeout=60)
    assert (await app.astop(dict(attacker)))["running"] is True
    attacker_out = await asyncio.wait_for(runs["attacker"], timeout=60)  # its own run stops
    assert attacker_out["messages"][-1].text() != f"finished {attacker['thread_id']}"
    release[victim["thread_id"]].set()
    victim_out = await asyncio.wait_for(runs["victim"], timeout=60)
    assert victim_out["messages"][-1].text() == f"finished {victim['thread_id']}"
    assert str(victim_out["state"].execution_meta.status) == "completed"


@pytest.mark.asyncio
@pytest.mark.parametrize("garbage", ["garbage", 42], ids=["str", "int"])
async def test_a_message_that_would_not_load_back_is_not_stored(checkpointer: Any, make_thread: Any,
                                                                 garbage: Any) -> None:
    """A node that sets ``tools_calls`` to something that is not a list of dicts (assignments are
    not validated; a provider adapter or user code may) used to have it stored with a pydantic
    warning, and then every load of the thread raised ValidationError: the thread was dead, its
    earlier turns unreadable. Now the step is refused with a ValueError naming the message, the
    thread ends in the error status and stays loadable, and the next input runs."""
    turns = {"n": 0}

    async def model(state: AgentState) -> Message:
        msg = Message.text_message("calling", role="assistant")
        turns["n"] += 1
        if turns["n"] == 2:
            msg.tools_calls = [garbage]
        return msg

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    await app.ainvoke({"messages": [Message.text_message("first")]}, dict(cfg))
    with pytest.raises(ValueError, match="would not load back"):
        await app.ainvoke({"messages": [Message.text_message("second")]}, dict(cfg))
    state = await checkpointer.aget_state(dict(cfg))
    assert str(state.execution_meta.status) == "error"
    assert [m.text() for m in state.context][:2] == ["first", "calling"]
    out = await app.ainvoke({"messages": [Message.text_message("third")]}, dict(cfg), "full")
    assert str(out["state"].execution_meta.status) == "completed"
