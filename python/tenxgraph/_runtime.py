"""The Python half of one run: the live pydantic state and what the Rust loop asks of it.

The Rust engine owns the loop (routing, steps, limits, commits, timeouts, stop). It calls back
into a ``Run`` for the parts that are Python by nature: building the state, calling a node and
turning its return value into state and messages, evaluating a condition, and dumping what a step
must persist. Only the node's new messages are dumped per step, so a step's cost does not grow
with the thread's history.
"""

from __future__ import annotations

import copy
import gc
import json
from typing import TYPE_CHECKING, Any

from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.execution_state import ExecutionStatus, StopRequestStatus
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.reducers import RemoveMessage, add_messages
from tenxgraph._tool_step import ToolStep
from tenxgraph.logs import log_fields
from tenxgraph.utils.interrupt import RESUME_ANSWERS_KEY, activate, check_answer, deactivate, pending_interrupt
from tenxgraph.utils.command import Command

if TYPE_CHECKING:
    from tenxgraph._live_states import Held
    from tenxgraph.core.graph.compiled_graph import CompiledGraph

__all__ = ["Run", "STATE_META_KEY", "encode_state", "encode_state_meta"]

STATE_META_KEY = "__state_meta__"
_PROTECTED_FIELDS = frozenset({"context", "context_summary", "execution_meta"})


def encode_state_meta(state: AgentState) -> dict[str, Any]:
    return {"format": 1, "class": type(state).__name__}


def encode_state(state: AgentState, *, with_context: bool) -> dict[str, Any]:
    """The stored form of a state: its JSON dump plus the class header. Steps store the context
    as message rows, so they leave it out."""
    data = state.model_dump(mode="json", exclude=None if with_context else {"context"})
    data[STATE_META_KEY] = encode_state_meta(state)
    return data


class _ContextIndex:
    """Appends a step's messages to the live context in place, deduplicated by id like
    ``add_messages``, without a pass over the history per append.

    The id set is kept with a shallow copy of the context it was built from, and trusted only while
    the context is that same list holding the same objects in the same order. Checking that is a
    list comparison, which compares by identity first: about 1 ns per message in C, against ~40 ns
    per message to rebuild the set (and ~140 ns for ``add_messages``, which also filters
    tombstones per message). A node that edits the history (replaces, removes, reorders or
    rebinds ``context``) fails the check and the set is rebuilt. Not seen: a message whose
    ``message_id`` a node changes in place on the same object. The index travels with a kept live
    state (tenxgraph._live_states), so a thread's next turn starts with it too."""

    def __init__(self) -> None:
        self._ctx: list[Message] | None = None
        self._seen: list[Message] = []
        self._ids: set[Any] = set()

    def _ids_of(self, ctx: list[Message]) -> set[Any]:
        if ctx is not self._ctx or ctx != self._seen:
            self._ctx, self._seen, self._ids = ctx, list(ctx), {m.message_id for m in ctx}
        return self._ids

    def append(self, state: AgentState, messages: list[Message]) -> None:
        if any(isinstance(m, RemoveMessage) for m in messages):
            state.context = add_messages(state.context, messages)  # tombstones: the full rules
            self._ctx = None
            return
        ctx = state.context
        ids = self._ids_of(ctx)
        for m in messages:
            if m.delta or m.message_id in ids:
                continue
            ctx.append(m)
            self._seen.append(m)
            ids.add(m.message_id)


class Run:
    """One ``ainvoke`` call. Not reused across calls."""

    def __init__(self, graph: CompiledGraph[Any], config: dict[str, Any], input_data: dict[str, Any]) -> None:
        self.graph = graph
        self.config = config
        self.input_messages = _input_messages(input_data)
        self.state_update = _state_update(input_data)
        start = input_data.get("state", {}).get("current_node") if isinstance(input_data.get("state"), dict) else None
        if start is not None and not isinstance(start, str):
            raise ValueError("input_data['state']['current_node'] must be a node name")
        self.start_node: str | None = start
        self.state: AgentState | None = None
        self.has_resume = isinstance(input_data, dict) and "resume" in input_data
        self.resume_value = input_data.get("resume") if self.has_resume else None
        self.produced: list[Message] = []
        self._tool_steps: dict[str, ToolStep] = {}
        self._index = _ContextIndex()
        # The context's message objects as of the last commit (see snapshot).
        self._committed: list[Message] = []
        self.emitter: Any = None  # a tenxgraph._stream.Emitter when the run is streamed
        # (version, write mark, state) kept from this thread's previous run in this process
        # (tenxgraph._live_states); used when the store confirms the thread is still there.
        self.known: Held | None = None

    def _log_fields(self, **more: str) -> dict[str, str]:
        """The run's log fields, for lines made where the run's context is not current (the Rust
        loop calls ``prepare`` and ``accept_replay`` from its own threads)."""
        return {"thread_id": str(self.config["thread_id"]), "run_id": str(self.config["run_id"]), **more}

    # -- called by the Rust loop -----------------------------------------------------------

    def prepare(self, state_json: str | None, stored_class: str | None, exec_json: str,
                known: bool = False) -> tuple[int, str | None]:
        """Builds the live state and merges the input. Returns the cursor of stored messages.

        ``state_json``: the stored state with its messages as ``context``, one JSON document
        (``__state_meta__`` already taken out by Rust: ``stored_class`` is what it named).
        ``known``: the thread's latest row is still the commit ``self.known`` was kept from."""
        if known:
            assert self.known is not None, "the store confirmed a state this run does not hold"
            state, self._index = self.known[2], self.known[3]
        elif state_json is None:
            state = self.graph._prototype.model_copy(deep=True)
        else:
            # One validation from JSON text, with the cyclic GC paused: a long thread's load makes
            # tens of thousands of objects, none of them garbage, and the collector ran over and
            # over during it (15-18% of such a load).
            paused = gc.isenabled()
            gc.disable()
            try:
                state = self.graph._state_type.model_validate_json(state_json)
            finally:
                if paused:
                    gc.enable()
            if stored_class and stored_class != type(state).__name__:
                self.graph._log.warning(
                    "thread state was written by %s, loading it as %s", stored_class, type(state).__name__,
                    extra=self._log_fields(),
                )
        self.known = None  # used, or outdated: either way not needed again
        self._check_resume(state)
        stored_len = len(state.context)
        self._committed = list(state.context)
        last_id = str(state.context[-1].message_id) if stored_len else None
        if self.input_messages:
            self._index.append(state, self.input_messages)
        fields = type(state).model_fields
        for key, value in self.state_update.items():
            # 10xGraph sets only the keys the state has; others are ignored, not an error.
            if key in fields:
                setattr(state, key, copy.deepcopy(value))  # not shared with the caller
            else:
                self.graph._log.warning(
                    "input 'state' key %r is not a field of %s; ignored", key, type(state).__name__,
                    extra=self._log_fields(),
                )
        self._apply_exec(state, exec_json)
        if state.execution_meta.status == ExecutionStatus.COMPLETED:
            # Only a finished thread asked to finish is prepared completed: nothing runs, and the
            # response is the stored last turn.
            start = max((i for i, m in enumerate(state.context) if m.role == "user"), default=-1) + 1
            self.produced = list(state.context[start:])
        self.state = state
        return stored_len, last_id

    async def run_node(self, name: str, exec_json: str) -> str | None:
        state = self.state
        assert state is not None, "prepare() runs first"
        self._apply_exec(state, exec_json)
        node = self.graph._nodes[name]
        config = dict(self.config, _node_name=name)
        if self.emitter is not None:
            self._stream_update("invoking_node", name, now=True)
        pre_len = len(state.context)
        pre_last = state.context[-1].message_id if pre_len else None
        answers = state.execution_meta.internal_data.get(RESUME_ANSWERS_KEY, {})
        token = activate(name, answers)
        try:
            with log_fields(node=name):
                result = await node.call(state, config)
        finally:
            deactivate(token)
        produced_before = len(self.produced)
        goto = self._absorb(result, state, pre_len, pre_last)
        _clear_answers(self.state)  # the node finished: its answers are spent
        if self.emitter is not None:
            for m in self.produced[produced_before:]:
                self.emitter.message(m, "node_invoked", name, now=False)
            self._stream_update("node_invoked", name, now=False)
        return goto

    def committed(self, version: int) -> None:
        """The step is durable: release the chunks held back for it."""
        if self.emitter is not None:
            self.emitter.flush()

    def _stream_update(self, status: str, node: str, *, now: bool) -> None:
        from tenxgraph.core.state.stream_chunks import StreamEvent

        em = self.emitter
        if em.wants(StreamEvent.UPDATES):
            chunk = em.make(StreamEvent.UPDATES, data={"status": status, "node": node}, status=status, node=node)
            em.emit(chunk) if now else em.hold(chunk)
        if status == "node_invoked" and em.wants(StreamEvent.STATE) and self.state is not None:
            em.hold(em.make(StreamEvent.STATE, state=self.state.model_copy(deep=True), status=status, node=node))

    def eval_condition(self, index: int) -> str | bool:
        result = self.graph._conditions[index](self.state)
        return result if isinstance(result, str) else bool(result)

    def snapshot(self, exec_json: str, cursor_len: int, cursor_last_id: str | None) -> tuple[
        str, list[tuple[str, str]], bool, int, str | None
    ]:
        state = self.state
        assert state is not None, "prepare() runs first"
        self._apply_exec(state, exec_json)
        data = encode_state(state, with_context=False)
        ctx = state.context
        n = len(ctx)
        # Only new messages are written while the stored ones are still the same objects in the
        # same order (an identity-first list compare, ~1 ns per message). A node that replaced or
        # removed an earlier message gets the whole context written; before, such an edit that
        # kept the length and the last id was never stored.
        grown = (cursor_len <= n and (cursor_len == 0 or str(ctx[cursor_len - 1].message_id) == cursor_last_id)
                 and ctx[:cursor_len] == self._committed[:cursor_len])
        fresh = ctx[cursor_len:] if grown else ctx
        self._committed = list(ctx)
        messages = [(str(m.message_id), m.model_dump_json()) for m in fresh]
        return json.dumps(data), messages, not grown, n, (str(ctx[-1].message_id) if n else None)

    # -- tool nodes (the Rust handler drives these) -----------------------------------------

    def begin_tools(self, name: str, exec_json: str) -> str:
        state = self.state
        assert state is not None, "prepare() runs first"
        self._apply_exec(state, exec_json)
        step = ToolStep.begin(name, self.graph._nodes[name].func, state)
        step.ledger = (self.graph._checkpointer._native, str(self.config["thread_id"]), str(self.config["user_id"]))
        self._tool_steps[name] = step
        if self.emitter is not None:
            self._stream_update("invoking_node", name, now=True)
        origin = step.origin_id
        if not isinstance(origin, (str, int)) or isinstance(origin, bool):
            origin = None if origin is None else str(origin)
        tools = step.tool_node
        # JSON keeps the ids' types for the ledger keys: [origin, [[call id, name, side effects]...]]
        return json.dumps([None if origin == "" else origin, [[c.raw_id, c.name, tools.side_effects(c.name)] for c in step.calls]])

    def accept_replay(self, name: str, index: int, envelope_json: str) -> bool:
        # Called from a Rust thread, outside the run's context: its log fields are set here.
        with log_fields(**self._log_fields(node=name)):
            return self._tool_steps[name].accept_replay(index, envelope_json)

    async def run_tool(self, name: str, index: int, idempotency_key: str | None,
                       ledger_key: str | None = None) -> tuple[str, bool, bool]:
        config = dict(self.config, _node_name=name)
        if self.emitter is not None:  # a streamed run: tools may emit progress chunks (StreamEmitter)
            config["_tenx_stream"] = (self.emitter.queue, self.emitter.loop)
        step = self._tool_steps[name]
        with log_fields(node=name, tool=step.calls[index].name):
            out = await step.run(index, config, idempotency_key, ledger_key)
        if self.emitter is not None:
            step.pending_stream[index] = out[0]
        return out

    def unknown_outcome(self, name: str, index: int, idempotency_key: str | None) -> tuple[str, str, bool, bool]:
        """An at-most-once call found started but never completed (see ToolStep.unknown)."""
        out = self._tool_steps[name].unknown(index, idempotency_key)
        if self.emitter is not None and out[0] == "answer":
            self._tool_steps[name].pending_stream[index] = out[1]
        return out

    def tool_settled(self, name: str, index: int) -> None:
        """The call's result is in the ledger (or needs no record): stream it now."""
        step = self._tool_steps.get(name)
        if self.emitter is None or step is None or index not in step.pending_stream:
            return
        value = json.loads(step.pending_stream.pop(index))["value"]
        self.emitter.message(Message.model_validate(value), "tool_result", name, now=True)
        step.streamed.add(index)

    def finish_tools(self, name: str, items: list[tuple[str, str]]) -> str | None:
        step = self._tool_steps.pop(name)
        messages = step.finish(items)
        state = self.state
        assert state is not None
        self._index.append(state, messages)
        self.produced.extend(messages)
        _clear_answers(state)
        if self.emitter is not None:
            for index, m in enumerate(messages):
                if index not in step.streamed:  # replayed from the ledger, timed out or failed
                    self.emitter.message(m, "tool_result", name, now=False)
            self._stream_update("node_invoked", name, now=False)
        return None

    # -- results ---------------------------------------------------------------------------

    def response(self, granularity: str) -> dict[str, Any]:
        state = self.state
        assert state is not None
        messages: list[Message] = []
        last_user = next((m for m in reversed(state.context) if m.role == "user"), None)
        if last_user is not None:
            messages.append(last_user)
        messages.extend(m for m in self.produced if m is not last_user)
        if granularity == "low":  # copies: the live state may be kept for the thread's next run
            messages = [_copy_message(m) for m in messages]
        usage = _token_usage(messages)
        if granularity == "full":
            return {"state": state, "messages": messages, "token_usage": usage}
        if granularity == "partial":
            return {
                "context": state.context,
                "summary": state.context_summary,
                "messages": messages,
                "token_usage": usage,
            }
        return {"messages": messages, "token_usage": usage}

    def _check_resume(self, state: AgentState) -> None:
        """10xGraph's resume rules, checked on the stored state before any input is merged."""
        pending = pending_interrupt(state)
        if pending is not None and not self.has_resume:
            raise ValueError(
                f"Thread is paused at interrupt '{pending.id}' in node '{pending.node}'. "
                "Resume it with {'resume': value}."
            )
        if self.has_resume and pending is None:
            raise ValueError("Nothing to resume: the thread is not paused at an interrupt().")
        if pending is not None:
            check_answer(self.resume_value, pending.response_schema)
            try:
                json.dumps(self.resume_value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"the resume value must be JSON-serialisable: {exc}") from exc
            answers = state.execution_meta.internal_data.setdefault(RESUME_ANSWERS_KEY, {})
            answers[pending.key] = self.resume_value

    # -- helpers ---------------------------------------------------------------------------

    def _absorb(self, result: Any, state: AgentState, pre_len: int, pre_last: Any) -> str | None:
        """10xGraph's process_node_result: returns the goto, updates ``self.state``."""
        goto: str | None = None
        if isinstance(result, Command):
            goto = result.goto
            if result.state is not None:
                result_state = _require_state(result.state)
                self.state = state = result_state
            result = result.update
        new: list[Message] = []
        if isinstance(result, AgentState):
            if result is not state:
                self.state = result
            ctx = result.context
            if len(ctx) >= pre_len and (pre_len == 0 or ctx[pre_len - 1].message_id == pre_last):
                new = list(ctx[pre_len:])
            else:
                new = []  # the node rewrote its context: the next snapshot stores it whole
        elif result is not None:
            items = result if isinstance(result, list) else [result]
            seen_new: set[Any] = set()
            for item in items:
                msg = _to_message(item)
                if msg.message_id not in seen_new:
                    seen_new.add(msg.message_id)
                    new.append(msg)
            target = self.state
            assert target is not None
            self._index.append(target, new)
        self.produced.extend(m for m in new if not m.delta)
        return goto

    @staticmethod
    def _apply_exec(state: AgentState, exec_json: str) -> None:
        meta = json.loads(exec_json)
        em = state.execution_meta
        em.current_node = meta["current_node"]
        em.step = meta["step"]
        em.status = ExecutionStatus(meta["status"])
        em.interrupted_node = meta.get("interrupted_node")
        em.interrupt_reason = meta.get("interrupt_reason")
        em.interrupt_data = meta.get("interrupt_data")
        em.thread_id = meta.get("thread_id")
        em.stop_current_execution = StopRequestStatus(meta.get("stop_current_execution", "none"))
        if meta.get("error") is not None:
            em.internal_data["error"] = meta["error"]


def _clear_answers(state: AgentState | None) -> None:
    if state is not None:
        state.execution_meta.internal_data.pop(RESUME_ANSWERS_KEY, None)


def _to_message(item: Any) -> Message:
    if isinstance(item, Message):
        return item
    if isinstance(item, str):
        return Message.text_message(item, role="assistant")
    raise ValueError(
        f"Unsupported content type {type(item).__name__!r} returned by a node: return a str, a Message, "
        "a list of them, the state, or a Command (a plain dict is not supported)"
    )


def _require_state(value: Any) -> AgentState:
    if not isinstance(value, AgentState):
        raise ValueError(f"Command(state=...) must be an AgentState, got {type(value).__name__}")
    return value


def _input_messages(input_data: Any) -> list[Message]:
    if not isinstance(input_data, dict):
        raise TypeError(f"input_data must be a dict, got {type(input_data).__name__}")
    raw = input_data.get("messages")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("input_data['messages'] must be a list of Message")
    out = []
    for m in raw:
        if isinstance(m, Message):
            # A copy: the state (which may be kept for the thread's next turn) must not share
            # objects with the caller.
            out.append(_copy_message(m))
        elif isinstance(m, dict):
            out.append(Message.model_validate(m))
        else:
            raise ValueError(f"input_data['messages'] items must be Message objects, got {type(m).__name__}")
    return out


def _copy_message(m: Message) -> Message:
    """A deep copy: a dump and a validation, half the time of ``model_copy(deep=True)``."""
    return type(m).model_validate(m.model_dump(round_trip=True))


def _state_update(input_data: dict[str, Any]) -> dict[str, Any]:
    update = input_data.get("state")
    if update is None:
        return {}
    if not isinstance(update, dict):
        raise ValueError("input_data['state'] must be a dict of state fields")
    return {k: v for k, v in update.items() if k not in _PROTECTED_FIELDS and k != "current_node"}


def _token_usage(messages: list[Message]) -> dict[str, int]:
    inp = out = reasoning = 0
    for m in messages:
        u = m.usages
        if u is not None:
            inp += u.prompt_tokens
            out += u.completion_tokens
            reasoning += u.reasoning_tokens
    return {
        "total_input_tokens": inp,
        "total_output_tokens": out,
        "total_reasoning_tokens": reasoning,
        "total_tokens": inp + out,
    }
