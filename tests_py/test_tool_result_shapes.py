"""Tool results the stored JSON cannot hold as they are (nesting past what the core's JSON parser
accepts, NaN/inf, non-str keys, integers past 64 bits, objects pydantic cannot dump).

Each must be stored faithfully or as its str(), and in every case: the tool ran once, the model
got a success, the ledger row is a result (not an intent left `started`), and a replay of the node
answers from the ledger without running the tool again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tenxgraph import AgentState, Message
from tenxgraph.core.exceptions import FailpointError
from tenxgraph.core.graph.tool_node import MAX_RESULT_DEPTH
from tenxgraph.core.state.message_block import ToolResultBlock

from .tool_graphs import call, tool_graph

pytestmark = pytest.mark.asyncio


def nested_dict(levels: int) -> dict[str, Any]:
    """``levels`` dicts, one inside the other."""
    d: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        d = {"k": d}
    return d


def nested_list(levels: int) -> list[Any]:
    value: list[Any] = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


class Opaque:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<Opaque>"


def shaped(value: Any) -> Any:
    """10xGraph's shape of a plain tool result (docs/concepts.md), written out here on its own: a
    dict as a one-item list, a list item by item with each item that is not a dict as
    ``{"content": item}``, anything else as it is (before the JSON rules)."""
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [v if isinstance(v, dict) else {"content": v} for v in value]
    return value


def as_text(value: Any) -> Callable[[Any], bool]:
    expected = str(shaped(value))
    return lambda out: out == expected


def equals(expected: Any) -> Callable[[Any], bool]:
    return lambda out: out == shaped(expected)


# The shape's list is one level of nesting: a dict one level short of the limit is the deepest kept.
AT_LIMIT = nested_dict(MAX_RESULT_DEPTH - 1)
PAST_LIMIT = nested_list(MAX_RESULT_DEPTH + 1)
DEEP_DICT = nested_dict(150)
DEEP_LIST = nested_list(200)
NAN_DEEP = {"a": [{"b": float("nan")}]}
INF_LIST = [1.0, float("-inf")]
KEYS = {1: "int", "1": "str"}  # JSON would fold these two keys into one
TUPLE_KEY = {(2, 3): "pair"}
HUGE_INT = {"n": 10**400}
WIDE_INT = {"n": 2**64 + 1}  # a float once parsed: not faithful
EDGE_INTS = {"min": -(2**63), "max": 2**64 - 1}
VERY_DEEP = nested_dict(5000)  # too deep even for str()

CASES: list[tuple[str, Callable[[], Any], Callable[[Any], bool]]] = [
    ("dict-at-depth-limit", lambda: AT_LIMIT, equals(AT_LIMIT)),
    ("dict-past-depth-limit", lambda: nested_dict(MAX_RESULT_DEPTH), as_text(nested_dict(MAX_RESULT_DEPTH))),
    ("list-past-depth-limit", lambda: PAST_LIMIT, as_text(PAST_LIMIT)),
    ("dict-150-deep", lambda: DEEP_DICT, as_text(DEEP_DICT)),
    ("list-200-deep", lambda: DEEP_LIST, as_text(DEEP_LIST)),
    ("nan-nested", lambda: NAN_DEEP, as_text(NAN_DEEP)),
    ("inf-in-list", lambda: INF_LIST, as_text(INF_LIST)),
    ("int-and-str-keys", lambda: KEYS, as_text(KEYS)),
    ("tuple-key", lambda: TUPLE_KEY, as_text(TUPLE_KEY)),
    ("object-pydantic-cannot-dump", lambda: {"o": Opaque()}, equals({"o": "<Opaque>"})),
    ("huge-int-in-dict", lambda: HUGE_INT, as_text(HUGE_INT)),
    ("int-past-64-bits", lambda: WIDE_INT, as_text(WIDE_INT)),
    ("ints-at-64-bit-edges", lambda: EDGE_INTS, equals(EDGE_INTS)),
    ("bare-huge-int", lambda: 10**400, as_text(10**400)),
    ("too-deep-for-str", lambda: VERY_DEEP, lambda out: isinstance(out, str) and out.startswith("[{'k': {'k': ")),
]


def _tool_block(messages: list[Message]) -> ToolResultBlock:
    blocks = [b for m in messages if m.role == "tool" for b in m.content if isinstance(b, ToolResultBlock)]
    assert len(blocks) == 1
    return blocks[0]


@pytest.mark.parametrize("sync", [False, True], ids=["async-tool", "sync-tool"])
@pytest.mark.parametrize(("make", "check"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_result_json_cannot_hold_is_recorded_and_a_success(checkpointer, make_thread, make, check, sync) -> None:
    ran: list[int] = []

    if sync:
        def shaped() -> Any:
            """Returns an awkward value."""
            ran.append(1)
            return make()
    else:
        async def shaped() -> Any:
            """Returns an awkward value."""
            ran.append(1)
            return make()

    app = tool_graph(AgentState, [shaped], [[call("c1", "shaped")]], checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("shape")}
    # The step after the record fails, so the resume replays the tool node from the ledger.
    with pytest.raises(FailpointError):
        await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg, failpoints="after_record:shaped=raise"))
    assert ran == [1]

    state = await checkpointer.aget_state(dict(cfg))
    ask = next(m for m in state.context if m.tools_calls)
    key = f"{ask.message_id}:c1"
    assert await checkpointer.aget_tool_status(dict(cfg), key) == "completed"
    record = await checkpointer.aget_tool_result(dict(cfg), key)
    assert record is not None and record["__kind__"] == "message"
    recorded = _tool_block([Message.model_validate(record["value"])])
    assert recorded.is_error is False and recorded.status == "completed"
    assert check(recorded.output), recorded.output

    result = await app.ainvoke({}, dict(cfg))
    assert ran == [1], "the replay answered from the ledger"
    block = _tool_block(result["messages"])
    assert block.is_error is False and block.status == "completed"
    assert block.output == recorded.output
    assert result["messages"][-1].text() == "done"  # the model went on after the tool's answer
    # The stored thread reads back with the same answer.
    stored = await checkpointer.aget_state(dict(cfg))
    assert _tool_block(stored.context).output == recorded.output


@pytest.mark.parametrize("where", ["metadata", "timestamp"])
async def test_a_returned_message_with_nan_is_an_error_result_not_a_stored_null(checkpointer, make_thread,
                                                                                 where) -> None:
    """A tool may return its own Message; a NaN in one of its fields (not a result block, whose
    output is normalised) has no stored form and pydantic wrote it as null, silently. Now the
    model reads an error result naming the field; the tool ran once."""
    runs: list[int] = []

    def measure() -> Message:
        """Returns a message with a NaN in it."""
        runs.append(1)
        m = Message.tool_message("measured")
        if where == "metadata":
            m.metadata = {"reading": {"value": float("nan")}}
        else:
            m.timestamp = float("inf")
        return m

    app = tool_graph(AgentState, [measure], [[call("c1", "measure")]], checkpointer=checkpointer)
    tid = make_thread("nanmsgtool")
    await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})
    tool_msgs = [m for m in state.context if m.role == "tool"]
    assert len(tool_msgs) == 1
    block = tool_msgs[0].content[0]
    assert isinstance(block, ToolResultBlock) and block.is_error
    path = "metadata.reading.value is NaN" if where == "metadata" else "timestamp is inf"
    assert path in block.output
    assert runs == [1]
    assert all(v is not None for v in tool_msgs[0].metadata.values())
