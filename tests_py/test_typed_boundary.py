"""The typed boundary between the Rust loop and Python (issue 16, item 4): one options object per
run, resolved and validated in Rust; the loop's execution metadata handed over as an object; the
rules both sides need written once and exported from ``_core``."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from tenxgraph import _core, END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.compiled_graph import resolve_timeout
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.storage.checkpointer.base_checkpointer import STOP_REQUEST_NAMESPACE, BaseCheckpointer
from tenxgraph.utils.constants import DEFAULT_NODE_TIMEOUT_SECONDS, DEFAULT_TOOL_TIMEOUT_SECONDS

BASE = {"thread_id": "t", "user_id": "u", "run_id": "r"}


def options(**more: Any) -> _core.RunOptions:
    return _core.RunOptions({**BASE, **more})


# -- RunOptions ------------------------------------------------------------------------------


def test_defaults_are_the_engines() -> None:
    o = options()
    assert (o.thread_id, o.user_id, o.run_id) == ("t", "u", "r")
    assert o.recursion_limit == _core.DEFAULT_RECURSION_LIMIT == 25
    assert o.node_timeout == DEFAULT_NODE_TIMEOUT_SECONDS == _core.DEFAULT_NODE_TIMEOUT_SECONDS == 900.0
    assert o.tool_timeout == DEFAULT_TOOL_TIMEOUT_SECONDS == _core.DEFAULT_TOOL_TIMEOUT_SECONDS == 300.0
    assert (o.on_busy, o.busy_timeout, o.lease_ttl) == ("reject", 30.0, 5.0)
    assert (o.busy_timeout, o.lease_ttl) == (_core.DEFAULT_BUSY_TIMEOUT_SECONDS, _core.DEFAULT_LEASE_TTL_SECONDS)
    assert o.durable is True and o.failpoints is None


@pytest.mark.parametrize(
    ("more", "message"),
    [
        ({"recursion_limit": 0}, "recursion_limit must be a positive int, got 0"),
        ({"recursion_limit": True}, "recursion_limit must be a positive int, got True"),
        ({"recursion_limit": 2.5}, "recursion_limit must be a positive int, got 2.5"),
        ({"recursion_limit": "3"}, "recursion_limit must be a positive int, got '3'"),
        ({"on_busy": "sometimes"}, "on_busy must be one of 'reject', 'wait', 'interrupt', got 'sometimes'"),
        ({"on_busy": None}, "on_busy must be one of"),
        ({"lease_ttl": 0.05}, r"lease_ttl must be a number of seconds in \(0.1, 86400\], got 0.05"),
        ({"lease_ttl": math.nan}, "lease_ttl must be a number of seconds"),
        ({"busy_timeout": True}, r"busy_timeout must be a number of seconds in \(0, 86400\], got True"),
        ({"busy_timeout": "5"}, "busy_timeout must be a number of seconds"),
        ({"failpoints": 3}, "config\\['failpoints'\\] must be a string"),
        ({"failpoints": "no_such_point:x=kill"}, "failpoint"),
    ],
)
def test_a_bad_setting_is_refused_with_a_value_error(more: dict[str, Any], message: str) -> None:
    """A ``ValueError`` (and a ``TypeError``) as before, typed with its code since session 38."""
    from tenxgraph.core.exceptions import InvalidConfigError

    with pytest.raises(ValueError, match=message) as refused:
        options(**more)
    assert isinstance(refused.value, InvalidConfigError) and isinstance(refused.value, TypeError)
    assert refused.value.error_code == "STORAGE_CONFIG_003"


def test_a_recursion_limit_past_64_bits_is_no_limit() -> None:
    """10xGraph takes ``10**30`` (a way to say "no limit"); it was refused as not a positive int
    (red-team, session 34). A negative one still is."""
    assert options(recursion_limit=10**30).recursion_limit == 2**63 - 1
    with pytest.raises(ValueError, match="recursion_limit must be a positive int"):
        options(recursion_limit=-(10**30))


def test_options_are_immutable_and_for_run_adds_the_calls_facts() -> None:
    o = options(recursion_limit=7)
    with pytest.raises(AttributeError):
        o.recursion_limit = 8  # type: ignore[misc]
    r = o.for_run(has_messages=True, has_state_update=False, start_node="b", streaming=True,
                  known_version=4, known_mark="m", resume_only=False)
    assert (r.recursion_limit, r.has_messages, r.start_node, r.streaming, r.known_version, r.known_mark) == (
        7, True, "b", True, 4, "m")
    assert (o.has_messages, o.start_node, o.streaming) == (False, None, False)


def test_run_takes_one_options_object() -> None:
    graph = StateGraph(AgentState)
    graph.add_node("a", lambda state, config: "x")
    graph.set_entry_point("a")
    graph.add_edge("a", END)
    app = graph.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(TypeError):
        # The old positional form (thread_id, user_id, run_id, ...) is gone.
        app._native.run(None, None, None, "t", "u", "r", 25, None, None, True, False, False)


# -- timeouts: one rule, the engine's ------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(30, 30.0), ("30", 30.0), (" 1_000 ", 1000.0), (None, None), (0, None), (-1, None), ("-5", None),
     (math.inf, 1e9)],
    ids=["int", "str", "underscores", "None", "0", "-1", "str-5", "inf"],
)
def test_timeout_rule(value: Any, expected: float | None) -> None:
    assert options(node_timeout=value).node_timeout == expected
    assert resolve_timeout({"tool_timeout": value}, "tool_timeout", 300.0) == expected


@pytest.mark.parametrize("value", ["abc", [1], math.nan, True], ids=["str", "list", "nan", "bool"])
def test_an_invalid_timeout_warns_and_gives_the_default(value: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert options(tool_timeout=value).tool_timeout == 300.0
    assert any("invalid tool_timeout" in r.getMessage() and "default of 300" in r.getMessage() for r in caplog.records)


def test_a_missing_timeout_with_no_default_has_no_deadline() -> None:
    assert resolve_timeout({}, "node_timeout", None) is None
    assert resolve_timeout({}, "node_timeout", 12.0) == 12.0


@pytest.mark.asyncio
async def test_an_infinite_node_timeout_runs_without_a_deadline() -> None:
    # Before: the float reached Duration::from_secs_f64 unclamped and the run died in a Rust panic.
    graph = StateGraph(AgentState)

    async def reply(state: AgentState, config: dict[str, Any]) -> str:
        return "ok"

    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    graph.add_edge("reply", END)
    app = graph.compile(checkpointer=InMemoryCheckpointer())
    out = await app.ainvoke({"messages": [Message.text_message("hi")]},
                            {"thread_id": "inf", "node_timeout": math.inf, "tool_timeout": math.inf})
    assert [m.text() for m in out["messages"]] == ["hi", "ok"]


# -- execution metadata crosses as an object ---------------------------------------------------


@pytest.mark.asyncio
async def test_a_node_sees_the_loops_execution_metadata() -> None:
    seen: list[tuple[str, int, str, str | None]] = []

    async def first(state: AgentState, config: dict[str, Any]) -> str:
        em = state.execution_meta
        seen.append((em.current_node, em.step, em.status.value, em.thread_id))
        return "one"

    async def second(state: AgentState, config: dict[str, Any]) -> str:
        em = state.execution_meta
        seen.append((em.current_node, em.step, em.status.value, em.thread_id))
        return "two"

    graph = StateGraph(AgentState)
    graph.add_node("first", first)
    graph.add_node("second", second)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    graph.add_edge("second", END)
    app = graph.compile(checkpointer=InMemoryCheckpointer())
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "meta"})
    assert seen == [("first", 0, "running", "meta"), ("second", 1, "running", "meta")]


def test_node_result_is_typed() -> None:
    r = _core.NodeResult("next", "remote_tool_call")
    assert (r.goto, r.pause) == ("next", "remote_tool_call")
    assert (_core.NodeResult().goto, _core.NodeResult().pause) == (None, None)
    with pytest.raises(TypeError):
        _core.NodeResult(3)  # type: ignore[arg-type]


# -- rules written once --------------------------------------------------------------------------


def test_stop_key_and_namespace_are_the_engines() -> None:
    assert STOP_REQUEST_NAMESPACE == _core.STOP_NAMESPACE == "stop_request"
    cp = InMemoryCheckpointer()
    assert BaseCheckpointer._stop_request_key(cp, {"thread_id": "a", "user_id": "b"}) == _core.stop_key("a", "b") == "a:b"
    assert BaseCheckpointer._stop_request_key(cp, {"thread_id": "a"}) == "a:anonymous"


def test_store_format_constants_come_from_core() -> None:
    from tenxgraph import _state_codec
    from tenxgraph.cli import views

    assert _state_codec.STATE_META_KEY == _core.STATE_META_KEY == "__state_meta__"
    assert views.STARTED_KIND == _core.INTENT_KIND == "started"
