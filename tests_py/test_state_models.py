"""AgentState, ExecutionState, Message and blocks, ToolResult, StreamChunk, and the
pydantic-free utils models (Command, ThreadInfo, @tool, constants)."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import tenxgraph
from tenxgraph.core.state import (
    AgentState,
    AnnotationBlock,
    AnnotationRef,
    AudioBlock,
    DataBlock,
    DocumentBlock,
    ErrorBlock,
    ExecutionState,
    ExecutionStatus,
    ImageBlock,
    MediaRef,
    Message,
    ReasoningBlock,
    RemoteToolCallBlock,
    StopRequestStatus,
    StreamChunk,
    StreamEvent,
    TextBlock,
    TokenUsages,
    ToolCallBlock,
    ToolResult,
    ToolResultBlock,
    VideoBlock,
)
from tenxgraph.core.state import message as message_module
from tenxgraph.utils import (
    DEFAULT_ANONYMOUS_USER_ID,
    DEFAULT_NODE_TIMEOUT_SECONDS,
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    END,
    RESUME_KEY,
    START,
    Command,
    ResponseGranularity,
    ThreadInfo,
    get_tool_metadata,
    has_tool_decorator,
    tool,
)
from tenxgraph.utils import ExecutionState as RunState

# The tenxgraph this suite imports (the source tree in a development install, site-packages for
# an installed wheel), so the child tests the same package and its built core.
PYTHON_DIR = Path(tenxgraph.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_id_generator() -> Iterator[None]:
    message_module.set_id_generator(None)
    yield
    message_module.set_id_generator(None)


class NoteState(AgentState):
    note: str = ""
    counter: int = 0
    tags: list[str] = []
    data: dict[str, Any] = {}


OPENAI_CALLS = [
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    },
    {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
]

MEDIA = MediaRef(kind="data", data_base64="aGk=", mime_type="image/png", width=4, height=2)

EVERY_BLOCK = [
    TextBlock(text="hello", annotations=[AnnotationRef(url="https://x.test", title="x")]),
    ImageBlock(media=MEDIA, alt_text="dot", bbox=[0.0, 0.5, 1.0, 1.0]),
    AudioBlock(media=MediaRef(url="https://a.test/a.mp3"), transcript="hi", sample_rate=16000),
    VideoBlock(media=MediaRef(file_id="f1"), thumbnail=MEDIA),
    DocumentBlock(media=MediaRef(url="https://d.test/d.pdf", page=2), pages=[1, 2], excerpt="e"),
    DataBlock(mime_type="application/json", data_base64="e30="),
    ToolCallBlock(id="call_1", name="get_weather", args={"city": "Paris"}, tool_type="function"),
    RemoteToolCallBlock(id="call_9", name="browser_click", args={"x": 1}),
    ToolResultBlock(call_id="call_1", output={"temp": 21, "unit": "C"}, status="completed"),
    ToolResultBlock(call_id="call_2", output="failed hard", is_error=True, status="failed"),
    ReasoningBlock(summary="thought", details=["step 1", "step 2"]),
    ReasoningBlock(thinking="raw thoughts", signature="sig=="),
    AnnotationBlock(kind="note", refs=[AnnotationRef(file_id="f", page=3)], spans=[(0, 5)]),
    ErrorBlock(message="oops", code="E1", data={"retry": False}),
]


def full_message(**overrides: Any) -> Message:
    fields: dict[str, Any] = {
        "role": "assistant",
        "content": list(EVERY_BLOCK),
        "tools_calls": copy.deepcopy(OPENAI_CALLS),
        "reasoning": "because",
        "metadata": {"tool_call_id": "call_1", "nested": {"a": [1, 2]}},
        "usages": TokenUsages(completion_tokens=3, prompt_tokens=5, total_tokens=8),
        "raw": {"provider": "x"},
        "parsed_content": {"answer": 42},
    }
    fields.update(overrides)
    return Message(**fields)


# AgentState -------------------------------------------------------------------


def test_agent_state_defaults_are_fresh_per_instance() -> None:
    a, b = AgentState(), AgentState()
    assert a.context == [] and a.context_summary is None
    assert a.execution_meta.current_node == START == "__start__"
    assert a.execution_meta.status is ExecutionStatus.RUNNING
    a.context.append(Message.text_message("x"))
    a.execution_meta.advance_step()
    assert b.context == [] and b.execution_meta.step == 0
    assert a.execution_meta is not b.execution_meta


def test_agent_state_is_mutable_and_unvalidated_on_assignment() -> None:
    config = AgentState.model_config
    assert not config.get("frozen") and not config.get("validate_assignment")
    state = NoteState(note="n")
    state.note = "changed"
    state.counter += 2
    state.context.append(Message.text_message("hi"))
    state.context_summary = "summary"
    assert (state.note, state.counter, len(state.context)) == ("changed", 2, 1)


def test_subclass_extra_fields_and_defaults() -> None:
    state = NoteState(tags=["a"], context=[Message.text_message("q")])
    assert state.note == "" and state.tags == ["a"]
    assert isinstance(state, AgentState)
    assert set(NoteState.model_fields) >= {"context", "context_summary", "execution_meta", "note"}
    assert NoteState().tags == [] and NoteState().tags is not NoteState().tags


def test_deep_copy_is_independent() -> None:
    state = NoteState(note="a", tags=["t"], data={"k": [1]}, context=[Message.text_message("q")])
    for clone in (state.model_copy(deep=True), copy.deepcopy(state)):
        assert clone == state
        clone.tags.append("u")
        clone.data["k"].append(2)
        clone.context.append(Message.text_message("more"))
        clone.execution_meta.error("bad")
        assert state.tags == ["t"] and state.data == {"k": [1]}
        assert len(state.context) == 1
        assert state.execution_meta.status is ExecutionStatus.RUNNING
        assert "error" not in state.execution_meta.internal_data


def test_agent_state_json_round_trip() -> None:
    state = NoteState(
        note="n",
        counter=3,
        context=[Message.text_message("hi"), full_message()],
        context_summary="sum",
    )
    state.set_interrupt("tools", "interrupt", ExecutionStatus.INTERRUPTED_AFTER, {"k": "v"})
    state.execution_meta.internal_data["interrupt_resume"] = {"node:tools:0": "yes"}
    dumped = state.model_dump(mode="json")
    json.dumps(dumped)  # must be plain JSON
    restored = NoteState.model_validate(dumped)
    assert restored == state
    assert NoteState.model_validate_json(state.model_dump_json()) == state
    assert isinstance(restored.context[1].content[6], ToolCallBlock)


def test_agent_state_delegates_to_execution_meta() -> None:
    state = AgentState()
    assert state.is_running() and not state.is_interrupted()
    state.set_current_node("agent")
    state.advance_step()
    state.advance_step()
    assert state.execution_meta.current_node == "agent" and state.execution_meta.step == 2
    state.set_interrupt("agent", "why", "interrupted_before", {"d": 1})
    assert state.is_interrupted() and not state.is_running()
    assert state.execution_meta.interrupt_data == {"d": 1}
    state.clear_interrupt()
    assert state.is_running() and state.execution_meta.interrupted_node is None
    state.execution_meta.stop_current_execution = StopRequestStatus.STOP_REQUESTED
    assert state.is_stopped_requested()
    state.complete()
    assert state.execution_meta.status is ExecutionStatus.COMPLETED
    state.error("kaput")
    assert state.execution_meta.status is ExecutionStatus.ERROR
    assert state.execution_meta.internal_data["error"] == "kaput"


# ExecutionState ----------------------------------------------------------------


def test_enum_values() -> None:
    assert [s.value for s in ExecutionStatus] == [
        "running",
        "interrupted_before",
        "interrupted_after",
        "completed",
        "error",
    ]
    assert [s.value for s in StopRequestStatus] == ["none", "stop_requested", "stopped"]
    assert ExecutionStatus.RUNNING == "running" and str(StopRequestStatus.STOPPED) == "stopped"


def test_execution_state_defaults_and_required_node() -> None:
    es = ExecutionState(current_node="a")
    assert (es.step, es.status, es.stop_current_execution) == (
        0,
        ExecutionStatus.RUNNING,
        StopRequestStatus.NONE,
    )
    assert es.interrupted_node is es.interrupt_reason is es.interrupt_data is es.thread_id is None
    assert es.internal_data == {}
    with pytest.raises(ValidationError):
        ExecutionState()  # type: ignore[call-arg]


def test_set_and_clear_interrupt() -> None:
    es = ExecutionState(current_node="a")
    es.set_interrupt("a", "interrupt_before: a", ExecutionStatus.INTERRUPTED_BEFORE)
    assert (es.interrupted_node, es.interrupt_reason, es.interrupt_data) == (
        "a",
        "interrupt_before: a",
        None,
    )
    assert es.is_interrupted() and not es.is_running()
    es.set_interrupt("b", "interrupt_after: b", "interrupted_after", {"x": 1})
    assert es.status is ExecutionStatus.INTERRUPTED_AFTER and es.is_interrupted()
    es.clear_interrupt()
    assert es.status is ExecutionStatus.RUNNING
    assert es.interrupted_node is es.interrupt_reason is es.interrupt_data is None
    with pytest.raises(ValueError):
        es.set_interrupt("a", "r", "sleeping")


@pytest.mark.parametrize(
    ("status", "running", "interrupted"),
    [
        (ExecutionStatus.RUNNING, True, False),
        (ExecutionStatus.INTERRUPTED_BEFORE, False, True),
        (ExecutionStatus.INTERRUPTED_AFTER, False, True),
        (ExecutionStatus.COMPLETED, False, False),
        (ExecutionStatus.ERROR, False, False),
    ],
)
def test_status_predicates(status: ExecutionStatus, running: bool, interrupted: bool) -> None:
    es = ExecutionState(current_node="n", status=status)
    assert es.is_running() is running
    assert es.is_interrupted() is interrupted


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (StopRequestStatus.NONE, False),
        (StopRequestStatus.STOP_REQUESTED, True),
        (StopRequestStatus.STOPPED, False),
    ],
)
def test_is_stopped_requested(stop: StopRequestStatus, expected: bool) -> None:
    es = ExecutionState(current_node="n", stop_current_execution=stop)
    assert es.is_stopped_requested() is expected


def test_step_node_complete_error() -> None:
    es = ExecutionState(current_node="a")
    es.advance_step()
    es.set_current_node("b")
    assert (es.step, es.current_node) == (1, "b")
    es.complete()
    assert es.status is ExecutionStatus.COMPLETED
    es.error("it broke")
    assert es.status is ExecutionStatus.ERROR and es.internal_data == {"error": "it broke"}


def test_from_dict_reads_legacy_internal_data_and_current_dump() -> None:
    legacy = {
        "current_node": "tools",
        "step": 4,
        "status": "interrupted_after",
        "interrupted_node": "tools",
        "interrupt_reason": "interrupt_after: tools",
        "thread_id": "t-1",
        "stop_current_execution": "stop_requested",
        "_internal_data": {"error": "x"},
    }
    es = ExecutionState.from_dict(legacy)
    assert es.step == 4 and es.status is ExecutionStatus.INTERRUPTED_AFTER
    assert es.stop_current_execution is StopRequestStatus.STOP_REQUESTED
    assert es.internal_data == {"error": "x"} and es.thread_id == "t-1"
    original = ExecutionState(current_node="a", step=2, internal_data={"k": 1}, thread_id=7)
    assert ExecutionState.from_dict(original.model_dump(mode="json")) == original
    assert ExecutionState.from_dict({}).current_node == START


# Message -------------------------------------------------------------------------


def test_message_defaults() -> None:
    m = Message(role="user", content=[TextBlock(text="x")])
    assert isinstance(m.message_id, str) and uuid.UUID(m.message_id)
    assert m.message_id != Message(role="user", content=[]).message_id
    assert m.delta is False and m.tools_calls is None and m.reasoning is None
    assert m.metadata == {} and m.usages is None and m.raw is None and m.parsed_content is None
    assert isinstance(m.timestamp, float)
    assert abs(m.timestamp - datetime.now().timestamp()) < 60
    assert not hasattr(m, "tool_call_id")


def test_a_message_timestamp_is_the_epoch_time_to_the_microsecond() -> None:
    before = time.time()
    stamps = [Message(role="user", content=[]).timestamp for _ in range(200)]
    after = time.time()
    for ts in stamps:
        # As 10xGraph's datetime.now().timestamp(): microseconds, no finer digits.
        assert round(ts, 6) == ts and ts == float(f"{ts:.6f}")
        assert before - 1e-6 <= ts <= after + 1e-6
    assert stamps == sorted(stamps)


def test_message_rejects_unknown_role_and_block_type() -> None:
    with pytest.raises(ValidationError):
        Message(role="robot", content=[])  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Message(role="user", content=[{"type": "hologram"}])


def test_content_accepts_plain_string() -> None:
    m = Message(role="assistant", content="plain")
    assert m.content == [TextBlock(text="plain")]
    assert Message.model_validate({"role": "user", "content": "s"}).text() == "s"


def test_content_dicts_dispatch_on_type() -> None:
    m = Message.model_validate(
        {
            "role": "assistant",
            "content": [
                {"type": "tool_call", "id": "c", "name": "f"},
                {"type": "remote_tool_call", "id": "r", "name": "g"},
                {"type": "tool_result", "call_id": "c", "output": [1, 2]},
            ],
        }
    )
    assert [type(b) for b in m.content] == [ToolCallBlock, RemoteToolCallBlock, ToolResultBlock]
    assert m.content[0].args == {} and m.content[0].tool_type is None
    assert m.content[1].tool_type == "remote"


@pytest.mark.parametrize("block", EVERY_BLOCK, ids=lambda b: f"{b.type}")
def test_every_block_round_trips_inside_a_message(block: BaseModel) -> None:
    m = Message(role="assistant", content=[block])
    dumped = m.model_dump(mode="json")
    json.dumps(dumped)
    restored = Message.model_validate(dumped)
    assert restored == m
    assert type(restored.content[0]) is type(block)
    assert Message.model_validate_json(m.model_dump_json()) == m


def test_full_message_round_trip() -> None:
    m = full_message()
    assert Message.model_validate(m.model_dump(mode="json")) == m
    assert Message.model_validate(m.model_dump()) == m


def test_tools_calls_keep_openai_shape() -> None:
    m = full_message()
    dumped = m.model_dump(mode="json")
    assert dumped["tools_calls"] == OPENAI_CALLS
    restored = Message.model_validate_json(m.model_dump_json())
    call = restored.tools_calls[0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert "tool_calls" not in dumped


def test_parsed_content_model_dumps_to_json() -> None:
    class Answer(BaseModel):
        value: int
        when: datetime

    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    m = Message(role="assistant", content="x", parsed_content=Answer(value=1, when=when))
    assert isinstance(m.parsed_content, Answer)
    assert m.model_dump(mode="json")["parsed_content"] == {
        "value": 1,
        "when": "2024-01-02T03:04:05Z",
    }
    assert m.model_dump()["parsed_content"] == {"value": 1, "when": when}
    assert json.loads(m.model_dump_json())["parsed_content"]["value"] == 1


def test_token_usages() -> None:
    u = TokenUsages(completion_tokens=1, prompt_tokens=2, total_tokens=3)
    assert u.reasoning_tokens == 0
    assert (u.cache_creation_input_tokens, u.cache_read_input_tokens) == (0, 0)
    assert (u.image_tokens, u.audio_tokens) == (0, 0)
    with pytest.raises(ValidationError):
        TokenUsages(completion_tokens=1, prompt_tokens=2)  # type: ignore[call-arg]


def test_text_message_helper() -> None:
    m = Message.text_message("hello")
    assert m.role == "user" and m.content == [TextBlock(text="hello")]
    a = Message.text_message("yo", role="assistant", message_id="m-1")
    assert (a.role, a.message_id, a.text()) == ("assistant", "m-1", "yo")


def test_tool_message_helper() -> None:
    meta = {"function_name": "f", "tool_call_id": "call_1"}
    m = Message.tool_message(
        [ToolResultBlock(call_id="call_1", output="42", status="completed")],
        message_id="t-1",
        meta=meta,
    )
    assert (m.role, m.message_id, m.metadata) == ("tool", "t-1", meta)
    assert m.metadata is not meta
    assert Message.tool_message([]).metadata == {}


def test_text_concatenates_text_and_tool_outputs() -> None:
    m = Message(
        role="tool",
        content=[
            TextBlock(text="a"),
            ImageBlock(media=MEDIA),
            ToolResultBlock(call_id="c", output={"k": 1}),
            ToolResultBlock(call_id="c", output="s"),
            ToolResultBlock(call_id="c", output=None),
            ReasoningBlock(summary="hidden"),
            TextBlock(text="b"),
        ],
    )
    assert m.text() == 'a{"k": 1}sb'
    assert Message(role="user", content=[]).text() == ""


def test_text_handles_dict_blocks() -> None:
    m = Message.model_construct(
        role="tool",
        content=[
            {"type": "text", "text": "x"},
            {"type": "tool_result", "call_id": "c", "output": [1]},
            {"type": "image"},
        ],
    )
    assert m.text() == "x[1]"


# id generator ------------------------------------------------------------------------


def test_generate_id_without_hook() -> None:
    assert Message.generate_id("explicit") == "explicit"
    assert Message.generate_id(7) == 7
    generated = Message.generate_id(None)
    assert isinstance(generated, str) and uuid.UUID(generated)
    assert uuid.UUID(Message.generate_id(""))


def test_generated_id_wins_over_explicit_id() -> None:
    message_module.set_id_generator(lambda: "gen-1")
    assert Message.generate_id("explicit") == "gen-1"
    assert Message.text_message("x", message_id="explicit").message_id == "gen-1"
    assert Message.tool_message([], message_id="explicit").message_id == "gen-1"
    assert Message(role="user", content=[]).message_id == "gen-1"


def test_empty_generated_id_defers_to_explicit_then_uuid() -> None:
    message_module.set_id_generator(lambda: "")
    assert Message.text_message("x", message_id="explicit").message_id == "explicit"
    assert uuid.UUID(Message.text_message("x").message_id)
    message_module.set_id_generator(lambda: None)
    assert Message.generate_id("e") == "e"


def test_int_generator_ids() -> None:
    counter = iter(range(100, 200))
    message_module.set_id_generator(lambda: next(counter))
    assert Message.text_message("a").message_id == 100
    assert Message.text_message("b").message_id == 101
    dumped = Message.text_message("c").model_dump(mode="json")
    assert Message.model_validate(dumped).message_id == 102


def test_async_generator_is_resolved_with_and_without_running_loop() -> None:
    async def gen() -> str:
        return "async-id"

    message_module.set_id_generator(gen)
    assert Message.generate_id("x") == "async-id"

    async def inside_loop() -> str | int:
        return Message.text_message("q").message_id

    assert asyncio.run(inside_loop()) == "async-id"


def test_constructor_and_stored_ids_are_kept_under_a_generator() -> None:
    message_module.set_id_generator(lambda: "gen")
    assert Message(message_id="stored", role="user", content=[]).message_id == "stored"
    loaded = Message.model_validate({"message_id": "db-1", "role": "user", "content": []})
    assert loaded.message_id == "db-1"


def test_set_id_generator_none_restores_uuid() -> None:
    message_module.set_id_generator(lambda: "g")
    assert message_module.get_id_generator() is not None
    message_module.set_id_generator(None)
    assert message_module.get_id_generator() is None
    assert uuid.UUID(Message.text_message("x").message_id)


# ToolResult, StreamChunk ----------------------------------------------------------


def test_tool_result_forms() -> None:
    positional = ToolResult("done", {"note": "set"}, True)
    assert positional.message == "done"
    assert (positional.state, positional.is_error) == ({"note": "set"}, True)
    keyword = ToolResult(message={"k": 1})
    assert keyword.state is None and keyword.is_error is False
    assert ToolResult.model_validate({"message": "m", "state": {"a": 1}}).state == {"a": 1}
    with pytest.raises(ValidationError):
        ToolResult()
    with pytest.raises(ValidationError):
        ToolResult("m", state="not a dict")  # type: ignore[arg-type]


def test_stream_event_and_chunk() -> None:
    assert [e.value for e in StreamEvent] == ["message", "state", "updates", "error"]
    chunk = StreamChunk(message=Message.text_message("hi"), thread_id="t", run_id="r")
    assert chunk.event == "message" and chunk.event is StreamEvent.MESSAGE
    assert chunk.state is None and chunk.data is None and chunk.metadata == {}
    assert isinstance(chunk.timestamp, float)
    update = StreamChunk(event="updates", data={"status": "graph_invoked"})
    assert update.event is StreamEvent.UPDATES


def test_stream_chunk_dumps_state_subclass_fields() -> None:
    state = NoteState(note="kept", context=[Message.text_message("q")])
    chunk = StreamChunk(event=StreamEvent.STATE, state=state, thread_id=5)
    assert chunk.state is state
    dumped = json.loads(chunk.model_dump_json())
    assert dumped["state"]["note"] == "kept"
    assert dumped["event"] == "state" and dumped["thread_id"] == 5


# utils: constants, Command, ThreadInfo, @tool ---------------------------------------


def test_constants() -> None:
    assert (START, END, RESUME_KEY) == ("__start__", "__end__", "resume")
    assert DEFAULT_NODE_TIMEOUT_SECONDS == 900.0 and DEFAULT_TOOL_TIMEOUT_SECONDS == 300.0
    assert DEFAULT_ANONYMOUS_USER_ID == "anonymous"
    assert ResponseGranularity("low") is ResponseGranularity.LOW
    assert [g.value for g in ResponseGranularity] == ["full", "partial", "low"]
    # 10xGraph's seven members in its order (session 32), then ours.
    run_states = ["running", "paused", "completed", "error", "interrupted", "aborted", "idle", "stopped"]
    assert [s.value for s in RunState] == run_states
    assert RunState.RUNNING == "running"


def test_command() -> None:
    empty = Command()
    assert (empty.update, empty.goto, empty.graph, empty.state) == (None, None, None, None)
    state = AgentState()
    cmd = Command(update="hi", goto=END, state=state)
    assert (cmd.update, cmd.goto, cmd.state) == ("hi", "__end__", state)
    assert Command.PARENT == "PARENT"
    assert Command(goto="x", graph=Command.PARENT).graph == "PARENT"
    expected = "Command(update=1, goto='n', graph=None, state=None)"
    assert repr(Command(update=1, goto="n")) == expected


def test_thread_info() -> None:
    info = ThreadInfo(thread_id=12, user_id="u", created_at="2024-05-01T10:00:00Z")
    assert info.thread_id == 12 and info.metadata is None and info.thread_name is None  # as 10xGraph's
    assert info.updated_at is not None
    assert info.created_at == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert ThreadInfo.model_validate(info.model_dump(mode="json")) == info
    with pytest.raises(ValidationError):
        ThreadInfo()  # type: ignore[call-arg]


def test_tool_decorator_bare() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    assert add(2, 3) == 5
    assert has_tool_decorator(add)
    assert add._py_tool_name == "add"
    assert add._py_tool_description is None
    assert add._py_tool_tags == set()
    assert add._py_tool_side_effects == "idempotent"
    meta = get_tool_metadata(add)
    assert meta["name"] == "add" and meta["description"] == "Add two numbers."


def test_tool_decorator_with_options() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}

    @tool(
        name="search_web",
        description="Search.",
        tags=["web", "read"],
        provider="acme",
        capabilities=["network"],
        metadata={"cost": 1},
        parameters=schema,
        side_effects="at_most_once",
    )
    async def search(q: str) -> str:
        return q

    assert asyncio.run(search("x")) == "x"
    assert search._py_tool_name == "search_web"
    assert search._py_tool_description == "Search."
    assert search._py_tool_tags == {"web", "read"}
    assert search._py_tool_provider == "acme"
    assert search._py_tool_capabilities == ["network"]
    assert search._py_tool_metadata == {"cost": 1}
    assert search._py_tool_parameters is schema
    assert search._py_tool_side_effects == "at_most_once"
    assert get_tool_metadata(search)["side_effects"] == "at_most_once"


def test_tool_decorator_single_string_tag_and_pure() -> None:
    @tool(tags="math", side_effects="pure")
    def f() -> None: ...

    assert f._py_tool_tags == {"math"}
    assert f._py_tool_side_effects == "pure"


def test_tool_decorator_rejects_unknown_side_effects() -> None:
    with pytest.raises(ValueError, match="side_effects"):
        tool(side_effects="sometimes")  # type: ignore[arg-type]


def test_undecorated_function_metadata_defaults() -> None:
    def plain(x: int) -> int:
        """Doc."""
        return x

    assert not has_tool_decorator(plain)
    # 10xGraph 0.10's answer for an undecorated function: nothing but an empty tag set.
    assert get_tool_metadata(plain) == {
        "name": None,
        "description": None,
        "tags": set(),
        "provider": None,
        "capabilities": None,
        "metadata": None,
        "parameters": None,
        "side_effects": "idempotent",
        "on_unknown": "error",
    }


def test_decorated_method_is_seen_through_bound_method() -> None:
    class Tools:
        @tool(name="m")
        def method(self) -> int:
            return 1

    bound = Tools().method
    assert has_tool_decorator(bound) and get_tool_metadata(bound)["name"] == "m"


def test_utils_interrupt_is_the_function_not_the_module() -> None:
    import importlib

    import tenxgraph.utils as utils

    importlib.import_module("tenxgraph.utils.interrupt")  # loading the submodule must not rebind it
    from tenxgraph.utils import GraphInterrupt, Interrupt, interrupt, pending_interrupt

    assert callable(interrupt) and interrupt.__name__ == "interrupt"
    assert utils.interrupt is interrupt
    assert issubclass(GraphInterrupt, BaseException) and not issubclass(GraphInterrupt, Exception)
    assert Interrupt.model_fields.keys() >= {"id", "key", "node", "value", "message", "reason", "tool_call_id"}
    assert pending_interrupt.__name__ == "pending_interrupt"
    with pytest.raises(AttributeError):
        utils.not_a_name  # noqa: B018


# import order -------------------------------------------------------------------------

IMPORT_ORDERS = [
    "import tenxgraph.utils; import tenxgraph.core",
    "import tenxgraph.core; import tenxgraph.utils",
    "import tenxgraph.core.state; import tenxgraph.utils",
    "import tenxgraph.core.state.message; import tenxgraph.core.state.reducers",
    "import tenxgraph.utils.constants; import tenxgraph.core.state.agent_state",
    "import tenxgraph.core.exceptions; import tenxgraph.core.state.stream_chunks",
    "from tenxgraph.utils import add_messages; from tenxgraph.core import AgentState",
]


@pytest.mark.parametrize("statement", IMPORT_ORDERS)
def test_any_import_order_works(statement: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR)}
    code = statement + "; from tenxgraph.core.state import AgentState; AgentState()"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
