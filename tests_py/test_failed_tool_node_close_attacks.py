"""Red team, commit 195981d: a new turn on a thread that failed at a tool node.

Promises defended: no thread is wedged for ever (every bad input gets a typed error or the turn
goes on), the model sees a correct history (each assistant tool call followed by exactly its
results), no finished tool fires twice, another user's thread is never touched."""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from typing import Any

import pytest

from tests_py.redteam.tool_history import check_history, order_turn_message, results, turn
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state.message_block import ToolResultBlock
from tenxgraph.utils import tool
from tenxgraph.utils.interrupt import interrupt


def build(cp: Any, effects: Counter[str], ctl: dict[str, Any], *, route_after_tools: Any = None,
          at_most_once: bool = False, two_nodes: bool = False) -> Any:
    deco = tool(side_effects="at_most_once") if at_most_once else (lambda f: f)

    @deco
    async def charge(order_id: str) -> str:
        """Charge the order."""
        effects[f"charge {order_id}"] += 1
        return f"charged {order_id}"

    @deco
    async def ship(order_id: str) -> str:
        """Ship the order."""
        how = ctl.get("ship", "ok")
        if how == "hang":
            await asyncio.Event().wait()
        if how == "interrupt":
            interrupt("ship it?")
        effects[f"ship {order_id}"] += 1
        return f"shipped {order_id}"

    async def model(state: AgentState) -> Message:
        return order_turn_message(state)

    def route(state: AgentState) -> str:
        if state.context[-1].tools_calls:
            return "tools_b" if two_nodes and ctl.get("use_b") else "tools"
        return END

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([charge, ship]))
    targets = {"tools": "tools", END: END}
    if two_nodes:
        g.add_node("tools_b", ToolNode([charge, ship]))
        g.add_edge("tools_b", "model")
        targets["tools_b"] = "tools_b"
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, targets)
    if route_after_tools is not None:
        g.add_conditional_edges("tools", route_after_tools, {"model": "model"})
    else:
        g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


async def fail_at_tools(app: Any, cfg: dict[str, Any], ctl: dict[str, Any]) -> None:
    """The turn "o-1" fails at its tool node (ship hangs past node_timeout); ship works after."""
    with pytest.raises(Exception):
        await app.ainvoke(turn("o-1"), cfg)
    ctl["ship"] = "ok"


LOCAL = ["memory", "sqlite"]


@pytest.fixture(params=LOCAL, ids=LOCAL)
def local_cp(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    from tests_py.conftest import make_checkpointer
    return make_checkpointer(request.param, request, tmp_path)


def test_a_routing_error_after_a_finished_tool_node_does_not_wedge_the_thread(checkpointer: Any, make_thread: Any) -> None:
    """Promise: nothing hangs / a failed tool node takes a new turn. The tool node ran and its
    results are in the thread; the condition routing out of it raised once (a transient
    failure). The thread is `error` at the tool node, so the new turn is routed to the close,
    which re-enters the tool node on a thread whose last message is a tool result: NODE_002,
    committed as the error again. Every later turn and every `{}` fails the same way, for ever."""
    effects: Counter[str] = Counter()
    ctl: dict[str, Any] = {"router_down": True}

    def after_tools(state: AgentState) -> str:
        if ctl["router_down"]:
            raise RuntimeError("router backend down")
        return "model"

    app = build(checkpointer, effects, ctl, route_after_tools=after_tools)
    cfg = {"thread_id": make_thread("route-fail"), "user_id": "u1"}

    async def scenario() -> None:
        with pytest.raises(Exception) as first:
            await app.ainvoke(turn("o-1"), cfg)
        assert getattr(first.value, "error_code", None) == "GRAPH_ROUTING_001"
        st = await checkpointer.aget_state(cfg)
        assert (st.execution_meta.status.value, st.execution_meta.current_node) == ("error", "tools")
        ctl["router_down"] = False  # the router is back
        await app.ainvoke(turn("o-2"), cfg)  # FAILS today: NodeError NODE_002, for ever

    asyncio.run(scenario())
    st = asyncio.run(checkpointer.aget_state(cfg))
    assert st.execution_meta.status.value == "completed"
    check_history(st.context)
    assert effects == Counter({"charge o-1": 1, "ship o-1": 1, "charge o-2": 1, "ship o-2": 1})


def test_client_tool_results_sent_to_a_failed_tool_node_do_not_duplicate_answers(local_cp: Any, make_thread: Any) -> None:
    """Promise: the model sees a correct history (each call followed by exactly its results), or
    the input gets a typed error. A client sends its own tool-result message for the hung call
    (as it would for a remote-tool pause). The close answers the call with [TOOL_NOT_ANSWERED]
    and then the client's result is appended too: two results for one call id (before the
    change: STORAGE_BUSY_001, nothing written)."""
    effects: Counter[str] = Counter()
    ctl: dict[str, Any] = {"ship": "hang"}
    app = build(local_cp, effects, ctl)
    cfg = {"thread_id": make_thread("client-results"), "user_id": "u1", "node_timeout": 0.5}

    async def scenario() -> None:
        await fail_at_tools(app, cfg, ctl)
        answer = Message.tool_message([ToolResultBlock(call_id="ship-o-1", output="client: shipped")])
        before = await local_cp.aget_state(cfg)
        try:
            await app.ainvoke({"messages": [answer]}, cfg)
        except Exception as exc:  # a typed refusal is acceptable, with nothing written
            assert getattr(exc, "error_code", None), exc
            after = await local_cp.aget_state(cfg)
            assert len(after.context) == len(before.context)
            return
        check_history((await local_cp.aget_state(cfg)).context)

    asyncio.run(scenario())


def test_a_failed_node_with_an_interrupted_call_and_a_hung_call_closes_cleanly(local_cp: Any, make_thread: Any) -> None:
    """Promise: each call answered exactly once, nothing fires twice. Parallel calls: charge ran
    and was recorded, ship hung; both at_most_once (intent rows). The new turn closes the node
    (charge from the ledger, ship not answered) and a later `{}` changes nothing."""
    effects: Counter[str] = Counter()
    ctl: dict[str, Any] = {"ship": "hang"}
    app = build(local_cp, effects, ctl, at_most_once=True)
    cfg = {"thread_id": make_thread("amo"), "user_id": "u1", "node_timeout": 0.5}

    async def scenario() -> None:
        await fail_at_tools(app, cfg, ctl)
        await app.ainvoke(turn("o-2"), cfg)
        await app.ainvoke({}, cfg)

    asyncio.run(scenario())
    ctx = asyncio.run(local_cp.aget_state(cfg)).context
    check_history(ctx)
    outs = {b.call_id: b for m in ctx for b in results(m)}
    assert outs["charge-o-1"].output == "charged o-1" and not outs["charge-o-1"].is_error
    assert "TOOL_NOT_ANSWERED" in str(outs["ship-o-1"].output)
    assert effects == Counter({"charge o-1": 1, "charge o-2": 1, "ship o-2": 1})


def test_a_failed_second_tool_node_is_the_one_closed(local_cp: Any, make_thread: Any) -> None:
    """Promise: correct history on a graph with several tool nodes."""
    effects: Counter[str] = Counter()
    ctl: dict[str, Any] = {"ship": "hang", "use_b": True}
    app = build(local_cp, effects, ctl, two_nodes=True)
    cfg = {"thread_id": make_thread("two-nodes"), "user_id": "u1", "node_timeout": 0.5}

    async def scenario() -> None:
        with pytest.raises(Exception):
            await app.ainvoke(turn("o-1"), cfg)
        st = await local_cp.aget_state(cfg)
        assert st.execution_meta.current_node == "tools_b"
        ctl.update(ship="ok", use_b=False)
        await app.ainvoke(turn("o-2"), cfg)

    asyncio.run(scenario())
    ctx = asyncio.run(local_cp.aget_state(cfg)).context
    check_history(ctx)
    assert effects == Counter({"charge o-1": 1, "charge o-2": 1, "ship o-2": 1})


@pytest.mark.parametrize("how", ["user_isolation", "authz"])
def test_another_user_cannot_close_the_owners_failed_tool_node(request: pytest.FixtureRequest, tmp_path: Any,
                                                               make_thread: Any, how: str) -> None:
    """Promise: another user's thread is never touched: user B's turn on user A's failed thread is
    refused (typed error) and A's thread is unchanged (still failed, calls unanswered)."""
    from tests_py.conftest import make_checkpointer
    cp = make_checkpointer("postgres", request, tmp_path, enforce_user_isolation=(how == "user_isolation"))
    effects: Counter[str] = Counter()
    ctl: dict[str, Any] = {"ship": "hang"}
    app = build(cp, effects, ctl)
    thread = make_thread("foreign")
    extra = {"authz": {"scope": "owner"}} if how == "authz" else {}
    owner = {"thread_id": thread, "user_id": "alice", "node_timeout": 0.5, **extra}
    other = {"thread_id": thread, "user_id": "mallory", "node_timeout": 0.5, **extra}

    async def scenario() -> None:
        with pytest.raises(Exception):
            await app.ainvoke(turn("o-1"), owner)
        before = await cp.aget_state(owner)
        with pytest.raises(Exception) as refused:
            await app.ainvoke(turn("o-evil"), other)
        assert str(getattr(refused.value, "error_code", "")).startswith("STORAGE_FORBIDDEN"), refused.value
        after = await cp.aget_state(owner)
        assert [m.role for m in after.context] == [m.role for m in before.context]
        assert after.execution_meta.status.value == "error"

    asyncio.run(scenario())
    assert effects == Counter({"charge o-1": 1})


def test_recursion_limit_before_a_tool_node_then_new_turn(local_cp: Any, make_thread: Any) -> None:
    """A run that hit its recursion limit right before the tool node (calls never started): the
    new turn closes the node. Promise: history correct and nothing fires twice. (The answer says
    'may or may not have taken effect' for calls that never started: documented as a note.)"""
    effects: Counter[str] = Counter()
    app = build(local_cp, effects, {})
    cfg = {"thread_id": make_thread("recursion"), "user_id": "u1"}

    async def scenario() -> None:
        with pytest.raises(Exception):
            await app.ainvoke(turn("o-1"), {**cfg, "recursion_limit": 1})
        await app.ainvoke(turn("o-2"), cfg)

    asyncio.run(scenario())
    ctx = asyncio.run(local_cp.aget_state(cfg)).context
    check_history(ctx)
    assert effects == Counter({"charge o-2": 1, "ship o-2": 1})


# --------------------------------------------------------------------------- review of session 18


def test_calls_left_without_results_behind_a_later_message_are_not_closed_over(checkpointer: Any, make_thread: Any) -> None:
    """10xGraph 0.10's wedge: a user message stored after an assistant's unanswered tool calls,
    the thread failed at the tool node (NODE_002). A close must not mark that thread completed
    with the calls still unanswered (every provider refuses such a history): the new turn gets
    the node's typed error, and nothing is written."""
    effects: Counter[str] = Counter()
    app = build(checkpointer, effects, {"ship": "ok"})
    cfg = {"thread_id": make_thread("wedged-10x"), "user_id": "u1"}

    async def scenario() -> None:
        asked = order_turn_message(AgentState(context=[Message.text_message("o-1")]))
        state = AgentState(context=[Message.text_message("o-1"), asked, Message.text_message("hello?")])
        state.execution_meta.current_node = "tools"
        state.execution_meta.status = state.execution_meta.status.__class__("error")
        await checkpointer.aput_state(cfg, state)
        before = await checkpointer.aget_state(cfg)
        with pytest.raises(Exception) as refused:
            await app.ainvoke(turn("o-2"), cfg)
        assert getattr(refused.value, "error_code", None) == "NODE_002", refused.value
        after = await checkpointer.aget_state(cfg)
        assert [m.message_id for m in after.context] == [m.message_id for m in before.context]
        assert after.execution_meta.status.value == "error"

    asyncio.run(scenario())
    assert not effects


def test_two_racing_turns_log_one_close(checkpointer: Any, make_thread: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The turn that finds the node closed by the other did nothing, and says nothing."""
    effects: Counter[str] = Counter()
    ctl: dict[str, Any] = {"ship": "hang"}
    app = build(checkpointer, effects, ctl)
    cfg = {"thread_id": make_thread("race-log"), "user_id": "u1", "node_timeout": 0.5}

    async def scenario() -> None:
        await fail_at_tools(app, cfg, ctl)
        wait = {**cfg, "on_busy": "wait", "busy_timeout": 60}
        with caplog.at_level(logging.WARNING, logger="tenxgraph"):
            await asyncio.gather(app.ainvoke(turn("o-2"), {**wait, "run_id": "r-2"}),
                                 app.ainvoke(turn("o-3"), {**wait, "run_id": "r-3"}))

    asyncio.run(scenario())
    closed = [r for r in caplog.records if getattr(r, "event", None) == "failed_tool_node_closed"]
    assert len(closed) == 1, [r.getMessage() for r in closed]
    check_history(asyncio.run(checkpointer.aget_state(cfg)).context)


def test_a_close_that_cannot_read_the_ledger_fails_and_writes_nothing(tenx_postgres: Any, make_thread: Any) -> None:
    """The close answers each call from the ledger. When the ledger cannot be read, answering
    "not run again" would hide a call that finished (its recorded result never used, the model
    invited to call it again): the turn fails with a typed storage error instead, the thread stays
    failed at its tool node, and the next turn closes it with the recorded result."""
    import subprocess

    from tenxgraph.storage.checkpointer import PgCheckpointer
    from tenxgraph.testing.postgres_server import find_pg_binary

    schema = f"cl_{uuid.uuid4().hex[:10]}"
    cp = PgCheckpointer(tenx_postgres.dsn, schema=schema, enforce_user_isolation=False)
    cp.setup()
    effects: Counter[str] = Counter()
    ctl: dict[str, Any] = {"ship": "hang"}
    app = build(cp, effects, ctl)
    cfg = {"thread_id": make_thread("no-ledger"), "user_id": "u1", "node_timeout": 0.5}

    def psql(sql: str) -> None:
        subprocess.run([find_pg_binary("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", tenx_postgres.dsn, "-c", sql],
                       check=True, capture_output=True, timeout=60)

    async def scenario() -> None:
        await fail_at_tools(app, cfg, ctl)
        before = await cp.aget_state(cfg)
        psql(f'ALTER TABLE "{schema}".tool_executions RENAME TO tool_executions_away')
        try:
            with pytest.raises(Exception) as failed:
                await app.ainvoke(turn("o-2"), cfg)
            assert str(getattr(failed.value, "error_code", "")).startswith("STORAGE"), failed.value
        finally:
            psql(f'ALTER TABLE "{schema}".tool_executions_away RENAME TO tool_executions')
        after = await cp.aget_state(cfg)
        assert [m.message_id for m in after.context] == [m.message_id for m in before.context]
        assert (after.execution_meta.status.value, after.execution_meta.current_node) == ("error", "tools")
        await app.ainvoke(turn("o-3"), cfg)

    asyncio.run(scenario())
    ctx = asyncio.run(cp.aget_state(cfg)).context
    check_history(ctx)
    first_results = [results(m)[0] for m in ctx[2:4]]
    assert (first_results[0].output, first_results[0].is_error) == ("charged o-1", False)  # the recorded result
    assert effects["charge o-1"] == 1 and "o-2" not in [m.text() for m in ctx if m.role == "user"]


@pytest.mark.asyncio
@pytest.mark.parametrize("emptied_by", ["aclear_state", "aclean_thread"])
async def test_a_thread_emptied_before_its_failed_tool_node_is_closed_takes_the_turn_as_its_first(
    checkpointer: Any, make_thread: Any, monkeypatch: pytest.MonkeyPatch, emptied_by: str
) -> None:
    """An operator's ``aclear_state`` / ``aclean_thread`` landed between the refusal of a new turn
    on a thread failed at its tool node and the run that closes that node: the close found no
    state and was refused as an input without messages, so the caller's turn got a false, untyped
    ``ValueError`` (a mixed-load soak, session 38). The close now finds nothing to close and the
    turn runs as the emptied thread's first. The maintenance call is placed in that window by
    wrapping the close (the soak hit it from another process)."""
    from tenxgraph.core.exceptions import NodeTimeoutError
    from tenxgraph.core.graph import _busy_answers

    ran: list[str] = []
    hang = asyncio.Event()

    async def fetch() -> str:
        """Fetch."""
        ran.append("fetch")
        if len(ran) == 1:
            await hang.wait()  # cut off by node_timeout
        return "fetched"

    def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            return Message(role="assistant", content=[], tools_calls=[{
                "id": f"c{uuid.uuid4().hex[:6]}", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}])
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([fetch]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END)
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    with pytest.raises(NodeTimeoutError):
        await app.ainvoke({"messages": [Message.text_message("first")]}, dict(cfg, node_timeout=0.5))
    closing = _busy_answers.BusyAnswers._close_failed_tools
    emptied: list[str] = []

    async def empty_first(self: Any, c: Any, options: Any, node: str) -> None:
        await getattr(checkpointer, emptied_by)(dict(cfg))
        emptied.append(node)
        await closing(self, c, options, node)

    monkeypatch.setattr(_busy_answers.BusyAnswers, "_close_failed_tools", empty_first)
    out = await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("second")]}, dict(cfg)), 60)
    assert emptied == ["tools"]
    assert [m.text() for m in out["messages"]][-1] == "done"
    stored = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in stored.context if m.role != "assistant"] == ["second", "fetched"]
    hang.set()
