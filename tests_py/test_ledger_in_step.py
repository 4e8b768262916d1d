"""A tool node's last ledger rows go into its step's transaction (one commit fewer per turn), and
only where nothing of the user's runs between the last tool's return and that commit.

On PostgreSQL the transaction a row was written in is its ``xmin``: rows carried by the step share
the step's, rows written on their own do not. The behaviour on every backend: a step that fails
writes the rows it carried on their own, so the resume replays the calls instead of running them
again; a SIGKILL inside that step runs them again (tests_py/test_testing_kit.py, ``in_step_tx``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import FailpointError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.utils import CallbackManager, GraphLifecycleHook
from tenxgraph.utils.tool_decorator import tool
from tests_py.conftest import make_checkpointer
from tests_py.tool_graphs import call, route, scripted_model, tool_graph, tool_texts


def counting_tools(counts: dict[str, int], effects: tuple[str, ...] = ("idempotent", "idempotent")) -> list[Any]:
    def make(name: str, side_effects: str) -> Any:
        @tool(name=name, side_effects=side_effects)
        async def t() -> str:
            counts[name] = counts.get(name, 0) + 1
            return f"{name} done"

        return t

    return [make(f"t{i}", e) for i, e in enumerate(effects)]


def calls(n: int) -> list[dict[str, Any]]:
    return [call(f"c{i}", f"t{i}", {}) for i in range(n)]


class Quiet(GraphLifecycleHook):
    """A hook that changes nothing: having one is what matters (it is user code at every point)."""


def graph(tools: list[Any], cp: Any, *, hook: bool = False, conditional_back: bool = False):
    if not hook and not conditional_back:
        return tool_graph(AgentState, tools, [calls(len(tools))], checkpointer=cp)
    g = StateGraph(AgentState)
    g.add_node("model", scripted_model([calls(len(tools))]))
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    if conditional_back:
        g.add_conditional_edges("tools", lambda s: "model", {"model": "model"})
    else:
        g.add_edge("tools", "model")
    kw: dict[str, Any] = {}
    if hook:
        mgr = CallbackManager()
        mgr.register_lifecycle_hook(Quiet())
        kw["callback_manager"] = mgr
    return g.compile(checkpointer=cp, **kw)


@pytest.fixture
def pg(request: pytest.FixtureRequest, tmp_path):
    cp = make_checkpointer("postgres", request, tmp_path)
    return cp, request.getfixturevalue("tenx_postgres")


def xmins(server: Any, cp: Any, thread: str) -> tuple[set[str], dict[int, str]]:
    """The transactions of the thread's ledger rows, and of its state rows by version."""
    schema = cp.schema
    t = thread.replace("'", "''")
    ledger = server.psql(f"SELECT xmin FROM {schema}.tool_executions WHERE thread_id = '{t}'").split()
    states = server.psql(f"SELECT version, xmin FROM {schema}.states WHERE thread_id = '{t}' ORDER BY version").split()
    return set(ledger), {int(v): x for v, x in (s.split("|") for s in states)}


async def row_reaches(cp: Any, cfg: dict[str, Any], call_id: str, status: str) -> None:
    """Waits (30 s at most) until the ledger row of ``call_id`` in the thread's tool-calling
    message has ``status``: a sibling call uses it to return only after that is committed."""
    state = await cp.aget_state(dict(cfg))
    [asked] = [m for m in state.context if m.tools_calls]
    for _ in range(6000):
        if await cp.aget_tool_status(cfg, f"{asked.message_id}:{call_id}") == status:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"the row of {call_id} never became {status}")


async def run_turn(app: Any, thread: str, **cfg: Any) -> dict[str, Any]:
    return await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": thread, **cfg})


@pytest.mark.asyncio
async def test_the_tools_step_carries_the_rows_of_calls_that_returned_together(pg, make_thread) -> None:
    cp, server = pg
    counts: dict[str, int] = {}
    thread = make_thread("carry")
    r = await run_turn(graph(counting_tools(counts), cp), thread)
    assert tool_texts(r["messages"]) == {"c0": "t0 done", "c1": "t1 done"}
    ledger, states = xmins(server, cp, thread)
    # input (1), model (2), tools (3), model + completed (4): the rows are in the tools step's.
    assert sorted(states) == [1, 2, 3, 4], states
    assert ledger == {states[3]}, (ledger, states)


@pytest.mark.asyncio
@pytest.mark.parametrize("why", ["lifecycle_hook", "routing_condition", "at_most_once", "after_record_armed"])
async def test_the_rows_keep_their_own_commit_when_something_may_run_before_the_step(pg, make_thread, why) -> None:
    cp, server = pg
    counts: dict[str, int] = {}
    effects = ("idempotent", "at_most_once") if why == "at_most_once" else ("idempotent", "idempotent")
    app = graph(counting_tools(counts, effects), cp, hook=why == "lifecycle_hook",
                conditional_back=why == "routing_condition")
    thread = make_thread(why)
    cfg = {"failpoints": "after_record:t0=delay(0)"} if why == "after_record_armed" else {}
    r = await run_turn(app, thread, **cfg)
    assert tool_texts(r["messages"]) == {"c0": "t0 done", "c1": "t1 done"}
    ledger, states = xmins(server, cp, thread)
    assert states[3] not in ledger, (why, ledger, states)
    assert ledger, why


@pytest.mark.asyncio
async def test_a_failed_tools_step_writes_its_rows_alone_and_the_resume_replays_them(checkpointer, make_thread) -> None:
    counts: dict[str, int] = {}
    app = graph(counting_tools(counts), checkpointer)
    thread = make_thread("fallback")
    with pytest.raises(FailpointError):
        await run_turn(app, thread, failpoints="in_step_tx:tools=raise")
    assert counts == {"t0": 1, "t1": 1}
    cfg = {"thread_id": thread}
    state = await checkpointer.aget_state(dict(cfg))
    [asked] = [m for m in state.context if m.tools_calls]
    for i in range(2):  # the step rolled back; its rows did not
        assert await checkpointer.aget_tool_status(cfg, f"{asked.message_id}:c{i}") == "completed"
    r = await app.ainvoke({}, cfg)
    assert counts == {"t0": 1, "t1": 1}, "replayed from the ledger, not run again"
    assert tool_texts(r["messages"]) == {"c0": "t0 done", "c1": "t1 done"}


@pytest.mark.asyncio
async def test_a_row_is_written_at_once_while_a_sibling_still_runs(pg, make_thread) -> None:
    """The first call's row is committed while the second still runs (the second waits to see it
    committed); only the row of the call that returned last rides with the step."""
    cp, server = pg
    thread = make_thread("sibling")
    cfg = {"thread_id": thread}

    @tool(name="t0")
    async def first() -> str:
        return "t0 done"

    @tool(name="t1")
    async def second() -> str:
        await row_reaches(cp, cfg, "c0", "completed")
        return "t1 done"

    r = await run_turn(graph([first, second], cp), thread)
    assert tool_texts(r["messages"]) == {"c0": "t0 done", "c1": "t1 done"}
    t = thread.replace("'", "''")
    # Keys are JSON arrays: [message id, call id].
    rows = dict(s.split("|") for s in server.psql(
        f"SELECT tool_call_id::jsonb->>1, xmin FROM {cp.schema}.tool_executions WHERE thread_id = '{t}'").split())
    _, states = xmins(server, cp, thread)
    assert rows["c1"] == states[3] != rows["c0"], (rows, states)


@pytest.mark.asyncio
async def test_a_ledger_that_cannot_be_written_does_not_stop_the_run_on_postgres(pg, make_thread) -> None:
    """The step carrying the rows fails because of them; the rows alone fail too; the step goes
    in alone and the result still reaches the model (the ledger write failure is logged)."""
    cp, server = pg
    server.psql(
        f"CREATE FUNCTION {cp.schema}.full_disk() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN RAISE EXCEPTION 'disk full'; END$$; "
        f"CREATE TRIGGER no_ledger BEFORE INSERT ON {cp.schema}.tool_executions "
        f"FOR EACH ROW EXECUTE FUNCTION {cp.schema}.full_disk()"
    )
    counts: dict[str, int] = {}
    thread = make_thread("disk-full")
    r = await run_turn(graph(counting_tools(counts), cp), thread)
    assert counts == {"t0": 1, "t1": 1}
    assert tool_texts(r["messages"]) == {"c0": "t0 done", "c1": "t1 done"}
    assert r["messages"][-1].text() == "done"
    ledger, states = xmins(server, cp, thread)
    assert ledger == set() and sorted(states) == [1, 2, 3, 4], (ledger, states)


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["invoke", "stream"])
async def test_a_sibling_that_returns_after_a_pause_is_recorded_with_the_pause(checkpointer, make_thread, path) -> None:
    """t1 pauses at interrupt() first; t0 returns last, so its row rides with the next commit:
    the pause's. The resume replays t0 and runs t1 again."""
    from tenxgraph.utils.interrupt import interrupt, pending_interrupt

    cfg = {"thread_id": make_thread("pause")}
    runs = {"t0": 0, "t1": 0}

    @tool(name="t0")
    async def slow() -> str:
        runs["t0"] += 1
        await row_reaches(checkpointer, cfg, "c1", "paused")
        return "t0 done"

    @tool(name="t1")
    async def ask() -> str:
        runs["t1"] += 1
        answer = interrupt({"q": "ok?"})
        return f"t1 {answer}"

    app = graph([slow, ask], checkpointer)

    async def go(data: dict[str, Any]) -> None:
        if path == "invoke":
            await app.ainvoke(data, dict(cfg))
        else:
            async for _ in app.astream(data, dict(cfg)):
                pass

    await go({"messages": [Message.text_message("go")]})
    state = await checkpointer.aget_state(dict(cfg))
    assert pending_interrupt(state) is not None
    [asked] = [m for m in state.context if m.tools_calls]
    assert await checkpointer.aget_tool_status(cfg, f"{asked.message_id}:c0") == "completed"
    await go({"resume": "yes"})
    state = await checkpointer.aget_state(dict(cfg))
    assert str(state.execution_meta.status) == "completed"
    assert tool_texts(state.context) == {"c0": "t0 done", "c1": "t1 yes"}
    assert runs == {"t0": 1, "t1": 2}, "t0 replayed from the ledger; t1 ran again after its pause"
