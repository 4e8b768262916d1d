"""Running compiled graphs (spec §2.3, §3, §8 recursion limit, §9, §11).

Every test that takes the ``checkpointer`` fixture runs once per backend (memory, sqlite) with
the same graph and the same expected values, so the backends must give identical results.
"""

from __future__ import annotations

import asyncio
import contextvars
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import GraphError, GraphRecursionError, NodeError, StaleStateError
from tenxgraph.core.graph import Edge
from tenxgraph.core.state import TokenUsages
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils import Command
from tenxgraph.utils.constants import ResponseGranularity


class CounterState(AgentState):
    count: int = 0
    tags: list[str] = []
    route: str = ""


def user(text: str) -> Message:
    return Message.text_message(text, role="user")


def texts(messages: list[Message]) -> list[str]:
    return [m.text() for m in messages]


def roles(messages: list[Message]) -> list[str]:
    return [m.role for m in messages]


async def run_full(app: Any, thread: str, *msgs: str, **cfg: Any) -> dict[str, Any]:
    config = {"thread_id": thread, **cfg}
    return await app.ainvoke({"messages": [user(m) for m in msgs]}, config, response_granularity="full")


def linear(state_cls: type[AgentState], *funcs: Any) -> StateGraph:
    """START -> funcs[0] -> funcs[1] ... -> END."""
    g = StateGraph(state_cls)
    names = []
    for f in funcs:
        g.add_node(f)
        names.append(f.__name__)
    g.add_edge(START, names[0])
    for a, b in zip(names, names[1:]):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    return g


# -- state subclass, sync and async nodes --------------------------------------------------


@pytest.mark.asyncio
async def test_custom_state_fields_sync_and_async_nodes(checkpointer, make_thread) -> None:
    async def first(state: CounterState):
        state.count += 1
        state.tags.append("async")
        return f"first count={state.count}"

    def second(state: CounterState):
        state.count += 10
        state.tags.append("sync")
        return f"second count={state.count}"

    app = linear(CounterState, first, second).compile(checkpointer=checkpointer)
    tid = make_thread()
    r = await run_full(app, tid, "hi")
    assert texts(r["messages"]) == ["hi", "first count=1", "second count=11"]
    assert roles(r["messages"]) == ["user", "assistant", "assistant"]
    st = r["state"]
    assert type(st) is CounterState
    assert (st.count, st.tags) == (11, ["async", "sync"])
    assert st.execution_meta.status == "completed"
    assert st.execution_meta.current_node == "second"  # the last node that ran, as in 10xGraph
    assert st.execution_meta.step == 2

    stored = await checkpointer.aget_state({"thread_id": tid})
    assert type(stored) is CounterState
    assert (stored.count, stored.tags) == (11, ["async", "sync"])
    assert texts(stored.context) == ["hi", "first count=1", "second count=11"]
    assert stored.execution_meta.status == "completed"


def _texts_and_state(r: dict[str, Any]) -> tuple[list[str], list[str], dict[str, Any]]:
    st = r["state"].model_dump(mode="json", exclude={"context"})
    st["execution_meta"].pop("thread_id", None)
    return texts(r["messages"]), texts(r["state"].context), st


@pytest.mark.asyncio
async def test_same_graph_gives_identical_results_on_both_backends(tmp_path: Path) -> None:
    def build() -> StateGraph:
        async def model(state: CounterState):
            state.count += 1
            if state.count >= 3:
                return Command(update=f"done at {state.count}", goto=END)
            return Message.text_message(f"model {state.count}", role="assistant")

        def tool(state: CounterState, config: dict):
            state.tags.append(f"t{state.count}")
            return [f"tool {state.count}", Message.text_message("extra", role="assistant")]

        g = StateGraph(CounterState)
        g.add_node("model", model).add_node("tool", tool)
        g.add_edge(START, "model")
        g.add_conditional_edges("model", lambda s: "tool" if s.count < 3 else "never", {"tool": "tool"})
        g.add_edge("tool", "model")
        return g

    results = []
    for cp in (InMemoryCheckpointer(), SqliteCheckpointer(tmp_path / "same.db")):
        app = build().compile(checkpointer=cp)
        r1 = await run_full(app, "same-thread", "one")
        r2 = await run_full(app, "same-thread", "two")
        listed = await cp.alist_messages({"thread_id": "same-thread"})
        results.append((_texts_and_state(r1), _texts_and_state(r2), texts(listed)))
    assert results[0] == results[1]
    (m1, ctx1, st1), (m2, ctx2, st2), listed = results[0]
    assert m1 == ["one", "model 1", "tool 1", "extra", "model 2", "tool 2", "extra", "done at 3"]
    # the second run restarts at the entry point with the stored count (3 -> 4: goto END at once)
    assert m2 == ["two", "done at 4"]
    assert ctx2 == m1 + m2
    assert listed == ctx2
    assert st2["count"] == 4 and st2["tags"] == ["t1", "t2"]


# -- routing -------------------------------------------------------------------------------


def _routing_graph(condition: Any, path_map: dict[str, str] | None, static_to: str | None) -> StateGraph:
    def a(state: CounterState):
        return "a"

    def b(state: CounterState):
        return "b"

    def c(state: CounterState):
        return "c"

    g = StateGraph(CounterState)
    g.add_node(a).add_node(b).add_node(c)
    g.add_edge(START, "a")
    g.add_conditional_edges("a", condition, path_map)
    if static_to is not None:
        g.add_edge("a", static_to)
    g.add_edge("b", END)
    g.add_edge("c", END)
    return g


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("result", "path_map", "static_to", "expected"),
    [
        ("go_b", {"go_b": "b", "go_c": "c"}, None, ["a", "b"]),
        ("go_c", {"go_b": "b", "go_c": "c"}, None, ["a", "c"]),
        ("miss", {"go_b": "b"}, "c", ["a", "c"]),  # path_map miss falls through to the static edge
        ("miss", {"go_b": "b"}, None, ["a"]),  # ... or to END
        ("c", None, None, ["a", "c"]),  # no path_map: a str result names the node
        (None, None, "b", ["a", "b"]),  # falsy result without path_map: static edge
        (END, None, "b", ["a"]),  # no path_map: END ends the run
    ],
    ids=["map-b", "map-c", "miss-static", "miss-end", "str-name", "falsy-static", "str-end"],
)
async def test_conditional_routing(checkpointer, make_thread, result, path_map, static_to, expected) -> None:
    calls = []

    def condition(state: CounterState):
        calls.append(1)
        return result

    app = _routing_graph(condition, path_map, static_to).compile(checkpointer=checkpointer)
    r = await run_full(app, make_thread(), "hi")
    assert texts(r["messages"]) == ["hi", *expected]
    assert r["state"].execution_meta.status == "completed"
    assert calls, "the condition was never called"


@pytest.mark.asyncio
async def test_condition_called_once_per_conditional_edge(checkpointer, make_thread) -> None:
    calls = []

    def condition(state: CounterState):
        calls.append(1)
        return "k3"

    app = _routing_graph(condition, {"k1": "b", "k2": "b", "k3": "c"}, None).compile(checkpointer=checkpointer)
    r = await run_full(app, make_thread(), "hi")
    assert texts(r["messages"]) == ["hi", "a", "c"]
    assert len(calls) == 3


@pytest.mark.asyncio
async def test_truthy_non_str_result_without_path_map_routes_to_edge_target(checkpointer, make_thread) -> None:
    def yes(state: CounterState):
        return 1  # truthy, not a str

    def no(state: CounterState):
        return []  # falsy

    g = _routing_graph(no, None, None)
    # A conditional Edge carrying its own target and no path-map key (10xGraph's Edge API).
    g.edges.append(Edge("a", "b", no))
    g.edges.append(Edge("a", "c", yes))
    app = g.compile(checkpointer=checkpointer)
    r = await run_full(app, make_thread(), "hi")
    assert texts(r["messages"]) == ["hi", "a", "c"]


@pytest.mark.asyncio
async def test_truthy_non_str_without_path_map_targets_empty_edge(checkpointer, make_thread) -> None:
    # add_conditional_edges without a path map stores target "": a truthy non-str result routes
    # there, which is not a node (10xGraph failed later with KeyError; here GRAPH_ROUTING_002).
    app = _routing_graph(lambda s: True, None, "b").compile(checkpointer=checkpointer)
    with pytest.raises(GraphError) as ei:
        await run_full(app, make_thread(), "hi")
    assert ei.value.error_code == "GRAPH_ROUTING_002"


@pytest.mark.asyncio
async def test_condition_returning_unknown_node_is_routing_002(checkpointer, make_thread) -> None:
    app = _routing_graph(lambda s: "ghost", None, "b").compile(checkpointer=checkpointer)
    tid = make_thread()
    with pytest.raises(GraphError) as ei:
        await run_full(app, tid, "hi")
    assert type(ei.value) is GraphError
    assert ei.value.error_code == "GRAPH_ROUTING_002"
    assert ei.value.context["from_node"] == "a"
    assert ei.value.context["to_node"] == "ghost"
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.execution_meta.status == "error"


@pytest.mark.asyncio
async def test_condition_raising_is_routing_001(checkpointer, make_thread) -> None:
    boom = LookupError("no route")

    def condition(state: CounterState):
        raise boom

    app = _routing_graph(condition, {"x": "b"}, None).compile(checkpointer=checkpointer)
    tid = make_thread()
    with pytest.raises(GraphError) as ei:
        await run_full(app, tid, "hi")
    err = ei.value
    assert type(err) is GraphError
    assert err.error_code == "GRAPH_ROUTING_001"
    assert err.context["from_node"] == "a"
    assert err.context["to_node"] == "b"
    assert err.context["error_type"] == "LookupError"
    assert err.__cause__ is boom
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.execution_meta.status == "error"


@pytest.mark.asyncio
async def test_command_goto_overrides_edges(checkpointer, make_thread) -> None:
    def a(state: CounterState):
        return Command(update="a", goto="c")

    def b(state: CounterState):
        return "b"

    def c(state: CounterState):
        return "c"

    g = linear(CounterState, a, b, c)
    app = g.compile(checkpointer=checkpointer)
    r = await run_full(app, make_thread(), "hi")
    assert texts(r["messages"]) == ["hi", "a", "c"]


@pytest.mark.asyncio
async def test_command_goto_end_stops_the_run(checkpointer, make_thread) -> None:
    def a(state: CounterState):
        return Command(update="a", goto=END)

    def b(state: CounterState):
        raise AssertionError("must not run")

    app = linear(CounterState, a, b).compile(checkpointer=checkpointer)
    tid = make_thread()
    r = await run_full(app, tid, "hi")
    assert texts(r["messages"]) == ["hi", "a"]
    assert r["state"].execution_meta.status == "completed"
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.execution_meta.status == "completed"
    assert stored.execution_meta.current_node == "a"  # the node that routed to END


@pytest.mark.asyncio
async def test_command_goto_unknown_node_is_routing_002(checkpointer, make_thread) -> None:
    def a(state: CounterState):
        return Command(goto="ghost")

    app = linear(CounterState, a).compile(checkpointer=checkpointer)
    with pytest.raises(GraphError) as ei:
        await run_full(app, make_thread(), "hi")
    assert ei.value.error_code == "GRAPH_ROUTING_002"


# -- node return kinds (§3.5) --------------------------------------------------------------


def _ret_str(state):
    return "plain"


def _ret_message(state):
    return Message.text_message("msg", role="assistant")


def _ret_list(state):
    return [Message.text_message("m1", role="assistant"), "s2", Message.text_message("m3", role="tool")]


def _ret_mutated(state):
    state.count = 7
    state.context.append(Message.text_message("appended", role="assistant"))
    return state


def _ret_new_state(state):
    return CounterState(
        context=[*state.context, Message.text_message("fresh", role="assistant")],
        count=42,
        tags=["new"],
    )


def _cmd_state(state):
    state.count = 5
    state.context.append(Message.text_message("via cmd state", role="assistant"))
    return Command(update=state)


def _cmd_list(state):
    return Command(update=["c1", Message.text_message("c2", role="assistant")])


def _cmd_message(state):
    return Command(update=Message.text_message("cmd msg", role="assistant"))


def _cmd_str(state):
    return Command(update="cmd str")


def _cmd_none(state):
    state.count = 3
    return Command(update=None)


RETURN_KINDS = [
    (_ret_str, ["plain"], ["assistant"], 0),
    (_ret_message, ["msg"], ["assistant"], 0),
    (_ret_list, ["m1", "s2", "m3"], ["assistant", "assistant", "tool"], 0),
    (_ret_mutated, ["appended"], ["assistant"], 7),
    (_ret_new_state, ["fresh"], ["assistant"], 42),
    (_cmd_state, ["via cmd state"], ["assistant"], 5),
    (_cmd_list, ["c1", "c2"], ["assistant", "assistant"], 0),
    (_cmd_message, ["cmd msg"], ["assistant"], 0),
    (_cmd_str, ["cmd str"], ["assistant"], 0),
    (_cmd_none, [], [], 3),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("func", "new_texts", "new_roles", "count"),
    RETURN_KINDS,
    ids=[f.__name__.lstrip("_") for f, *_ in RETURN_KINDS],
)
async def test_node_return_kinds(checkpointer, make_thread, func, new_texts, new_roles, count) -> None:
    def after(state: CounterState):
        return f"after {len(state.context)}"

    g = StateGraph(CounterState)
    g.add_node("n", func).add_node(after)
    g.add_edge(START, "n").add_edge("n", "after").add_edge("after", END)
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread()
    r = await run_full(app, tid, "hi")
    n_ctx = 1 + len(new_texts)
    assert texts(r["messages"]) == ["hi", *new_texts, f"after {n_ctx}"]
    assert roles(r["messages"]) == ["user", *new_roles, "assistant"]
    assert r["state"].count == count
    assert texts(r["state"].context) == ["hi", *new_texts, f"after {n_ctx}"]
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.count == count
    assert texts(stored.context) == ["hi", *new_texts, f"after {n_ctx}"]
    listed = await checkpointer.alist_messages({"thread_id": tid})
    assert texts(listed) == ["hi", *new_texts, f"after {n_ctx}"]


@pytest.mark.asyncio
async def test_same_message_twice_in_one_return_is_added_once(checkpointer, make_thread) -> None:
    def n(state: CounterState):
        m = Message.text_message("once", role="assistant")
        return [m, m]

    app = linear(CounterState, n).compile(checkpointer=checkpointer)
    r = await run_full(app, make_thread(), "hi")
    assert texts(r["messages"]) == ["hi", "once"]
    assert texts(r["state"].context) == ["hi", "once"]


@pytest.mark.asyncio
async def test_plain_dict_return_is_node_error(checkpointer, make_thread) -> None:
    def n(state: CounterState):
        return {"count": 1}

    app = linear(CounterState, n).compile(checkpointer=checkpointer)
    tid = make_thread()
    with pytest.raises(NodeError) as ei:
        await run_full(app, tid, "hi")
    assert ei.value.error_code == "NODE_001"
    assert isinstance(ei.value.__cause__, ValueError)
    assert ei.value.context["node_name"] == "n"
    assert ei.value.context["error_type"] == "ValueError"
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.execution_meta.status == "error"
    assert stored.count == 0


# -- node failures -------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_node_raising_is_node_error_with_cause(checkpointer, make_thread, is_async) -> None:
    raised: list[BaseException] = []

    def ok(state: CounterState):
        state.count = 1
        return "ok"

    def fail():
        exc = KeyError("kaboom")
        raised.append(exc)
        raise exc

    if is_async:
        async def boom(state: CounterState):
            fail()
    else:
        def boom(state: CounterState):
            fail()

    app = linear(CounterState, ok, boom).compile(checkpointer=checkpointer)
    tid = make_thread()
    with pytest.raises(NodeError) as ei:
        await run_full(app, tid, "hi")
    err = ei.value
    assert type(err) is NodeError
    assert err.error_code == "NODE_001"
    assert err.__cause__ is raised[0]
    assert err.context["node_name"] == "boom"
    assert err.context["error_type"] == "KeyError"
    assert "boom" in err.message and "kaboom" in err.message

    stored = await checkpointer.aget_state({"thread_id": tid})
    meta = stored.execution_meta
    assert meta.status == "error"
    assert meta.current_node == "boom"
    assert "kaboom" in str(meta.internal_data.get("error"))
    # the work of the node before the failure was committed
    assert stored.count == 1
    assert texts(stored.context) == ["hi", "ok"]


@pytest.mark.asyncio
async def test_failed_node_runs_again_on_next_invoke(checkpointer, make_thread) -> None:
    attempts = []

    def first(state: CounterState):
        return "first"

    def flaky(state: CounterState):
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("transient")
        return "recovered"

    app = linear(CounterState, first, flaky).compile(checkpointer=checkpointer)
    tid = make_thread()
    with pytest.raises(NodeError):
        await run_full(app, tid, "hi")
    r = await run_full(app, tid, "retry")
    assert texts(r["messages"]) == ["retry", "recovered"]
    assert r["state"].execution_meta.status == "completed"
    assert len(attempts) == 2
    assert texts(r["state"].context) == ["hi", "first", "retry", "recovered"]


# -- parameter injection (§3.4) ------------------------------------------------------------


@pytest.mark.asyncio
async def test_injection_single_param_any_name_gets_state(checkpointer, make_thread) -> None:
    seen: dict[str, Any] = {}

    def whatever(s):
        seen["one"] = s
        return "one"

    async def with_default(st, flag: int = 5):
        seen["default"] = (st, flag)
        return "two"

    g = StateGraph(CounterState)
    g.add_node("one", whatever).add_node("two", with_default).add_node("three", lambda x: x)
    g.add_edge(START, "one").add_edge("one", "two").add_edge("two", "three").add_edge("three", END)
    app = g.compile(checkpointer=checkpointer)
    r = await run_full(app, make_thread(), "hi")
    assert isinstance(seen["one"], CounterState)
    assert isinstance(seen["default"][0], CounterState)
    assert seen["default"][1] == 5
    assert texts(r["messages"]) == ["hi", "one", "two"]
    assert r["state"].execution_meta.status == "completed"


@pytest.mark.asyncio
async def test_injection_state_and_config_by_name(checkpointer, make_thread) -> None:
    seen: dict[str, Any] = {}

    def both(config, state):  # order does not matter: injected by name
        seen["both"] = (state, config)
        return "both"

    def only_config(config):
        seen["config"] = config
        return "config"

    async def kw(*, state, config, **extra):
        seen["kw"] = (state, config, extra)
        return "kw"

    g = StateGraph(CounterState)
    g.add_node(both).add_node(only_config).add_node(kw)
    g.add_edge(START, "both").add_edge("both", "only_config").add_edge("only_config", "kw").add_edge("kw", END)
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread()
    r = await app.ainvoke({"messages": [user("hi")]}, {"thread_id": tid, "custom": "v"}, "full")
    assert texts(r["messages"]) == ["hi", "both", "config", "kw"]
    st, cfg = seen["both"]
    assert isinstance(st, CounterState)
    assert isinstance(cfg, dict)
    assert cfg["thread_id"] == tid
    assert cfg["custom"] == "v"
    assert cfg["user_id"] == "anonymous"
    assert isinstance(seen["config"], dict) and seen["config"]["thread_id"] == tid
    assert isinstance(seen["kw"][0], CounterState)
    assert seen["kw"][1]["thread_id"] == tid
    assert seen["kw"][2] == {}


@pytest.mark.asyncio
async def test_injection_extra_required_param_is_node_error(checkpointer, make_thread) -> None:
    called = []

    def needs_more(state, config, service):
        called.append(1)
        return "never"

    app = linear(CounterState, needs_more).compile(checkpointer=checkpointer)
    tid = make_thread()
    with pytest.raises(NodeError) as ei:
        await run_full(app, tid, "hi")
    assert ei.value.error_code == "NODE_001"
    assert isinstance(ei.value.__cause__, TypeError)
    assert "service" in str(ei.value.__cause__)
    assert ei.value.context["node_name"] == "needs_more"
    assert called == []
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.execution_meta.status == "error"


@pytest.mark.asyncio
async def test_caller_config_is_not_mutated(checkpointer, make_thread) -> None:
    def n(state, config):
        config["poison"] = True
        return "n"

    app = linear(CounterState, n).compile(checkpointer=checkpointer)
    config = {"thread_id": make_thread()}
    before = dict(config)
    await app.ainvoke({"messages": [user("hi")]}, config)
    assert config == before


@pytest.mark.asyncio
async def test_callable_object_node(checkpointer, make_thread) -> None:
    class AsyncCallable:
        async def __call__(self, state):
            assert isinstance(state, CounterState)
            return "async object"

    class SyncCallable:
        def __call__(self, state, config):
            return f"sync object {config['thread_id'] == tid}"

    g = StateGraph(CounterState)
    g.add_node("x", AsyncCallable()).add_node("y", SyncCallable())
    g.add_edge(START, "x").add_edge("x", "y").add_edge("y", END)
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread()
    r = await run_full(app, tid, "hi")
    assert texts(r["messages"]) == ["hi", "async object", "sync object True"]


# -- contextvars ---------------------------------------------------------------------------

_CV: contextvars.ContextVar[str] = contextvars.ContextVar("tenxgraph_test_cv", default="unset")


@pytest.mark.asyncio
async def test_contextvars_visible_in_sync_and_async_nodes(checkpointer, make_thread) -> None:
    async def anode(state: CounterState):
        return f"async:{_CV.get()}"

    def snode(state: CounterState):
        return f"sync:{_CV.get()}"

    app = linear(CounterState, anode, snode).compile(checkpointer=checkpointer)
    _CV.set("caller-value")
    r = await run_full(app, make_thread(), "hi")
    assert texts(r["messages"]) == ["hi", "async:caller-value", "sync:caller-value"]


# -- recursion limit (§8) ------------------------------------------------------------------


def _loop_graph() -> StateGraph:
    def a(state: CounterState):
        state.count += 1
        return f"a{state.count}"

    def b(state: CounterState):
        return "b"

    g = StateGraph(CounterState)
    g.add_node(a).add_node(b)
    g.add_edge(START, "a").add_edge("a", "b").add_edge("b", "a")
    return g


@pytest.mark.asyncio
async def test_recursion_limit_raises_with_context(checkpointer, make_thread) -> None:
    app = _loop_graph().compile(checkpointer=checkpointer)
    tid = make_thread()
    with pytest.raises(GraphRecursionError) as ei:
        await run_full(app, tid, "hi", recursion_limit=3)
    err = ei.value
    assert isinstance(err, GraphError)
    assert err.error_code == "RECURSION_001"
    assert err.context == {"max_steps": 3, "current_step": 3, "current_node": "b"}
    assert "recursion limit: 3" in err.message
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.execution_meta.status == "error"
    assert stored.execution_meta.step == 3
    assert stored.count == 2
    assert texts(stored.context) == ["hi", "a1", "b", "a2"]


@pytest.mark.asyncio
async def test_recursion_limit_default_is_25(checkpointer, make_thread) -> None:
    app = _loop_graph().compile(checkpointer=checkpointer)
    with pytest.raises(GraphRecursionError) as ei:
        await run_full(app, make_thread(), "hi")
    assert ei.value.context["max_steps"] == 25
    assert ei.value.context["current_step"] == 25


@pytest.mark.asyncio
async def test_recursion_limit_not_hit_when_next_is_end(checkpointer, make_thread) -> None:
    def a(state):
        return "a"

    def b(state):
        return "b"

    app = linear(CounterState, a, b).compile(checkpointer=checkpointer)
    r = await run_full(app, make_thread(), "hi", recursion_limit=2)
    assert texts(r["messages"]) == ["hi", "a", "b"]
    assert r["state"].execution_meta.status == "completed"


# -- multi-run threads and persistence -----------------------------------------------------


def _ab_graph() -> StateGraph:
    def A(state: CounterState):
        state.count += 1
        return f"A{state.count}"

    def B(state: CounterState):
        return f"B{state.count}"

    return linear(CounterState, A, B)


@pytest.mark.asyncio
async def test_completed_thread_restarts_at_entry_point(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    tid = make_thread()
    r1 = await run_full(app, tid, "first")
    assert texts(r1["messages"]) == ["first", "A1", "B1"]
    r2 = await run_full(app, tid, "second")
    assert texts(r2["messages"]) == ["second", "A2", "B2"]
    assert roles(r2["messages"]) == ["user", "assistant", "assistant"]
    assert texts(r2["state"].context) == ["first", "A1", "B1", "second", "A2", "B2"]
    assert r2["state"].execution_meta.status == "completed"
    assert r2["state"].execution_meta.step == 2


@pytest.mark.asyncio
async def test_persistence_across_runs_without_duplicates(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    tid = make_thread()
    await run_full(app, tid, "first")
    await run_full(app, tid, "second")
    cfg = {"thread_id": tid}
    stored = await checkpointer.aget_state(cfg)
    assert stored.count == 2
    expected = ["first", "A1", "B1", "second", "A2", "B2"]
    assert texts(stored.context) == expected
    listed = await checkpointer.alist_messages(cfg)
    assert texts(listed) == expected
    ids = [m.message_id for m in listed]
    assert len(set(ids)) == len(ids)
    assert ids == [m.message_id for m in stored.context]


@pytest.mark.asyncio
async def test_input_message_with_known_id_is_not_duplicated(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    tid = make_thread()
    m = Message.text_message("same", role="user", message_id="fixed-id-1")
    await app.ainvoke({"messages": [m]}, {"thread_id": tid})
    await app.ainvoke({"messages": [m, Message.text_message("new", role="user")]}, {"thread_id": tid})
    listed = await checkpointer.alist_messages({"thread_id": tid})
    assert texts(listed) == ["same", "A1", "B1", "new", "A2", "B2"]


@pytest.mark.asyncio
async def test_fresh_sqlite_checkpointer_sees_the_thread(tmp_path: Path, make_thread) -> None:
    path = tmp_path / "persist.db"
    cp1 = SqliteCheckpointer(path)
    app = _ab_graph().compile(checkpointer=cp1)
    tid = make_thread()
    await run_full(app, tid, "first")
    await run_full(app, tid, "second")
    await app.aclose()

    cp2 = SqliteCheckpointer(path)
    cp2.bind_state_type(CounterState)
    cfg = {"thread_id": tid}
    stored = await cp2.aget_state(cfg)
    assert type(stored) is CounterState
    assert stored.count == 2
    expected = ["first", "A1", "B1", "second", "A2", "B2"]
    assert texts(stored.context) == expected
    listed = await cp2.alist_messages(cfg)
    assert texts(listed) == expected
    assert len({m.message_id for m in listed}) == len(expected)
    assert stored.execution_meta.status == "completed"

    # and a new graph on the fresh checkpointer continues the thread
    app2 = _ab_graph().compile(checkpointer=cp2)
    r = await run_full(app2, tid, "third")
    assert texts(r["messages"]) == ["third", "A3", "B3"]
    assert texts(await cp2.alist_messages(cfg)) == [*expected, "third", "A3", "B3"]
    await app2.aclose()


@pytest.mark.asyncio
async def test_concurrent_runs_on_one_thread_lose_no_update(checkpointer, make_thread) -> None:
    calls: list[int] = []

    async def slow(state: CounterState):
        calls.append(state.count)
        await asyncio.sleep(0.2)
        state.count += 1
        return f"slow{state.count}"

    app = linear(CounterState, slow).compile(checkpointer=checkpointer)
    tid = make_thread()
    await run_full(app, tid, "first")
    results = await asyncio.gather(
        run_full(app, tid, "x"), run_full(app, tid, "y"), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    wins = [r for r in results if not isinstance(r, BaseException)]
    assert len(errors) == 1 and len(wins) == 1
    # The winner holds the thread's lease; the loser is refused before it reads or runs anything.
    from tenxgraph.core.exceptions import ThreadBusyError

    assert isinstance(errors[0], ThreadBusyError), errors[0]
    assert errors[0].error_code == "STORAGE_BUSY_002"
    assert calls == [0, 1]  # the loser's node never ran
    winner = texts(wins[0]["messages"])
    assert winner[1:] == ["slow2"] and winner[0] in ("x", "y")
    stored = await checkpointer.aget_state({"thread_id": tid})
    assert stored.count == 2
    assert stored.execution_meta.status == "completed"
    ctx = texts(stored.context)
    # Neither the loser's input nor its output is in the thread.
    assert ctx == ["first", "slow1", winner[0], "slow2"]
    listed = await checkpointer.alist_messages({"thread_id": tid})
    assert texts(listed) == ctx
    assert len({m.message_id for m in listed}) == len(listed)


# -- input "state" updates -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_input_state_update_sets_known_fields_only(checkpointer, make_thread) -> None:
    seen = {}

    def a(state: CounterState):
        seen["count"] = state.count
        seen["route"] = state.route
        return "a"

    app = linear(CounterState, a).compile(checkpointer=checkpointer)
    tid = make_thread()
    update = {
        "count": 5,
        "route": "preset",
        "context": [],  # protected
        "context_summary": "not allowed",  # protected
        "execution_meta": {"current_node": "x"},  # protected
        "not_a_field": 1,  # unknown: ignored, as 10xGraph does
    }
    r = await app.ainvoke({"messages": [user("hi")], "state": update}, {"thread_id": tid}, "full")
    assert seen == {"count": 5, "route": "preset"}
    st = r["state"]
    assert texts(st.context) == ["hi", "a"]
    assert st.context_summary is None
    assert st.execution_meta.status == "completed"
    assert not hasattr(st, "not_a_field")
    assert (await checkpointer.aget_state({"thread_id": tid})).count == 5
    # on an existing thread a state-only input needs no messages
    r2 = await app.ainvoke({"state": {"count": 9}}, {"thread_id": tid}, "full")
    assert seen["count"] == 9
    assert r2["state"].count == 9


@pytest.mark.asyncio
async def test_input_state_current_node_sets_start_node(checkpointer, make_thread) -> None:
    def a(state):
        return "a"

    def b(state):
        return "b"

    app = linear(CounterState, a, b).compile(checkpointer=checkpointer)
    r = await app.ainvoke(
        {"messages": [user("hi")], "state": {"current_node": "b"}}, {"thread_id": make_thread()}, "full"
    )
    assert texts(r["messages"]) == ["hi", "b"]
    with pytest.raises(ValueError, match="not a node"):
        await app.ainvoke({"messages": [user("x")], "state": {"current_node": "nope"}}, {"thread_id": make_thread()})


# -- response granularity and token usage --------------------------------------------------


@pytest.mark.asyncio
async def test_response_granularity_shapes(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    tid = make_thread()
    low = await app.ainvoke({"messages": [user("l")]}, {"thread_id": tid})
    assert set(low) == {"messages", "token_usage"}
    assert texts(low["messages"]) == ["l", "A1", "B1"]
    assert all(isinstance(m, Message) for m in low["messages"])

    low2 = await app.ainvoke({"messages": [user("l2")]}, {"thread_id": tid}, ResponseGranularity.LOW)
    assert set(low2) == {"messages", "token_usage"}

    partial = await app.ainvoke({"messages": [user("p")]}, {"thread_id": tid}, "partial")
    assert set(partial) == {"context", "summary", "messages", "token_usage"}
    assert texts(partial["messages"]) == ["p", "A3", "B3"]
    assert texts(partial["context"]) == ["l", "A1", "B1", "l2", "A2", "B2", "p", "A3", "B3"]
    assert partial["summary"] is None

    full = await app.ainvoke({"messages": [user("f")]}, {"thread_id": tid}, ResponseGranularity.FULL)
    assert set(full) == {"state", "messages", "token_usage"}
    assert isinstance(full["state"], CounterState)
    assert full["state"].count == 4
    assert texts(full["messages"]) == ["f", "A4", "B4"]


@pytest.mark.asyncio
async def test_bad_granularity_is_value_error(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    with pytest.raises(ValueError):
        await app.ainvoke({"messages": [user("x")]}, {"thread_id": make_thread()}, "everything")


@pytest.mark.asyncio
async def test_token_usage_sums_message_usages(checkpointer, make_thread) -> None:
    def m1(state):
        msg = Message.text_message("m1", role="assistant")
        msg.usages = TokenUsages(prompt_tokens=10, completion_tokens=5, total_tokens=15, reasoning_tokens=2)
        return msg

    def m2(state):
        msg = Message.text_message("m2", role="assistant")
        msg.usages = TokenUsages(prompt_tokens=3, completion_tokens=1, total_tokens=4)
        return [msg, "no usage"]

    app = linear(CounterState, m1, m2).compile(checkpointer=checkpointer)
    tid = make_thread()
    r = await app.ainvoke({"messages": [user("hi")]}, {"thread_id": tid})
    assert r["token_usage"] == {
        "total_input_tokens": 13,
        "total_output_tokens": 6,
        "total_reasoning_tokens": 2,
        "total_tokens": 19,
    }
    # a second run counts only its own messages
    r2 = await app.ainvoke({"messages": [user("again")]}, {"thread_id": tid}, "partial")
    assert r2["token_usage"] == r["token_usage"]
    # usages survive persistence
    stored = await checkpointer.alist_messages({"thread_id": tid})
    assert stored[1].usages is not None and stored[1].usages.prompt_tokens == 10


@pytest.mark.asyncio
async def test_token_usage_zero_without_usages(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    r = await app.ainvoke({"messages": [user("hi")]}, {"thread_id": make_thread()})
    assert r["token_usage"] == {
        "total_input_tokens": 0,
        "total_output_tokens": 0,
        "total_reasoning_tokens": 0,
        "total_tokens": 0,
    }


# -- sync invoke ---------------------------------------------------------------------------


def test_invoke_sync(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    tid = make_thread()
    r = app.invoke({"messages": [user("sync")]}, {"thread_id": tid}, "full")
    assert texts(r["messages"]) == ["sync", "A1", "B1"]
    r2 = app.invoke({"messages": [user("again")]}, {"thread_id": tid})
    assert texts(r2["messages"]) == ["again", "A2", "B2"]
    assert checkpointer.get_state({"thread_id": tid}).count == 2


@pytest.mark.asyncio
async def test_invoke_sync_inside_running_loop(checkpointer, make_thread) -> None:
    asyncio.get_running_loop()  # really inside a loop

    async def anode(state: CounterState):
        return f"async:{_CV.get()}"

    def snode(state: CounterState):
        return f"sync:{_CV.get()}"

    app = linear(CounterState, anode, snode).compile(checkpointer=checkpointer)
    _CV.set("from-loop")
    tid = make_thread()
    r = app.invoke({"messages": [user("hi")]}, {"thread_id": tid}, "full")
    assert texts(r["messages"]) == ["hi", "async:from-loop", "sync:from-loop"]
    # the same thread then continues with ainvoke on this loop
    r2 = await run_full(app, tid, "more")
    assert texts(r2["messages"]) == ["more", "async:from-loop", "sync:from-loop"]


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_fresh_thread_without_messages_is_value_error(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    tid = make_thread()
    for data in ({}, {"messages": []}, {"state": {"count": 3}}):
        with pytest.raises(ValueError) as ei:
            await app.ainvoke(data, {"thread_id": tid})
        assert str(ei.value) == "Input data must contain 'messages' for new execution."
    assert await checkpointer.aget_state({"thread_id": tid}) is None
    assert await checkpointer.alist_messages({"thread_id": tid}) == []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("input_data", "config", "exc"),
    [
        ([user("hi")], {}, TypeError),
        ("hi", {}, TypeError),
        ({"messages": user("hi")}, {}, ValueError),
        ({"messages": "hi"}, {}, ValueError),
        ({"messages": [user("hi")]}, {"recursion_limit": 0}, ValueError),
        ({"messages": [user("hi")]}, {"recursion_limit": "x"}, ValueError),
        ({"messages": [user("hi")]}, {"recursion_limit": -1}, ValueError),
        ({"messages": [user("hi")]}, "not a dict", TypeError),
        ({"messages": [user("hi")]}, [("thread_id", "t")], TypeError),
    ],
    ids=[
        "input-list",
        "input-str",
        "messages-message",
        "messages-str",
        "limit-0",
        "limit-str",
        "limit-negative",
        "config-str",
        "config-list",
    ],
)
async def test_bad_inputs(checkpointer, make_thread, input_data, config, exc) -> None:
    ran = []

    def n(state):
        ran.append(1)
        return "n"

    app = linear(CounterState, n).compile(checkpointer=checkpointer)
    tid = make_thread()
    if isinstance(config, dict):
        config = {"thread_id": tid, **config}
    with pytest.raises(exc):
        await app.ainvoke(input_data, config)
    assert ran == []
    assert await checkpointer.aget_state({"thread_id": tid}) is None


def test_bad_input_sync_invoke(checkpointer) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    with pytest.raises(TypeError):
        app.invoke("nope", {"thread_id": "x"})


# -- lifecycle -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_aclose_is_idempotent(checkpointer, make_thread) -> None:
    app = _ab_graph().compile(checkpointer=checkpointer)
    await app.ainvoke({"messages": [user("hi")]}, {"thread_id": make_thread()})
    first = await app.aclose()
    assert isinstance(first, dict)
    assert "status" in first
    assert first["status"] != "already_closed"
    assert await app.aclose() == {"status": "already_closed"}


@pytest.mark.asyncio
async def test_async_context_manager(checkpointer, make_thread) -> None:
    tid = make_thread()
    async with _ab_graph().compile(checkpointer=checkpointer) as app:
        r = await app.ainvoke({"messages": [user("ctx")]}, {"thread_id": tid})
        assert texts(r["messages"]) == ["ctx", "A1", "B1"]
    assert await app.aclose() == {"status": "already_closed"}
