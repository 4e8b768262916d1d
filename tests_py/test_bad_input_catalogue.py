"""A catalogue of bad inputs (docs/bad-inputs.md): each case pins what the runtime does with it
(a typed error with an error code, or a tool error the model can read) and checks that nothing
was persisted half-way (the thread's version and messages unchanged, or a run that completes
cleanly and reads back what it wrote)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from pathlib import Path
from typing import Any

import pydantic
import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.state.message_block import ImageBlock, MediaRef
from tenxgraph.core.exceptions import GraphError, InvalidConfigError, NodeError, StorageError
from tenxgraph.storage.checkpointer import BaseCheckpointer, PgCheckpointer
from tenxgraph.utils.tool_decorator import tool

from .conftest import make_checkpointer
from .tool_graphs import call, tool_graph, tool_texts

pytestmark = pytest.mark.asyncio

SQL_ID = "t'; DROP TABLE threads; --"
UNICODE_ID = "线程-🚀"


# -- helpers -------------------------------------------------------------------------------


async def snapshot(cp: BaseCheckpointer, thread_id: Any, user_id: str | None = None):
    """(version, [(message_id, role, text)]) of a thread as ``user_id`` sees it, or None."""
    cfg: dict[str, Any] = {"thread_id": thread_id}
    if user_id is not None:
        cfg["user_id"] = user_id
    state = await cp.aget_state(cfg)
    if state is None:
        return None
    return cfg["_checkpoint_version"], [(str(m.message_id), m.role, m.text()) for m in state.context]


def one_node_graph(cp: BaseCheckpointer, model: Any, state_cls: type[AgentState] = AgentState):
    """START -> ``model`` -> END."""
    g = StateGraph(state_cls)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=cp)


def echo_graph(cp: BaseCheckpointer, reply: str = "ok"):
    """model -> END: the model answers ``reply``."""

    async def model(state: AgentState) -> Message:
        return Message.text_message(reply, role="assistant")

    return one_node_graph(cp, model)


async def seeded(cp: BaseCheckpointer, thread_id: str, user_id: str | None = None):
    """A thread with one completed run; returns (app, its snapshot)."""
    app = echo_graph(cp)
    cfg: dict[str, Any] = {"thread_id": thread_id}
    if user_id:
        cfg["user_id"] = user_id
    await app.ainvoke({"messages": [Message.text_message("hello")]}, cfg)
    snap = await snapshot(cp, thread_id, user_id)
    assert snap is not None and [r[1:] for r in snap[1]] == [("user", "hello"), ("assistant", "ok")]
    return app, snap


async def run_tools(cp: BaseCheckpointer, thread_id: str, tools: list, calls: list[dict]):
    """One turn of the scripted model asking for ``calls``; returns (result messages, outputs)."""
    app = tool_graph(AgentState, tools, [calls], checkpointer=cp)
    result = await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": thread_id})
    return result["messages"], tool_texts(result["messages"])


async def assert_clean_completion(cp: BaseCheckpointer, thread_id: str, messages: list[Message]) -> None:
    """The run reached END and the stored thread is exactly what the run returned."""
    roles = [m.role for m in messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert messages[-1].text() == "done"
    snap = await snapshot(cp, thread_id)
    assert snap is not None
    assert [(r[1], r[2]) for r in snap[1]] == [(m.role, m.text()) for m in messages]


async def echo(x: str) -> str:
    """Echo the length of x."""
    return f"echo {len(x)}"


# -- malformed tool arguments ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("{not json", "Invalid tool arguments (not valid JSON): "),
        ("[1, 2]", "Invalid tool arguments (not a JSON object): [1, 2]"),
        ('"a string"', "Invalid tool arguments (not a JSON object): 'a string'"),
        ("42", "Invalid tool arguments (not a JSON object): 42"),
    ],
    ids=["invalid-json", "json-array", "json-string", "json-number"],
)
async def test_malformed_tool_arguments_become_a_tool_error(checkpointer, make_thread, raw, expected) -> None:
    ran: list[str] = []

    async def echo_counted(x: str) -> str:
        """Echo."""
        ran.append(x)
        return x

    tid = make_thread("badargs")
    msgs, out = await run_tools(checkpointer, tid, [echo_counted], [call("c1", "echo_counted", raw_args=raw)])
    assert out["c1"].startswith(expected)
    assert ran == []  # the tool was never called
    await assert_clean_completion(checkpointer, tid, msgs)


async def test_huge_tool_arguments_5mb(checkpointer, make_thread) -> None:
    tid = make_thread("hugeargs")
    msgs, out = await run_tools(checkpointer, tid, [echo], [call("c1", "echo", {"x": "a" * 5_000_000})])
    assert out["c1"] == "echo 5000000"
    await assert_clean_completion(checkpointer, tid, msgs)
    # the assistant message carrying the 5 MB arguments reads back intact
    state = await checkpointer.aget_state({"thread_id": tid})
    assert len(state.context[1].tools_calls[0]["function"]["arguments"]) > 5_000_000


# -- tool results that JSON cannot hold -----------------------------------------------------


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


async def returns_object() -> Any:
    """Returns a non-serialisable object."""
    return Opaque()


async def returns_cycle() -> Any:
    """Returns a dict containing itself."""
    d: dict[str, Any] = {"k": 1}
    d["self"] = d
    return d


async def returns_nan() -> Any:
    """Returns NaN and infinities."""
    return {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf")}


async def returns_bare_nan() -> Any:
    """Returns a bare NaN."""
    return float("nan")


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (returns_object, "<Opaque>"),
        # A dict is shaped as 10xGraph shapes it (a one-item list), then kept as text.
        (returns_cycle, "[{'k': 1, 'self': {...}}]"),
        (returns_nan, "[{'nan': nan, 'inf': inf, 'ninf': -inf}]"),
        (returns_bare_nan, "nan"),
    ],
    ids=["non-serialisable", "cyclic-dict", "nan-inf-dict", "bare-nan"],
)
async def test_tool_result_json_cannot_hold_is_stringified(checkpointer, make_thread, fn, expected) -> None:
    tid = make_thread("badresult")
    msgs, out = await run_tools(checkpointer, tid, [fn], [call("c1", fn.__name__)])
    assert out["c1"] == expected
    await assert_clean_completion(checkpointer, tid, msgs)
    # the ledger holds the same (JSON-safe) record, so a replay answers the same text
    state = await checkpointer.aget_state({"thread_id": tid})
    key = f"{state.context[1].message_id}:c1"
    rec = await checkpointer.aget_tool_result({"thread_id": tid}, key)
    assert rec is not None


class FState(AgentState):
    score: float = 0.0


def float_graph(cp: BaseCheckpointer, value: float | None):
    """model -> END; the model sets ``state.score = value`` (when not None) and answers "x"."""

    async def model(state: FState) -> Message:
        if value is not None:
            state.score = value
        return Message.text_message("x", role="assistant")

    g = StateGraph(FState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g.compile(checkpointer=cp)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
async def test_nan_inf_in_input_state_is_rejected_before_any_write(checkpointer, make_thread, value) -> None:
    """Pinned: a plain ValueError (no error_code) from the core's JSON parser; nothing stored."""
    app = float_graph(checkpointer, None)
    tid = make_thread("naninput")
    with pytest.raises(ValueError, match="state is not valid JSON"):
        await app.ainvoke({"messages": [Message.text_message("go")], "state": {"score": value}}, {"thread_id": tid})
    assert await snapshot(checkpointer, tid) is None


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
async def test_nan_inf_set_by_a_node_fails_the_step_not_half_written(checkpointer, make_thread, value) -> None:
    """Pinned: the run's input is committed (by design), the node's step is not: its message and
    the NaN are absent; the error is a plain ValueError (no error_code)."""
    app = float_graph(checkpointer, value)
    tid = make_thread("nannode")
    with pytest.raises(ValueError, match="state is not valid JSON"):
        await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})
    assert state.score == 0.0
    assert [(m.role, m.text()) for m in state.context] == [("user", "go")]


class Typed(AgentState):
    note: str = ""
    n: int = 0
    maybe: str | None = None
    raw: Any = None


def typed_graph(cp: BaseCheckpointer, **sets: Any):
    """model -> END; the model assigns ``sets`` to its state (assignments are not validated)."""

    async def model(state: Typed) -> Typed:
        for k, v in sets.items():
            setattr(state, k, v)
        state.context.append(Message.text_message("x", role="assistant"))
        return state

    return one_node_graph(cp, model, Typed)


@pytest.mark.parametrize("update, match", [
    ({"note": None}, "field note is None, which its type \\(str\\)"),
    ({"n": None}, "field n is None, which its type \\(int\\)"),
    ({"note": b"\xff"}, "bytes that are not UTF-8"),
    ({"raw": {"k": b"\x00\xff"}}, "bytes that are not UTF-8"),
], ids=["none_in_str", "none_in_int", "bytes_in_str", "bytes_in_any"])
async def test_an_input_state_value_that_would_not_load_back_is_refused(checkpointer, make_thread, update,
                                                                         match) -> None:
    # A None where the type allows none was stored as null without a serializer warning, and
    # every later load of the thread raised a raw ValidationError; bytes that are not UTF-8 were
    # a raw UnicodeDecodeError. Both are ValueErrors naming the key now, and nothing is stored.
    app = one_node_graph(checkpointer, lambda state: Message.text_message("x", role="assistant"), Typed)
    tid = make_thread("unloadable")
    with pytest.raises(ValueError, match=f"input 'state' key '{next(iter(update))}'.*{match}") as err:
        await app.ainvoke({"messages": [Message.text_message("go")], "state": update}, {"thread_id": tid})
    assert type(err.value) is ValueError
    assert await snapshot(checkpointer, tid) is None
    # None where the type allows it, and UTF-8 bytes, are stored and load back
    await app.ainvoke({"messages": [Message.text_message("go")], "state": {"maybe": None, "raw": b"ok"}},
                      {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})
    assert state.maybe is None and state.raw == "ok"


async def test_a_node_setting_a_required_field_to_none_fails_its_step_and_the_thread_still_loads(
        checkpointer, make_thread) -> None:
    app = typed_graph(checkpointer, note=None)
    tid = make_thread("nodenull")
    with pytest.raises(ValueError, match="field note is None"):
        await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})  # a raw ValidationError before
    assert state.note == ""
    assert [(m.role, m.text()) for m in state.context] == [("user", "go")]
    # the thread runs again from another graph (a restart)
    again = typed_graph(checkpointer, note="fine")
    result = await again.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": tid})
    assert result["messages"][-1].text() == "x"


@pytest.mark.parametrize("field, value, match", [
    ("execution_meta", None, "field execution_meta is None, which its type \\(ExecutionState\\)"),
    ("context", None, "field context is None, which its type \\(list\\[Message\\]\\)"),
    ("context_summary", "a\ud800", "it holds a lone surrogate in a text"),
], ids=["execution_meta_none", "context_none", "summary_surrogate"])
async def test_aput_state_of_a_state_that_would_not_load_back_is_refused(checkpointer, make_thread, field, value,
                                                                       match) -> None:
    # Stored before (every later load a raw ValidationError), or refused with a TypeError
    # ("'NoneType' object is not iterable") or the parser's "unexpected end of hex escape".
    tid = make_thread("putnull")
    state = AgentState()
    state.context = [Message.text_message("hi")]
    setattr(state, field, value)
    with pytest.raises(ValueError, match=match):
        await checkpointer.aput_state({"thread_id": tid}, state)
    assert await snapshot(checkpointer, tid) is None


class Point(pydantic.BaseModel):
    x: float = 0.0


@dataclasses.dataclass
class Box:
    w: float = 0.0


class AnyState(AgentState):
    """No float field outside ``context``: its steps are written in one pass (encode_state_text)."""
    notes: dict[str, Any] = {}
    blob: Any = None


class NestedFloatState(AgentState):
    point: Point = Point()
    box: Box | None = None
    series: list[float] = []


def _set_nonfinite(state: AgentState, where: str, value: float) -> None:
    if where == "notes":
        state.notes = {"score": value}
    elif where == "blob":
        state.blob = [{"deep": [value]}]
    elif where == "model_in_any":
        state.blob = {"p": Point(x=value)}
    elif where == "dataclass_in_any":
        state.notes = {"b": [Box(w=value)]}
    elif where == "point":
        state.point = Point(x=value)
    elif where == "box":
        state.box = Box(w=value)
    else:
        state.series = [1.0, value]


@pytest.mark.parametrize("where", ["notes", "blob", "model_in_any", "dataclass_in_any", "point", "box", "series"])
@pytest.mark.parametrize("value", [float("nan"), float("-inf")], ids=["nan", "-inf"])
async def test_nan_inf_anywhere_in_a_node_s_state_fails_the_step_not_stored_as_null(checkpointer, make_thread,
                                                                                    value, where) -> None:
    """pydantic-core writes a NaN as ``null`` in a field typed float (nested models, dataclasses,
    lists) and in a model or dataclass held by an ``Any`` field, and as a token elsewhere: every
    one is refused by name before the dump, never stored as ``null``."""
    cls = AnyState if where in ("notes", "blob", "model_in_any", "dataclass_in_any") else NestedFloatState

    async def model(state: AgentState) -> Message:
        _set_nonfinite(state, where, value)
        return Message.text_message("x", role="assistant")

    app = one_node_graph(checkpointer, model, cls)
    tid = make_thread("nanstate")
    with pytest.raises(ValueError, match="state is not valid JSON") as raised:
        await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid})
    path = {"notes": "notes.score", "blob": "blob[0].deep[0]", "model_in_any": "blob.p.x",
            "dataclass_in_any": "notes.b[0].w", "point": "point.x", "box": "box.w", "series": "series[1]"}[where]
    assert f"{path} is " in str(raised.value)
    state = await checkpointer.aget_state({"thread_id": tid})
    assert [(m.role, m.text()) for m in state.context] == [("user", "go")]
    assert state.model_dump(exclude={"context", "execution_meta"}) == cls().model_dump(
        exclude={"context", "execution_meta"})


class ExcludedFloatState(AgentState):
    """A field no dump writes may hold anything: a NaN there is not refused."""
    scratch: float = pydantic.Field(default=0.0, exclude=True)
    kept: dict[str, Any] = {}


async def test_nan_in_a_field_declared_exclude_is_not_refused(checkpointer, make_thread) -> None:
    async def model(state: ExcludedFloatState) -> Message:
        state.scratch = float("nan")
        state.kept = {"ok": 1.5}
        return Message.text_message("x", role="assistant")

    app = one_node_graph(checkpointer, model, ExcludedFloatState)
    tid = make_thread("nanexcl")
    await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})
    assert state.kept == {"ok": 1.5} and state.scratch == 0.0
    assert [m.role for m in state.context] == ["user", "assistant"]


async def test_a_one_pass_state_stores_what_the_node_set(checkpointer, make_thread) -> None:
    """The one-pass dump (non-ASCII text, nested Any values, the 64-bit edges) loads back equal.
    (It held 10**20 here, which came back the float 1e20, equal to it in Python: an int past 64
    bits in a state is refused now, test_state_json_limits.py.)"""

    async def model(state: AnyState) -> Message:
        state.notes = {"é": "ü \u2028", "n": [1, 2.5, 2**64 - 1, -(2**63), None, True]}
        state.blob = {"k": {"deep": ["x", -0.0, 1e-300]}}
        return Message.text_message("x", role="assistant")

    app = one_node_graph(checkpointer, model, AnyState)
    tid = make_thread("onepass")
    await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})
    assert isinstance(state, AnyState)
    assert state.notes == {"é": "ü \u2028", "n": [1, 2.5, 2**64 - 1, -(2**63), None, True]}
    assert [type(v) for v in state.notes["n"][2:4]] == [int, int]
    assert state.blob == {"k": {"deep": ["x", -0.0, 1e-300]}}


# -- invalid config values ------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1, "x", True, 2.5, None], ids=["0", "-1", "str", "True", "float", "None"])
async def test_invalid_recursion_limit_raises_before_any_write(checkpointer, make_thread, limit) -> None:
    app = echo_graph(checkpointer)
    tid = make_thread("reclimit")
    with pytest.raises(ValueError, match="recursion_limit must be a positive int") as refused:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid, "recursion_limit": limit})
    assert getattr(refused.value, "error_code", None) == "STORAGE_CONFIG_003"
    assert await snapshot(checkpointer, tid) is None


async def test_invalid_recursion_limit_leaves_existing_thread_unchanged(checkpointer, make_thread) -> None:
    tid = make_thread("reclimit2")
    app, before = await seeded(checkpointer, tid)
    with pytest.raises(ValueError):
        await app.ainvoke({"messages": [Message.text_message("more")]}, {"thread_id": tid, "recursion_limit": 0})
    assert await snapshot(checkpointer, tid) == before


@pytest.mark.parametrize("value", ["abc", [1], float("nan"), True], ids=["str", "list", "nan", "bool"])
async def test_invalid_node_timeout_warns_and_uses_default(checkpointer, make_thread, caplog, value) -> None:
    app = echo_graph(checkpointer)
    tid = make_thread("nodetimeout")
    with caplog.at_level(logging.WARNING):
        result = await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid, "node_timeout": value})
    assert result["messages"][-1].text() == "ok"
    assert any("invalid node_timeout" in r.getMessage() and "default of 900" in r.getMessage() for r in caplog.records)
    snap = await snapshot(checkpointer, tid)
    assert [r[1:] for r in snap[1]] == [("user", "hi"), ("assistant", "ok")]


@pytest.mark.parametrize("value", [-5, 0, "-5", None], ids=["-5", "0", "str-5", "None"])
async def test_non_positive_tool_timeout_disables_the_deadline(checkpointer, make_thread, caplog, value) -> None:
    async def slow(x: str) -> str:
        """Sleeps a little."""
        await asyncio.sleep(0.2)
        return "slow done"

    tid = make_thread("tooltimeout")
    app = tool_graph(AgentState, [slow], [[call("c1", "slow", {"x": "1"})]], checkpointer=checkpointer)
    with caplog.at_level(logging.WARNING):
        result = await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid, "tool_timeout": value})
    assert tool_texts(result["messages"]) == {"c1": "slow done"}
    assert not any("invalid tool_timeout" in r.getMessage() for r in caplog.records)
    await assert_clean_completion(checkpointer, tid, result["messages"])


async def test_thread_id_int_is_stored_as_its_string(checkpointer) -> None:
    tid = 10_000_000 + uuid.uuid4().int % 1_000_000
    app = echo_graph(checkpointer)
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid})
    by_int = await snapshot(checkpointer, tid)
    by_str = await snapshot(checkpointer, str(tid))
    assert by_int is not None and by_int == by_str
    assert [r[1:] for r in by_int[1]] == [("user", "hi"), ("assistant", "ok")]


@pytest.mark.parametrize("tid", ["", None], ids=["empty", "None"])
async def test_empty_thread_id_runs_on_a_generated_thread(checkpointer, caplog, tid) -> None:
    """ainvoke with thread_id "" (or None) warns and runs on a fresh uuid thread; reads and
    checkpointer writes with an empty thread_id raise ValueError and write nothing."""
    app = echo_graph(checkpointer)
    with caplog.at_level(logging.WARNING):
        result = await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid})
    assert result["messages"][-1].text() == "ok"
    warned = [r.getMessage() for r in caplog.records if "no thread_id in config: generated" in r.getMessage()]
    assert len(warned) == 1
    generated = warned[0].split("generated ")[1].split(";")[0]
    assert str(uuid.UUID(generated)) == generated
    assert (await snapshot(checkpointer, generated)) is not None
    with pytest.raises(ValueError, match="thread_id"):
        await checkpointer.aget_state({"thread_id": tid})
    with pytest.raises(ValueError, match="thread_id"):
        await checkpointer.aput_state({"thread_id": tid}, AgentState())


async def test_thread_id_zero_is_a_thread_id(checkpointer, caplog) -> None:
    """``thread_id=0`` is the caller's thread ``"0"``, as on 10xGraph (checked on the oracle: its
    rule is a missing key). Only a missing, None or "" id gets a generated thread."""
    app = echo_graph(checkpointer)
    with caplog.at_level(logging.WARNING):
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": 0})
    assert not any("no thread_id in config: generated" in r.getMessage() for r in caplog.records)
    snap = await snapshot(checkpointer, 0)
    assert snap is not None and [r[1:] for r in snap[1]] == [("user", "hi"), ("assistant", "ok")]


# -- unknown and foreign threads ------------------------------------------------------------


async def test_unknown_thread_reads_are_empty(checkpointer, make_thread) -> None:
    cfg = {"thread_id": make_thread("never")}
    assert await checkpointer.aget_state(cfg) is None
    assert "_checkpoint_version" not in cfg
    assert await checkpointer.aget_thread(cfg) is None
    assert await checkpointer.alist_messages(cfg) == []
    assert await checkpointer.aget_tool_result(cfg, "m:c") is None
    assert await checkpointer.aget_thread_owner(cfg["thread_id"]) is None
    # reads created nothing
    assert await checkpointer.aget_state(cfg) is None


@pytest.fixture(params=["memory", "sqlite", "postgres", "postgres+redis"])
def isolated(request, tmp_path: Path):
    return make_checkpointer(request.param, request, tmp_path, enforce_user_isolation=True)


async def test_foreign_thread_write_forbidden_read_invisible(isolated, make_thread) -> None:
    tid = make_thread("owned")
    app, before = await seeded(isolated, tid, "alice")
    # bob's run on alice's thread
    with pytest.raises(StorageError) as exc:
        await app.ainvoke({"messages": [Message.text_message("mine now")]}, {"thread_id": tid, "user_id": "bob"})
    assert exc.value.error_code == "STORAGE_FORBIDDEN_001"
    # bob's direct checkpointer write
    with pytest.raises(StorageError) as exc2:
        await isolated.aput_state({"thread_id": tid, "user_id": "bob"}, AgentState())
    assert exc2.value.error_code == "STORAGE_FORBIDDEN_001"
    # bob sees nothing
    assert await snapshot(isolated, tid, "bob") is None
    assert await isolated.alist_messages({"thread_id": tid, "user_id": "bob"}) == []
    # alice's thread is unchanged
    assert await snapshot(isolated, tid, "alice") == before
    assert await isolated.aget_thread_owner(tid, {"user_id": "alice"}) == "alice"
    assert await isolated.aget_thread_owner(tid, {"user_id": "bob"}) is None


# -- SQL metacharacters and Unicode in ids ---------------------------------------------------


@pytest.mark.parametrize("ident", [SQL_ID, UNICODE_ID, "a\\b%_*?'\"`$1;"], ids=["sql", "unicode", "meta"])
async def test_metacharacters_in_thread_and_user_ids(checkpointer, make_thread, ident) -> None:
    tid = ident + make_thread("")
    app, snap = await seeded(checkpointer, tid, ident)
    assert await checkpointer.aget_thread_owner(tid) == ident
    # a second run on the same thread/user appends normally
    await app.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": tid, "user_id": ident})
    after = await snapshot(checkpointer, tid, ident)
    assert after[0] > snap[0]
    assert [r[1:] for r in after[1]][-2:] == [("user", "again"), ("assistant", "ok")]
    # nothing was dropped: another thread still works
    other = make_thread("other")
    await seeded(checkpointer, other)


@pytest.mark.parametrize("name", [SQL_ID, UNICODE_ID], ids=["sql", "unicode"])
async def test_metacharacters_in_tool_names(checkpointer, make_thread, name) -> None:
    @tool(name=name, description="weird name")
    async def weird(x: str) -> str:
        return f"weird {x}"

    tid = make_thread("toolname")
    msgs, out = await run_tools(checkpointer, tid, [weird], [call("c1", name, {"x": "1"})])
    assert out["c1"] == "weird 1"
    await assert_clean_completion(checkpointer, tid, msgs)


async def test_unknown_tool_name_with_metacharacters_is_a_tool_error(checkpointer, make_thread) -> None:
    tid = make_thread("notool")
    msgs, out = await run_tools(checkpointer, tid, [echo], [call("c1", SQL_ID, {"x": "1"})])
    assert out["c1"] == f"Tool '{SQL_ID}' not found."
    await assert_clean_completion(checkpointer, tid, msgs)


async def test_300_char_thread_id(checkpointer, make_thread) -> None:
    tid = make_thread("long") + "x" * 300
    assert len(tid) > 300
    app = echo_graph(checkpointer)
    # Every backend refuses it before any SQL (threads.thread_id is VARCHAR(255) on Postgres,
    # and a thread that worked on SQLite or memory would fail there): nothing is written.
    with pytest.raises(InvalidConfigError) as err:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid})
    assert err.value.error_code == "STORAGE_CONFIG_002"
    assert err.value.context["field"] == "thread_id"
    assert "at most 255 characters" in str(err.value)
    assert await checkpointer.alist_threads({}) == []
    # the store still works for a normal thread
    await seeded(checkpointer, make_thread("after-long"))


@pytest.mark.parametrize("run_id, reason", [("run\x00x", "NUL"), ("run\ud800x", "lone surrogate")])
async def test_a_run_id_no_store_can_keep_is_refused_before_anything(checkpointer, make_thread, run_id,
                                                                      reason) -> None:
    # The run id is the lease's holder: PostgreSQL refused a NUL at the input commit with a
    # generic STORAGE_001 while memory and SQLite kept it, and a lone surrogate became U+FFFD
    # (two such run ids named one holder). Every backend now refuses both first.
    tid = make_thread("runid")
    app, before = await seeded(checkpointer, tid)
    with pytest.raises(InvalidConfigError) as err:
        await app.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": tid, "run_id": run_id})
    assert err.value.error_code == "STORAGE_CONFIG_002"
    assert err.value.context["field"] == "run_id"
    assert reason in str(err.value)
    assert await snapshot(checkpointer, tid) == before
    # a long run id is no id column's value: it is kept as given (the holder is TEXT everywhere)
    result = await app.ainvoke({"messages": [Message.text_message("long")]}, {"thread_id": tid, "run_id": "r" * 400})
    assert [m.text() for m in result["messages"]] == ["long", "ok"]


# -- NUL bytes -------------------------------------------------------------------------------


def _is_pg(cp: BaseCheckpointer) -> bool:
    return isinstance(cp, PgCheckpointer)


async def test_nul_byte_in_message_text(checkpointer, make_thread) -> None:
    tid = make_thread("nul")
    app = echo_graph(checkpointer, reply="re\x00ply")
    result = await app.ainvoke({"messages": [Message.text_message("a\x00b")]}, {"thread_id": tid})
    assert [m.text() for m in result["messages"]] == ["a\x00b", "re\x00ply"]  # the live run is intact
    snap = await snapshot(checkpointer, tid)
    texts = [r[2] for r in snap[1]]
    if _is_pg(checkpointer):
        # Postgres rejects U+0000 in jsonb: the store replaces it with U+FFFD (silently, see
        # test_nul_replacement_is_reported)
        assert texts == ["a\ufffdb", "re\ufffdply"]
    else:
        assert texts == ["a\x00b", "re\x00ply"]


async def test_nul_byte_in_tool_output(checkpointer, make_thread) -> None:
    async def nul_tool(x: str) -> str:
        """Returns a NUL."""
        return "out\x00put"

    tid = make_thread("nultool")
    msgs, out = await run_tools(checkpointer, tid, [nul_tool], [call("c1", "nul_tool", {"x": "1"})])
    assert out["c1"] == "out\x00put"  # the live run (and the model's next turn) sees it intact
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    snap = await snapshot(checkpointer, tid)
    stored = [r[1:] for r in snap[1]]
    expected = "out\ufffdput" if _is_pg(checkpointer) else "out\x00put"
    assert stored == [("user", "go"), ("assistant", "calling tools (turn 1)"), ("tool", expected), ("assistant", "done")]


async def test_nul_replacement_is_reported(tenx_postgres, make_thread, caplog) -> None:
    cp = PgCheckpointer(tenx_postgres.dsn, schema=f"t_{uuid.uuid4().hex[:16]}", enforce_user_isolation=False)
    app = echo_graph(cp)
    with caplog.at_level(logging.DEBUG):
        await app.ainvoke({"messages": [Message.text_message("a\x00b")]}, {"thread_id": make_thread("nulrep")})
    assert any("\\x00" in r.getMessage() or "NUL" in r.getMessage() or "U+0000" in r.getMessage() for r in caplog.records)
    from tenxgraph import metrics

    assert metrics.snapshot()["tenxgraph.storage.nul_replaced"] >= 1


async def test_nul_byte_in_state_field(checkpointer, make_thread) -> None:
    class SState(AgentState):
        note: str = ""

    g = StateGraph(SState)

    async def model(state: SState) -> Message:
        return Message.text_message("ok", role="assistant")

    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread("nulstate")
    try:
        await app.ainvoke({"messages": [Message.text_message("go")], "state": {"note": "n\x00te"}}, {"thread_id": tid})
    except Exception as exc:
        err: Exception | None = exc
    else:
        err = None
    state = await checkpointer.aget_state({"thread_id": tid})
    assert err is None
    assert [m.text() for m in state.context] == ["go", "ok"]
    assert state.note == ("n\ufffdte" if _is_pg(checkpointer) else "n\x00te")


# -- oversized message ---------------------------------------------------------------------


async def test_oversized_message_10mb_round_trip(checkpointer, make_thread) -> None:
    tid = make_thread("big")
    big = ("0123456789abcdef" * 655_360)[:10_000_000]
    app = echo_graph(checkpointer)
    await app.ainvoke({"messages": [Message.text_message(big)]}, {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})
    assert [m.role for m in state.context] == ["user", "assistant"]
    assert state.context[0].text() == big


# -- PgCheckpointer schema name ------------------------------------------------------------


@pytest.mark.parametrize("schema", ['bad"; DROP SCHEMA public; --', "", "1abc", "a" * 100], ids=["sql", "empty", "digit", "long"])
async def test_invalid_pg_schema_name(tenx_postgres, schema) -> None:
    """Pinned: a plain ValueError at construction (validated before connecting); no schema created."""
    with pytest.raises(ValueError, match="invalid schema name"):
        PgCheckpointer(tenx_postgres.dsn, schema=schema)
    # public is untouched and usable
    cp = PgCheckpointer(tenx_postgres.dsn, schema=f"t_{uuid.uuid4().hex[:16]}", enforce_user_isolation=False)
    assert await cp.aget_state({"thread_id": "x"}) is None


# -- bad run inputs -----------------------------------------------------------------------


@pytest.mark.parametrize("data", ["hi", ["hi"], None, 42], ids=["str", "list", "None", "int"])
async def test_non_dict_input_data(checkpointer, make_thread, data) -> None:
    tid = make_thread("nondict")
    app, before = await seeded(checkpointer, tid)
    with pytest.raises(TypeError, match="input_data must be a dict"):
        await app.ainvoke(data, {"thread_id": tid})
    assert await snapshot(checkpointer, tid) == before


@pytest.mark.parametrize(
    ("messages", "exc_type", "match"),
    [
        ("hi", ValueError, "must be a list of Message"),
        (["hi"], ValueError, "items must be Message objects, got str"),
        ([42], ValueError, "items must be Message objects, got int"),
        ([Message.text_message("ok"), None], ValueError, "items must be Message objects, got NoneType"),
        ([{"role": "nobody", "content": 5}], pydantic.ValidationError, "validation error"),
    ],
    ids=["str", "list-of-str", "list-of-int", "one-None", "bad-dict"],
)
async def test_messages_that_are_not_messages(checkpointer, make_thread, messages, exc_type, match) -> None:
    tid = make_thread("notmsg")
    app, before = await seeded(checkpointer, tid)
    with pytest.raises(exc_type, match=match):
        await app.ainvoke({"messages": messages}, {"thread_id": tid})
    assert await snapshot(checkpointer, tid) == before


async def test_node_returning_a_dict(checkpointer, make_thread) -> None:
    async def model(state: AgentState) -> Any:
        return {"not": "a message"}

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread("dictnode")
    _, before = await seeded(checkpointer, tid)
    with pytest.raises(NodeError) as exc:
        await app.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": tid})
    assert exc.value.error_code == "NODE_001"
    assert "a plain dict is not supported" in str(exc.value)
    # the run's input is committed before the node (by design); the failed node wrote nothing
    after = await snapshot(checkpointer, tid)
    assert after[0] > before[0]
    assert after[1][:2] == before[1]
    assert [r[1:] for r in after[1][2:]] == [("user", "again")]


async def test_condition_returning_unknown_node(checkpointer, make_thread) -> None:
    async def model(state: AgentState) -> Message:
        return Message.text_message("routed", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "no_such_node")
    app = g.compile(checkpointer=checkpointer)
    tid = make_thread("route")
    _, before = await seeded(checkpointer, tid)
    with pytest.raises(GraphError) as exc:
        await app.ainvoke({"messages": [Message.text_message("again")]}, {"thread_id": tid})
    assert exc.value.error_code == "GRAPH_ROUTING_002"
    assert "no_such_node" in str(exc.value)
    # the model's step is complete and committed; routing fails after it, nothing half-written
    after = await snapshot(checkpointer, tid)
    assert after[0] > before[0]
    assert after[1][:2] == before[1]
    assert [r[1:] for r in after[1][2:]] == [("user", "again"), ("assistant", "routed")]


def _poison(m: Message, where: str, value: float) -> Message:
    """``value`` put in one place of ``m``: an ``Any``-typed dict, or a field typed ``float``
    (pydantic-core writes the two through different serializers)."""
    if where == "metadata":
        m.metadata = {"score": value, "nested": [{"deep": value}]}
    elif where == "model_in_metadata":
        m.metadata = {"point": Point(x=value)}
    elif where == "timestamp":
        m.timestamp = value
    else:
        m.content.append(ImageBlock(media=MediaRef(url="https://example.com/a.png"), bbox=[0.0, value]))
    return m


@pytest.mark.parametrize("where", ["metadata", "model_in_metadata", "timestamp", "bbox"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
async def test_nan_inf_in_a_node_s_message_fails_the_step_not_stored_as_null(checkpointer, make_thread, value,
                                                                            where) -> None:
    """pydantic's JSON dump writes NaN as null: before, such a message was stored changed (its
    metadata's float, its timestamp, read back None) while the caller got NaN. Now the step is
    refused as a state holding NaN is: the input stays, the node's message is not stored."""

    async def model(state: AgentState) -> Message:
        return _poison(Message.text_message("x", role="assistant"), where, value)

    app = one_node_graph(checkpointer, model)
    tid = make_thread("nanmsg")
    with pytest.raises(ValueError, match="not valid JSON"):
        await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})
    assert [(m.role, m.text()) for m in state.context] == [("user", "go")]


class ScoredMessage(Message):
    """A user's message class with float containers of its own."""
    scores: list[float] = []
    table: dict[str, tuple[float, ...]] = {}


@pytest.mark.parametrize("field", ["scores", "table"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
async def test_nan_inf_in_a_message_subclass_s_float_containers_fails_the_step(checkpointer, make_thread, value,
                                                                              field) -> None:
    """A message's own fields are written by its class's serializer, which turns NaN into null
    inside a typed container as well: refused like the rest, not stored changed."""

    async def model(state: AgentState) -> Message:
        extra = {"scores": [1.0, value]} if field == "scores" else {"table": {"a": (0.5, value)}}
        return ScoredMessage(role="assistant", content="x", **extra)

    app = one_node_graph(checkpointer, model)
    tid = make_thread("nansub")
    with pytest.raises(ValueError, match="not valid JSON"):
        await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": tid})
    state = await checkpointer.aget_state({"thread_id": tid})
    assert [(m.role, m.text()) for m in state.context] == [("user", "go")]


@pytest.mark.parametrize("where", ["metadata", "model_in_metadata", "timestamp", "bbox"])
@pytest.mark.parametrize("value", [float("nan"), float("-inf")], ids=["nan", "-inf"])
async def test_nan_inf_in_aput_messages_is_refused_not_stored_as_null(checkpointer, make_thread, value, where) -> None:
    tid = make_thread("nanput")
    await echo_graph(checkpointer).ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": tid})
    before = [m.model_dump() for m in (await checkpointer.aget_state({"thread_id": tid})).context]
    bad = _poison(Message.text_message("note", role="assistant"), where, value)
    with pytest.raises(ValueError, match="not valid JSON"):
        await checkpointer.aput_messages({"thread_id": tid}, [Message.text_message("ok", role="assistant"), bad])
    after = [m.model_dump() for m in (await checkpointer.aget_state({"thread_id": tid})).context]
    assert after == before


async def test_a_message_s_own_json_dump_keeps_pydantic_s_null_for_nan() -> None:
    m = Message.text_message("x", role="assistant")
    m.metadata = {"score": float("nan")}
    assert '"score":null' in m.model_dump_json()


class BlobState(AgentState):
    blob: Any = None


async def test_an_input_state_nested_past_the_recursion_limit_is_a_value_error(checkpointer, make_thread) -> None:
    """5,000 levels deep (150 already gives "state is not valid JSON"): was a bare RecursionError
    from the copy of the caller's value; now the ValueError of every refused input, naming the
    key, with nothing stored, and the thread takes its next turn."""
    def reply(state: BlobState) -> Message:
        return Message.text_message("ok", role="assistant")

    g = StateGraph(BlobState)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread("deep-state")}
    deep: Any = 1
    for _ in range(5000):
        deep = {"k": deep}
    with pytest.raises(ValueError, match="'blob' is nested too deep"):
        await app.ainvoke({"messages": [Message.text_message("x")], "state": {"blob": deep}}, cfg)
    stored = await checkpointer.aget_state(cfg)
    assert stored is None or [m.text() for m in stored.context] == []
    out = await app.ainvoke({"messages": [Message.text_message("y")]}, cfg)
    assert [m.text() for m in out["messages"]] == ["y", "ok"]


@pytest.mark.parametrize("ids", [{"run_id": 1}, {"run_id": 1.5}, {"thread_id_suffix": 7}], ids=["int_run", "float_run",
                                                                                                 "int_thread"])
async def test_ids_ainvoke_takes_stream_too(checkpointer, make_thread, ids) -> None:
    # ainvoke str()s them; astream built its chunks from the raw values and every chunk failed
    # StreamChunk's validation (a raw ValidationError). (A float thread id, accepted here until
    # session 31, is refused since: test_id_types.py.)
    app = echo_graph(checkpointer)
    cfg: dict[str, Any] = {"thread_id": make_thread("streamids"), "run_id": ids.get("run_id", "r1")}
    if "thread_id_suffix" in ids:
        cfg["thread_id"] = abs(hash(cfg["thread_id"])) % 10**9 * 10 + ids["thread_id_suffix"]
    chunks = [c async for c in app.astream({"messages": [Message.text_message("hi")]}, cfg)]
    assert chunks
    assert {c.run_id for c in chunks} == {str(cfg["run_id"])}
    assert {str(c.thread_id) for c in chunks} == {str(cfg["thread_id"])}
    state = await checkpointer.aget_state({"thread_id": str(cfg["thread_id"])})
    assert [m.text() for m in state.context] == ["hi", "ok"]


@pytest.mark.parametrize("call", [
    lambda cp, tid: cp.alist_threads({}, search="a\ud800"),
    lambda cp, tid: cp.alist_messages({"thread_id": tid}, search="a\ud800"),
    lambda cp, tid: cp.alist_threads({}, limit=2**63),
    lambda cp, tid: cp.alist_threads({}, offset=10**30),
    lambda cp, tid: cp.alist_messages({"thread_id": tid}, limit=2**63),
], ids=["threads_search_surrogate", "messages_search_surrogate", "threads_limit_2_63", "threads_offset_huge",
        "messages_limit_2_63"])
async def test_list_arguments_the_core_cannot_take_are_value_errors(checkpointer, make_thread, call) -> None:
    # A lone surrogate in the search text was a raw UnicodeEncodeError and a page bound past
    # 2**63 - 1 a raw OverflowError; a NUL or a negative bound was already a ValueError.
    _, _ = await seeded(checkpointer, tid := make_thread("lists"))
    with pytest.raises(ValueError) as err:
        await call(checkpointer, tid)
    assert type(err.value) is ValueError
    assert len(await checkpointer.alist_threads({}, limit=2**63 - 1)) >= 1  # the largest bound is taken


async def test_a_thread_owner_asked_with_an_id_no_store_can_hold_is_refused(checkpointer) -> None:
    with pytest.raises(InvalidConfigError) as err:
        await checkpointer.aget_thread_owner("a\ud800")
    assert err.value.error_code == "STORAGE_CONFIG_002"


@pytest.mark.parametrize("config, error", [
    ([1], InvalidConfigError), ("seed", InvalidConfigError), (42, InvalidConfigError),
    ({"user_id": "a\ud800"}, InvalidConfigError), ({"user_id": "a\x00b"}, InvalidConfigError),
    ({"user_id": "u" * 300}, InvalidConfigError),
], ids=["list", "str", "int", "surrogate_user", "nul_user", "long_user"])
async def test_alist_threads_refuses_a_config_no_backend_can_take(checkpointer, make_thread, config, error) -> None:
    # Refused on PostgreSQL (isolated by default); memory and SQLite listed every thread.
    await seeded(checkpointer, make_thread("listcfg"))
    with pytest.raises(error):
        await checkpointer.alist_threads(config)


async def test_an_input_state_dict_whose_keys_json_writes_as_one_is_refused(checkpointer, make_thread) -> None:
    # {1: "a", "1": "b"} ran with both keys and was stored as {"1": "b"}: a value lost without
    # a word (tool results were already kept as text for this reason).
    app = one_node_graph(checkpointer, lambda state: Message.text_message("x", role="assistant"), Typed)
    tid = make_thread("keyfold")
    with pytest.raises(ValueError, match="key 'raw' cannot be stored: it holds two keys that JSON writes as one"):
        await app.ainvoke({"messages": [Message.text_message("go")], "state": {"raw": {"x": {1: "a", "1": "b"}}}},
                          {"thread_id": tid})
    assert await snapshot(checkpointer, tid) is None
    await app.ainvoke({"messages": [Message.text_message("go")], "state": {"raw": {1: "a", 2: "b"}}}, {"thread_id": tid})
    assert (await checkpointer.aget_state({"thread_id": tid})).raw == {"1": "a", "2": "b"}  # distinct keys: kept


async def test_an_input_state_value_copy_refuses_is_a_value_error_naming_the_key(checkpointer, make_thread) -> None:
    # A generator was consumed by the storability check and then failed the copy with a raw
    # TypeError ("cannot pickle 'generator' object"), naming nothing.
    app = one_node_graph(checkpointer, lambda state: Message.text_message("x", role="assistant"), Typed)
    tid = make_thread("nocopy")
    items = (i for i in range(3))
    with pytest.raises(ValueError, match="input 'state' key 'raw' cannot be copied") as err:
        await app.ainvoke({"messages": [Message.text_message("go")], "state": {"raw": items}}, {"thread_id": tid})
    assert type(err.value) is ValueError
    assert list(items) == [0, 1, 2]  # not consumed
    assert await snapshot(checkpointer, tid) is None
