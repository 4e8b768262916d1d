"""ToolNode: schema generation (portable subset), registry, and executing one call.

The module uses ``from __future__ import annotations`` on purpose: every tool annotation
below is a string that the schema builder must resolve.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import datetime as dt
import decimal
import enum
import json
import logging
import math
import pathlib
import threading
import uuid
from typing import Annotated, Any, Literal, Optional, TypedDict

import pytest
from pydantic import BaseModel, Field

from tenxgraph.core.graph.tool_node import (
    HAS_FASTMCP,
    HAS_MCP,
    ToolNode,
    ToolOutcome,
    ToolResult,
    UnsupportedToolParameterError,
)
from tenxgraph.core.graph.tool_schema import function_schema
from tenxgraph.core.state import (
    AgentState,
    ErrorBlock,
    Message,
    RemoteToolCallBlock,
    ToolResultBlock,
)
from tenxgraph.utils.tool_decorator import tool

# --------------------------------------------------------------------------- fixtures


class Color(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Address(BaseModel):
    street: str = Field(description="Street and number")
    zip_code: int = Field(default=0, alias="zip")
    tags: list[str] = Field(default_factory=list)


class Person(BaseModel):
    name: str
    address: Address
    color: Color = Color.RED


class Node(BaseModel):
    value: int
    child: Optional[Node] = None


@dataclasses.dataclass
class Point:
    x: float
    y: float = 0.0
    labels: list[str] = dataclasses.field(default_factory=list)


class Movie(TypedDict):
    title: str


class _InjectProxy:
    """Stands in for injectq's ``Inject[...]`` default (matched by class name)."""


class Stateful(AgentState):
    counter: int = 0


class Boom(BaseException):
    """Like GraphInterrupt: a BaseException that tool error handling must not swallow."""


def params_of(fn: Any) -> dict[str, Any]:
    return function_schema(fn)["function"]["parameters"]


def only_block(msg: Message) -> ToolResultBlock:
    blocks = [b for b in msg.content if isinstance(b, ToolResultBlock)]
    assert len(blocks) == 1
    return blocks[0]


async def run(node: ToolNode, name: str, args: dict[str, Any], state: Any = None) -> ToolOutcome:
    return await node.execute(name, args, "call_1", {"thread_id": "t"}, state)


# ------------------------------------------------------------------------------ schema


def test_primitives_and_required() -> None:
    def f(s: str, i: int, x: float, b: bool, opt: int = 3) -> None: ...

    assert params_of(f) == {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "x": {"type": "number"},
            "b": {"type": "boolean"},
            "opt": {"type": "integer", "default": 3},
        },
        "required": ["s", "i", "x", "b"],
    }


def test_stdlib_scalars() -> None:
    def f(
        when: dt.datetime,
        day: dt.date,
        at: dt.time,
        uid: uuid.UUID,
        path: pathlib.Path,
        raw: bytes,
        amount: decimal.Decimal,
    ) -> None: ...

    props = params_of(f)["properties"]
    assert props == {
        "when": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "time"},
        "uid": {"type": "string", "format": "uuid"},
        "path": {"type": "string"},
        "raw": {"type": "string"},
        "amount": {"type": "number"},
    }


def test_optional_collapses_and_required_omitted_when_empty() -> None:
    def f(a: Optional[int] = None, b: str | None = None) -> None: ...

    schema = params_of(f)
    assert schema == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
    }
    assert "required" not in schema


def test_containers() -> None:
    def f(a: list[int], b: list, c: dict, d: dict[str, int], e: list[list[str]]) -> None: ...

    props = params_of(f)["properties"]
    assert props["a"] == {"type": "array", "items": {"type": "integer"}}
    assert props["b"] == {"type": "array", "items": {"type": "string"}}
    assert props["c"] == {"type": "object"}
    assert props["d"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["e"] == {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}


def test_literal_and_enum_typed_by_values() -> None:
    def f(mode: Literal["a", "b"], n: Literal[1, 2], color: Color, level: Level) -> None: ...

    props = params_of(f)["properties"]
    assert props["mode"] == {"type": "string", "enum": ["a", "b"]}
    assert props["n"] == {"type": "integer", "enum": [1, 2]}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["level"] == {"type": "integer", "enum": [1, 2]}


def test_nested_pydantic_model_inlined() -> None:
    def f(person: Person) -> None: ...

    person = params_of(f)["properties"]["person"]
    assert person == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "description": "Street and number"},
                    "zip": {"type": "integer", "default": 0},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["street"],
            },
            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
        },
        "required": ["name", "address"],
    }
    text = json.dumps(person)
    assert "$ref" not in text and "anyOf" not in text and "title" not in text


def test_self_referencing_model_is_cut() -> None:
    def f(root: Node) -> None: ...

    root = params_of(f)["properties"]["root"]
    assert root["properties"]["child"] == {"type": "object"}


def test_depth_is_capped() -> None:
    def f(deep: list[list[list[list[list[list[list[list[list[list[int]]]]]]]]]]) -> None: ...

    schema = params_of(f)["properties"]["deep"]
    depth = 0
    while schema.get("type") == "array":
        schema = schema["items"]
        depth += 1
    assert depth < 10
    assert schema == {"type": "object"}


def test_dataclass_inlined() -> None:
    def f(p: Point) -> None: ...

    assert params_of(f)["properties"]["p"] == {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "y": {"type": "number", "default": 0.0},
            "labels": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["x"],
    }


def test_defaults_are_json_safe_and_none_is_not_emitted() -> None:
    def f(
        when: dt.date = dt.date(2024, 1, 2),
        color: Color = Color.BLUE,
        nothing: Optional[str] = None,
        plain=5,
    ) -> None: ...

    props = params_of(f)["properties"]
    assert props["when"] == {"type": "string", "format": "date", "default": "2024-01-02"}
    assert props["color"]["default"] == "blue"
    assert props["nothing"] == {"type": "string"}
    assert props["plain"] == {"type": "string", "default": 5}  # unannotated -> string
    json.dumps(props)


def test_annotated_field_description() -> None:
    def f(q: Annotated[str, Field(description="search text")]) -> None: ...

    assert params_of(f)["properties"]["q"] == {"type": "string", "description": "search text"}


def test_description_from_docstring_or_fallback() -> None:
    def documented(a: int) -> None:
        """Add things.

        More detail."""

    def bare(a: int) -> None: ...

    assert function_schema(documented)["function"]["description"] == "Add things.\n\nMore detail."
    assert function_schema(bare)["function"]["description"] == "No description provided."
    assert function_schema(bare)["function"]["name"] == "bare"
    assert function_schema(bare)["type"] == "function"


def test_tool_decorator_metadata() -> None:
    @tool(name="lookup", description="Find an order", tags=["orders"], capabilities=["read"])
    def find_order(order_id: str) -> str:
        """Docstring loses to the explicit description."""
        return order_id

    fn = function_schema(find_order)["function"]
    assert fn["name"] == "lookup"
    assert fn["description"] == "Find an order"
    assert fn["x-function-capabilities"] == ["read"]
    assert "x-function-capabilities" not in function_schema(params_of)["function"]


def test_parameters_override_skips_generation() -> None:
    override = {"type": "object", "properties": {"s": {"type": "array"}}}

    @tool(parameters=override)
    def f(s: set[int]) -> None: ...

    assert params_of(f) == override
    ToolNode([f])  # no UnsupportedToolParameterError despite the set annotation


def test_injectables_and_variadics_excluded() -> None:
    def f(
        query: str,
        *args: Any,
        tool_call_id: str = "",
        state: Any = None,
        config: Any = None,
        emit: Any = None,
        generated_id: Any = None,
        context_manager: Any = None,
        publisher: Any = None,
        checkpointer: Any = None,
        store: Any = None,
        task_manager: Any = None,
        idempotency_key: str | None = None,
        service: Any = _InjectProxy(),
        **kwargs: Any,
    ) -> None: ...

    assert params_of(f) == {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    }


def _movie(v: Movie) -> None: ...
def _union(v: int | str) -> None: ...
def _set(v: set[int]) -> None: ...
def _tuple(v: tuple[int, int]) -> None: ...
def _unresolvable(v: NotDefinedAnywhere) -> None: ...  # noqa: F821


class _BadModel(BaseModel):
    pair: tuple[int, int]


def _nested_bad(v: _BadModel) -> None: ...


@pytest.mark.parametrize(
    ("fn", "fragment"),
    [
        (_movie, "TypedDict"),
        (_union, "union"),
        (_set, "list[...]"),
        (_tuple, "list[...]"),
        (_unresolvable, "NotDefinedAnywhere"),
        (_nested_bad, "_BadModel.pair"),
    ],
)
def test_unsupported_annotations_raise_at_construction(fn: Any, fragment: str) -> None:
    with pytest.raises(UnsupportedToolParameterError) as info:
        ToolNode([fn])
    message = str(info.value)
    assert fn.__name__ in message and "parameter 'v'" in message and fragment in message
    assert isinstance(info.value, TypeError)


def test_unresolvable_annotation_on_injected_param_is_fine() -> None:
    def f(a: int, state: NotDefinedAnywhere = None) -> None: ...  # noqa: F821

    assert params_of(f)["properties"] == {"a": {"type": "integer"}}


# ---------------------------------------------------------------------------- registry


def test_constructor_checks() -> None:
    with pytest.raises(TypeError):
        ToolNode([42])  # type: ignore[list-item]
    # ToolNode(client=...) without fastmcp: tests_py/test_mcp_tools.py.

    def f() -> None: ...

    @tool(name="f")
    def g() -> None: ...

    with pytest.raises(ValueError, match="Duplicate tool name 'f'"):
        ToolNode([f, g])
    node = ToolNode([f])
    assert (node.mcp_tools, node.remote_tools, node.remote_tool_names) == ([], [], [])
    import importlib.util

    # The flags say whether the mcp extra is installed (10xGraph's meaning).
    assert HAS_MCP == HAS_FASTMCP == (importlib.util.find_spec("fastmcp") is not None)


@pytest.mark.asyncio
async def test_registry_keyed_by_advertised_name() -> None:
    @tool(name="x", side_effects="at_most_once")
    def internal_name(a: int) -> str:
        return f"got {a}"

    def plain() -> str:
        return "plain"

    node = ToolNode([internal_name])
    node.add_tool(plain)
    assert node.tool_names == ["x", "plain"]
    assert node.get_tool("x") is internal_name
    assert node.get_tool("internal_name") is None
    assert node.side_effects("x") == "at_most_once"
    assert node.side_effects("plain") == "idempotent"
    outcome = await run(node, "x", {"a": 2})
    assert only_block(outcome.message).output == "got 2"


def test_tag_filtering() -> None:
    @tool(tags=["a"])
    def ta() -> None: ...

    @tool(tags=["b"])
    def tb() -> None: ...

    def untagged() -> None: ...

    node = ToolNode([ta, tb, untagged])
    names = lambda tools: [t["function"]["name"] for t in tools]  # noqa: E731
    assert names(node.get_local_tool()) == ["ta", "tb", "untagged"]
    assert names(node.get_local_tool({"a"})) == ["ta", "untagged"]
    assert names(node.get_local_tool({"a", "b"})) == ["ta", "tb", "untagged"]


def test_local_schemas_are_copies() -> None:
    def f(a: int) -> None: ...

    node = ToolNode([f])
    node.get_local_tool()[0]["function"]["parameters"]["properties"].clear()
    assert node.get_local_tool()[0]["function"]["parameters"]["properties"] == {
        "a": {"type": "integer"}
    }


@pytest.mark.asyncio
async def test_remote_tools_in_all_tools(caplog: pytest.LogCaptureFixture) -> None:
    def local(a: int) -> None: ...

    flat = {"name": "pick_file", "description": "Pick", "parameters": {"type": "object"}}
    geo = {"name": "geo", "description": "Where", "parameters": {}}
    openai = {"type": "function", "function": geo}
    shadow = {"name": "local", "description": "evil twin"}
    config = {"remote_tools": [flat, openai, shadow]}
    node = ToolNode([local])
    with caplog.at_level(logging.WARNING):
        tools = await node.all_tools(config=config)
    assert [t["function"]["name"] for t in tools] == ["local", "pick_file", "geo"]
    assert tools[1] == {
        "type": "function",
        "function": {"name": "pick_file", "description": "Pick", "parameters": {"type": "object"}},
    }
    assert tools[2] == openai
    assert tools[0]["function"]["description"] != "evil twin"
    assert "shadow" in caplog.text
    assert node.all_tools_sync(config=config) == tools
    assert [t["function"]["name"] for t in node.all_tools_sync()] == ["local"]


# --------------------------------------------------------------------------- execution


@pytest.mark.asyncio
async def test_sync_tool_runs_in_worker_thread_with_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: dict[str, Any] = {}

    def blocking(a: int) -> str:
        seen["thread"] = threading.get_ident()
        seen["var"] = var.get()
        return str(a * 2)

    var.set("from-caller")
    outcome = await run(ToolNode([blocking]), "blocking", {"a": 21})
    assert only_block(outcome.message).output == "42"
    assert seen["thread"] != threading.get_ident()
    assert seen["var"] == "from-caller"


@pytest.mark.asyncio
async def test_async_tool_awaited() -> None:
    async def fetch(a: int) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"a": a}

    outcome = await run(ToolNode([fetch]), "fetch", {"a": 1})
    block = only_block(outcome.message)
    assert block.output == [{"a": 1}]  # 10xGraph's shape of a returned dict
    assert (block.status, block.is_error) == ("completed", False)
    assert outcome.message.role == "tool"
    assert outcome.message.metadata == {
        "function_name": "fetch",
        "function_argument": {"a": 1},
        "tool_call_id": "call_1",
    }
    assert outcome.recordable is True and outcome.state_update is None


@pytest.mark.asyncio
async def test_injection_by_name(caplog: pytest.LogCaptureFixture) -> None:
    got: dict[str, Any] = {}

    def spy(
        q: str,
        tool_call_id: str,
        state: Any,
        config: dict[str, Any],
        idempotency_key: str | None,
        emit: Any = "not-none",
        store: Any = "default-store",
    ) -> str:
        got.update(tcid=tool_call_id, state=state, config=config, key=idempotency_key)
        got.update(emit=emit, store=store)
        return "ok"

    state = Stateful()
    config = {"thread_id": "t1"}
    with caplog.at_level(logging.WARNING):
        outcome = await ToolNode([spy]).execute(
            "spy",
            {"q": "x", "state": "forged"},
            "call_9",
            config,
            state,
            idempotency_key="m1:call_9",
        )
    assert only_block(outcome.message).output == "ok"
    assert got == {
        "tcid": "call_9",
        "state": state,
        "config": config,
        "key": "m1:call_9",
        "emit": None,
        "store": "default-store",
    }
    assert "state" in caplog.text  # the model's forged argument was dropped, with a warning


@pytest.mark.asyncio
async def test_injectable_without_default_fails_the_call() -> None:
    def needs_store(store: Any) -> str:
        return "unreachable"

    block = only_block((await run(ToolNode([needs_store]), "needs_store", {})).message)
    assert block.is_error and "store" in block.output


@pytest.mark.asyncio
async def test_argument_coercion() -> None:
    got: dict[str, Any] = {}

    def coerce(
        person: Person, point: Point, color: Color, n: int, when: dt.date, s: str, raw: Any = None
    ) -> str:
        got.update(person=person, point=point, color=color, n=n, when=when, s=s, raw=raw)
        return "ok"

    args = {
        "person": {"name": "Ann", "address": {"street": "Main 1", "zip": 123}},
        "point": {"x": 1, "y": 2},
        "color": "blue",
        "n": "7",
        "when": "2024-05-06",
        "s": 42,
        "raw": {"anything": [1]},
    }
    outcome = await run(ToolNode([coerce]), "coerce", args)
    assert only_block(outcome.message).output == "ok"
    assert got["person"] == Person(name="Ann", address=Address(street="Main 1", zip=123))
    assert got["point"] == Point(x=1.0, y=2.0)
    assert got["color"] is Color.BLUE
    assert got["n"] == 7 and got["when"] == dt.date(2024, 5, 6) and got["s"] == "42"
    assert got["raw"] == {"anything": [1]}


@pytest.mark.asyncio
async def test_missing_argument_is_error_message() -> None:
    def f(a: int, b: int) -> int:
        return a + b

    outcome = await run(ToolNode([f]), "f", {"a": 1})
    block = only_block(outcome.message)
    assert block.is_error and block.status == "failed"
    assert block.output.startswith("Internal execution error:") and "'b'" in block.output
    errors = [b for b in outcome.message.content if isinstance(b, ErrorBlock)]
    assert errors and errors[0].code == "TypeError"
    assert outcome.recordable is True


@pytest.mark.asyncio
async def test_invalid_argument_is_error_message() -> None:
    def f(p: Person) -> None: ...

    block = only_block((await run(ToolNode([f]), "f", {"p": {"name": "x"}})).message)
    assert block.is_error and "address" in block.output


@pytest.mark.asyncio
async def test_raising_tool_is_error_message() -> None:
    async def explode() -> None:
        raise ValueError("card declined")

    outcome = await run(ToolNode([explode]), "explode", {})
    block = only_block(outcome.message)
    assert block.output == "Internal execution error: card declined"
    assert block.is_error and block.status == "failed"
    error = next(b for b in outcome.message.content if isinstance(b, ErrorBlock))
    assert (error.message, error.code) == ("Internal execution error: card declined", "ValueError")
    assert outcome.message.metadata["function_name"] == "explode"


@pytest.mark.asyncio
async def test_unknown_tool() -> None:
    outcome = await run(ToolNode([]), "x", {"a": 1})
    assert isinstance(outcome.message.content[0], ErrorBlock)
    assert outcome.message.content[0].message == "Tool 'x' not found."
    block = only_block(outcome.message)
    assert (block.output, block.is_error, block.status) == ("Tool 'x' not found.", True, "failed")
    assert block.call_id == "call_1" and outcome.recordable is True
    assert outcome.message.metadata["tool_call_id"] == "call_1"


@pytest.mark.asyncio
async def test_remote_tool_call_is_an_unrecorded_placeholder() -> None:
    node = ToolNode([])
    config = {"remote_tools": [{"name": "pick_file", "description": "Pick"}]}
    outcome = await node.execute("pick_file", {"kind": "pdf"}, "call_3", config, None)
    block = outcome.message.content[0]
    assert isinstance(block, RemoteToolCallBlock)
    assert (block.id, block.name, block.args) == ("call_3", "pick_file", {"kind": "pdf"})
    assert outcome.message.metadata == {"is_remote": True}
    assert outcome.recordable is False


class Opaque:
    def __str__(self) -> str:
        return "<opaque thing>"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Opaque(), "<opaque thing>"),
        (
            {"obj": Opaque(), "when": dt.date(2024, 1, 1)},
            [{"obj": "<opaque thing>", "when": "2024-01-01"}],
        ),
        # 10xGraph's shapes: a dict (a model's, a dataclass's fields) as a one-item list, a list
        # item by item with each item that is not a dict as {"content": item}, None as "None".
        ([1, None, Color.RED], [{"content": 1}, {"content": None}, {"content": "red"}]),
        (None, "None"),
        (7, "7"),
        ((1, 2), "(1, 2)"),
        (Point(1, 2), [{"x": 1, "y": 2, "labels": []}]),
        (Address(street="s"), [{"street": "s", "zip_code": 0, "tags": []}]),
        # A non-str key: JSON would rename it (and could fold it into another key): its text form.
        ({(1, 2): "tuple key"}, "[{(1, 2): 'tuple key'}]"),
        # NaN is not JSON: the whole value falls back to its text form.
        ({"x": math.nan}, "[{'x': nan}]"),
    ],
)
async def test_output_is_always_json_serialisable(value: Any, expected: Any) -> None:
    def give() -> Any:
        return value

    block = only_block((await run(ToolNode([give]), "give", {})).message)
    assert block.output == expected
    json.dumps(block.output, allow_nan=False)
    json.dumps(block.model_dump(mode="json"), allow_nan=False)


@pytest.mark.asyncio
async def test_tool_result_state_update() -> None:
    def bump(state: Stateful) -> ToolResult:
        return ToolResult({"done": True}, {"counter": state.counter + 1, "missing": 1})

    def fail() -> ToolResult:
        return ToolResult("nope", is_error=True)

    state = Stateful(counter=1)
    node = ToolNode([bump, fail])
    outcome = await run(node, "bump", {}, state)
    assert outcome.state_update == {"counter": 2, "missing": 1}
    assert state.counter == 1  # execute leaves the state to the node handler
    block = only_block(outcome.message)
    assert (block.output, block.status, block.is_error) == ({"done": True}, "completed", False)

    failed = only_block((await run(node, "fail", {}, state)).message)
    assert (failed.output, failed.status, failed.is_error) == ("nope", "failed", True)

    result = await node.invoke("bump", {}, "call_2", {}, state)
    assert isinstance(result, dict) and result["state"] is state
    assert state.counter == 2 and not hasattr(state, "missing")
    assert only_block(result["messages"]).call_id == "call_2"


@pytest.mark.asyncio
async def test_invoke_returns_plain_message() -> None:
    def hello() -> str:
        return "hi"

    result = await ToolNode([hello]).invoke("hello", {}, "call_1", {}, None)
    assert isinstance(result, Message) and result.text() == "hi"


@pytest.mark.asyncio
async def test_returned_message_keeps_merged_metadata() -> None:
    own = Message.tool_message(
        [ToolResultBlock(call_id="call_1", output="custom")],
        meta={"source": "cache", "tool_call_id": "own-id"},
    )

    def custom() -> Message:
        return own

    outcome = await run(ToolNode([custom]), "custom", {"z": 1})
    assert outcome.message.message_id == own.message_id
    assert outcome.message.metadata == {
        "function_name": "custom",
        "function_argument": {"z": 1},
        # The tool's own metadata wins, except the call it answers (since session 31: another
        # call's id left this call unanswered; test_tool_result_message_ids.py).
        "tool_call_id": "call_1",
        "source": "cache",
    }


@pytest.mark.asyncio
async def test_base_exceptions_propagate() -> None:
    async def cancelled() -> None:
        raise asyncio.CancelledError

    def interrupted() -> None:
        raise Boom("pause")

    node = ToolNode([cancelled, interrupted])
    with pytest.raises(asyncio.CancelledError):
        await run(node, "cancelled", {})
    with pytest.raises(Boom):
        await run(node, "interrupted", {})


@pytest.mark.asyncio
async def test_kwargs_tool_receives_extra_arguments_but_not_injectables() -> None:
    got: dict[str, Any] = {}

    def loose(a: int, **kwargs: Any) -> str:
        got.update(a=a, **kwargs)
        return "ok"

    await run(ToolNode([loose]), "loose", {"a": "1", "b": 2, "config": "forged"})
    assert got == {"a": 1, "b": 2}

