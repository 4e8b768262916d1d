"""The Python half of one run: the live pydantic state and what the Rust loop asks of it.

The Rust engine owns the loop (routing, steps, limits, commits, timeouts, stop). It calls back
into a ``Run`` for the parts that are Python by nature: building the state, calling a node and
turning its return value into state and messages, evaluating a condition, and dumping what a step
must persist. Only the node's new messages are dumped per step, so a step's cost does not grow
with the thread's history.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.execution_state import ExecutionStatus, StopRequestStatus
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import RemoteToolCallBlock
from tenxgraph.prebuilt.tools.handoff import handoff_target
from tenxgraph.core.state.reducers import RemoveMessage, add_messages
from tenxgraph import _node_context
from tenxgraph._core import NodeResult
from tenxgraph._cold_load import validate_stored_state
from tenxgraph._state_codec import STATE_META_KEY, encode_message, encode_state, encode_state_meta, encode_state_text
from tenxgraph._tool_step import ToolStep
from tenxgraph.logs import log_fields
from tenxgraph.utils.interrupt import RESUME_ANSWERS_KEY, activate, check_answer, deactivate, pending_interrupt
from tenxgraph.utils.callbacks import CallbackContext, GraphLifecycleContext, InvocationType
from tenxgraph.utils.command import Command

if TYPE_CHECKING:
    from tenxgraph._core import ExecView, RunOptions
    from tenxgraph._live_states import Held
    from tenxgraph.core.graph.compiled_graph import CompiledGraph

__all__ = ["Run", "STATE_META_KEY", "encode_state", "encode_state_meta"]

# 10xGraph's execution_meta.interrupt_reason while a tool node waits for the client's results.
REMOTE_TOOL_REASON = "remote_tool_call"
_PROTECTED_FIELDS = frozenset({"context", "context_summary", "execution_meta"})


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

    def append(self, state: AgentState, messages: list[Message], new_ids: set[Any] | None = None) -> None:
        """``new_ids`` collects the ids this call added that the context did not hold."""
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
            if new_ids is not None:
                new_ids.add(m.message_id)


class _StartEffect:
    """What ``on_resume``/``on_graph_start`` changed on the state: the fields they set (compared by
    their JSON dump; ``execution_meta`` is the loop's) and the messages they added. Kept so a start
    the loop prepares again (a refused optimistic input commit) gets the same changes without the
    hooks firing a second time for one call."""

    def __init__(self, dumped: dict[str, Any], ids: set[Any]) -> None:
        self._dumped = dumped
        self._ids = ids
        self.fields: dict[str, Any] = {}
        self.added: list[Message] = []

    @staticmethod
    def _dump(state: AgentState) -> dict[str, Any]:
        return state.model_dump(mode="json", exclude={"context", "execution_meta"})

    @classmethod
    def before(cls, state: AgentState) -> _StartEffect:
        return cls(cls._dump(state), {m.message_id for m in state.context})

    def after(self, state: Any) -> _StartEffect:
        if not isinstance(state, AgentState):
            return self  # ignored by _adopt, with its warning
        now = self._dump(state)
        self.fields = {k: copy.deepcopy(getattr(state, k)) for k, v in now.items() if self._dumped.get(k) != v}
        self.added = [m.model_copy(deep=True) for m in state.context if m.message_id not in self._ids]
        self._dumped = {}
        return self

    def apply(self, state: AgentState) -> AgentState:
        for key, value in self.fields.items():
            setattr(state, key, copy.deepcopy(value))
        if self.added:
            state.context = add_messages(state.context, [m.model_copy(deep=True) for m in self.added])
        return state


class Run:
    """One ``ainvoke`` call. Not reused across calls."""

    def __init__(self, graph: CompiledGraph[Any], config: dict[str, Any], input_data: dict[str, Any]) -> None:
        self.graph = graph
        # The nodes and the topology this run drives, taken together (see override_node).
        self.nodes = graph._nodes
        self.native = graph._native
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
        # Ids of messages a node of this run added to the context, new to it, that no tool node
        # has acted on yet: a tool node on such a message skips the ledger lookup (nothing can
        # be recorded under a message no earlier attempt saw; ToolBatch::fresh in the core).
        self._fresh_ids: set[Any] = set()
        # The context's message objects as of the last commit (see snapshot).
        self._committed: list[Message] = []
        # Tool messages the last tool node made from their recorded texts, by id(), with those
        # texts: the next snapshot stores them without dumping them again. Filled only when no
        # code of the user's can see them before that snapshot, and emptied by every call that
        # runs user code (run_node, eval_condition, lifecycle, begin_tools).
        self._encoded: dict[int, tuple[Message, str]] = {}
        self.emitter: Any = None  # a tenxgraph._stream.Emitter when the run is streamed
        self.events: Any = None  # a tenxgraph._events.RunEvents when the graph has a publisher
        # Client-run tool calls of a pause (RemoteToolCallBlock messages): in the response, never
        # in the context.
        self.remote_calls: list[Message] = []
        # What this process kept from the thread's previous run (tenxgraph._live_states.Held:
        # version, write mark, state, context index, state row); used when the store confirms
        # the thread is still there.
        self.known: Held | None = None
        # The state row of this run's last commit (a _core.KeptState), kept with its live state.
        self.kept_row: Any = None
        # The run's settings as the engine resolved them from ``config`` (a _core.RunOptions).
        self.options: RunOptions | None = None
        self._callbacks = graph._callbacks
        # Only lifecycle hooks make the loop call back at its lifecycle points (see lifecycle()).
        self.has_lifecycle_hooks = bool(self._callbacks._lifecycle_hooks)
        self._input_data = input_data
        self._resumed_node: str | None = None  # set when this run resumes a paused thread
        self._before_node: AgentState | None = None  # the state a node started from (for hooks)
        self._node_error: BaseException | None = None
        self._initial_commit = False  # see _fire_lifecycle
        self._start_effect: _StartEffect | None = None  # what the start hooks changed (once per call)

    def _log_fields(self, **more: str) -> dict[str, str]:
        """The run's log fields, for lines made where the run's context is not current (the Rust
        loop calls ``prepare`` and ``accept_replay`` from its own threads)."""
        return {"thread_id": str(self.config["thread_id"]), "run_id": str(self.config["run_id"]), **more}

    # -- called by the Rust loop -----------------------------------------------------------

    def prepare(self, state_json: bytes | str | None, stored_class: str | None, exec_view: ExecView,
                known: bool = False) -> tuple[int, str | None]:
        """Builds the live state and merges the input. Returns the cursor of stored messages.

        ``state_json``: the stored state with its messages as ``context``, one JSON document as
        UTF-8 bytes (``__state_meta__`` already taken out by Rust: ``stored_class`` is what it
        named).
        ``known``: the thread's latest row is still the commit ``self.known`` was kept from."""
        if known:
            assert self.known is not None, "the store confirmed a state this run does not hold"
            state, self._index = self.known[2], self.known[3]
        elif state_json is None:
            state = self.graph._prototype.model_copy(deep=True)
        else:
            # One validation from JSON text, its objects kept out of the cyclic GC's young
            # generations (see _cold_load).
            state = validate_stored_state(self.graph._state_type, state_json)
            if stored_class and stored_class != type(state).__name__:
                self.graph._log.warning(
                    "thread state was written by %s, loading it as %s", stored_class, type(state).__name__,
                    extra=self._log_fields(),
                )
        self.known = None  # used, or outdated: either way not needed again
        if self.has_lifecycle_hooks and state.execution_meta.status in (
            ExecutionStatus.INTERRUPTED_BEFORE, ExecutionStatus.INTERRUPTED_AFTER
        ):
            self._resumed_node = state.execution_meta.interrupted_node or ""
        self._check_resume(state)
        if self.events is not None and self.input_messages and not self.has_resume:
            # A turn that starts at the entry point (10xGraph ran START as a node first); the
            # stored status is the core's, so this reads where the core is about to start.
            if exec_view.current_node == self.graph._builder.entry_point and exec_view.step == 0:
                self.events.start_node_ran(0)
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
        self._apply_exec(state, exec_view)
        if state.execution_meta.status == ExecutionStatus.COMPLETED:
            # Only a finished thread asked to finish is prepared completed: nothing runs, and the
            # response is the stored last turn.
            start = max((i for i, m in enumerate(state.context) if m.role == "user"), default=-1) + 1
            self.produced = list(state.context[start:])
        self.state = state
        return stored_len, last_id

    async def run_node(self, name: str, exec_view: ExecView) -> str | None:
        self._encoded.clear()  # user code from here on
        state = self.state
        assert state is not None, "prepare() runs first"
        self._apply_exec(state, exec_view)
        node = self.nodes[name]
        config = dict(self.config, _node_name=name)
        if self.emitter is not None:
            self._stream_update("invoking_node", name, now=True)
        pre_len = len(state.context)
        pre_last = state.context[-1].message_id if pre_len else None
        answers = state.execution_meta.internal_data.get(RESUME_ANSWERS_KEY, {})
        events = self.events
        step = state.execution_meta.step
        if events is not None:
            events.node_start(name, step)
        if self.has_lifecycle_hooks:
            self._before_node = state.model_copy(deep=True)
        token = activate(name, answers)
        sink = self.emitter.delta_sink(name) if self.emitter is not None else None
        node_token = _node_context.use(_node_context.NodeContext(self.graph, name, sink))
        try:
            with log_fields(node=name):
                if self._callbacks.wraps(InvocationType.AI):
                    result = await self._call_with_callbacks(node, state, config)
                else:
                    result = await node.call(state, config)
        except (Exception, asyncio.CancelledError) as exc:
            if events is not None:
                events.node_error(name, step, exc)
            if isinstance(exc, Exception):
                self._node_error = exc
            raise
        finally:
            _node_context.reset(node_token)
            deactivate(token)
        produced_before = len(self.produced)
        try:
            goto = self._absorb(result, state, pre_len, pre_last)
        except Exception as exc:
            if events is not None:
                events.node_error(name, step, exc)
            raise
        _clear_answers(self.state)  # the node finished: its answers are spent
        if events is not None:
            events.node_end(name, step, self.produced[produced_before:], goto)
        if self.emitter is not None:
            for m in self.produced[produced_before:]:
                self.emitter.message(m, "node_invoked", name, now=False)
            self._stream_update("node_invoked", name, now=False)
        return goto

    async def _call_with_callbacks(self, node: Any, state: AgentState, config: dict[str, Any]) -> Any:
        """10xGraph's AI-invocation callbacks around a (non-tool) node: before_invoke may change
        the node's arguments, after_invoke its result; on_error may answer a failure with a
        Message, which becomes the node's result (the run goes on along the edges)."""
        context = CallbackContext(
            invocation_type=InvocationType.AI,
            node_name=node.name,
            function_name=getattr(node.func, "__name__", str(node.func)),
            metadata={"config": config},
        )
        input_data = node.input_data(state, config)
        try:
            input_data = await self._callbacks.execute_before_invoke(context, input_data)
            result = await node.call_with(input_data)
            return await self._callbacks.execute_after_invoke(context, input_data, result)
        except Exception as exc:
            recovery = await self._callbacks.execute_on_error(context, input_data, exc)
            if recovery is None:
                raise
            return [recovery]

    def lifecycle(self, point: str, node: str | None, kind: str | None, exec_view: ExecView) -> Any:
        """The loop reached a lifecycle point: fires the hooks (a coroutine, for the loop to
        await); returns the error message to persist at ``error`` (None keeps it)."""
        self._encoded.clear()
        return self._fire_lifecycle(point, node, kind, exec_view)

    async def _fire_lifecycle(self, point: str, node: str | None, kind: str | None, exec_view: ExecView) -> str | None:
        state = self.state
        if state is None:
            return None
        self._apply_exec(state, exec_view)
        mgr = self._callbacks
        ctx = GraphLifecycleContext(config=self.config)
        step = state.execution_meta.step
        message: str | None = None
        # The one commit between "start" and the next point is the run's input commit. 10xGraph
        # writes nothing there when the run brings no messages (a resume), so it fires no
        # on_checkpoint for it either.
        initial, self._initial_commit = self._initial_commit, point == "start"
        if point == "checkpoint" and initial and not self.input_messages:
            return None
        if point == "start":
            if self._start_effect is not None:
                # The loop prepared the run again after its optimistic input commit was refused
                # (another run took or moved the thread): the hooks ran once for this call; what
                # they changed is put on the state loaded again instead of calling them twice.
                state = self._start_effect.apply(state)
            else:
                before = _StartEffect.before(state)
                if self._resumed_node is not None:
                    state = await mgr.fire_on_resume(ctx, self._resumed_node, state, dict(self._input_data))
                state = await mgr.fire_on_graph_start(ctx, state)
                self._start_effect = before.after(state)
        elif point == "node_done":
            old = self._before_node if self._before_node is not None else state
            self._before_node = None
            state = await mgr.fire_on_state_update(ctx, node or "", old, state, step)
        elif point == "interrupt":
            state = await mgr.fire_on_interrupt(ctx, node or "", kind or "", state)
        elif point == "checkpoint":
            # The messages this commit adds; a hook may change the state, not which messages
            # are written (the Rust loop writes the context as it is).
            done, context = len(self._committed), state.context
            fresh = list(context[done:]) if context[:done] == self._committed else list(context)
            state, _ = await mgr.fire_on_checkpoint(ctx, state, fresh, False)
        elif point == "end":
            state = await mgr.fire_on_graph_end(ctx, state, self._run_messages(state), step)
        elif point == "error":
            text = str(state.execution_meta.internal_data.get("error") or "")
            error = _hook_error(text, self._node_error, node=state.execution_meta.current_node)
            state, message = await mgr.fire_on_graph_error(
                ctx, error, state, self._run_messages(state), step, state.execution_meta.current_node
            )
            if message == str(error):
                message = None  # unchanged: the loop keeps its own (fuller) message
        self._adopt(state, point)
        return message

    def _caller_message(self, state: AgentState) -> Message | None:
        """The user message a response starts with: the caller's, as sent (10xGraph's), even
        when a node replaced it in the context (RAGAgent's SYNTHESIZE); without input (a
        resume), the thread's last user message that no node of this run produced (a
        StructuredOutputAgent's repair prompt is listed in order among the produced ones)."""
        sent = next((m for m in reversed(self.input_messages) if m.role == "user"), None)
        if sent is not None:
            return sent
        produced = {id(m) for m in self.produced}
        return next((m for m in reversed(state.context) if m.role == "user" and id(m) not in produced), None)

    def _run_messages(self, state: AgentState) -> list[Message]:
        """The run's messages as 10xGraph hands them to hooks: the turn's user message, then
        what the run produced (the same list a response carries)."""
        last_user = self._caller_message(state)
        return ([last_user] if last_user is not None else []) + [m for m in self.produced if m is not last_user]

    def _adopt(self, state: Any, point: str) -> None:
        if state is self.state:
            return
        if not isinstance(state, AgentState):
            self.graph._log.warning("a lifecycle hook at %s returned %s, not a state; ignored",
                                    point, type(state).__name__, extra=self._log_fields())
            return
        self.state = state

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
        self._encoded.clear()
        result = self.graph._conditions[index](self.state)
        return result if isinstance(result, str) else bool(result)

    def snapshot(self, exec_view: ExecView, cursor_len: int, cursor_last_id: str | None) -> tuple[
        str, list[tuple[str, str]], bool, int, str | None
    ]:
        state = self.state
        assert state is not None, "prepare() runs first"
        self._apply_exec(state, exec_view)
        data = encode_state_text(state)
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
        encoded = self._encoded
        messages = [(str(m.message_id), e[1] if (e := encoded.get(id(m))) is not None and e[0] is m
                     else encode_message(m)) for m in fresh]
        encoded.clear()
        return data, messages, not grown, n, (str(ctx[-1].message_id) if n else None)

    # -- tool nodes (the Rust handler drives these) -----------------------------------------

    def begin_tools(self, name: str, exec_view: ExecView) -> tuple[Any, list[tuple[Any, str, str]], bool]:
        self._encoded.clear()
        state = self.state
        assert state is not None, "prepare() runs first"
        self._apply_exec(state, exec_view)
        events = self.events
        if events is not None:
            events.node_start(name, state.execution_meta.step)
            events.tools_begun(name)
        if self.has_lifecycle_hooks:
            self._before_node = state.model_copy(deep=True)
        try:
            step = ToolStep.begin(name, self.nodes[name].func, state)
        except Exception as exc:
            if events is not None:
                events.node_error(name, state.execution_meta.step, exc)
            raise
        step.callbacks = self._callbacks
        step.ledger = (self.graph._checkpointer._native, str(self.config["thread_id"]), str(self.config["user_id"]))
        self._tool_steps[name] = step
        if self.emitter is not None:
            self._stream_update("invoking_node", name, now=True)
        origin = step.origin_id
        if not isinstance(origin, (str, int)) or isinstance(origin, bool):
            origin = None if origin is None else str(origin)
        tools = step.tool_node
        fresh = step.origin_id in self._fresh_ids
        self._fresh_ids.discard(step.origin_id)  # a second tool node on it looks up
        # The ids keep their Python types (123 and "123" are different ledger keys):
        # (origin, [(call id, name, side effects), ...], fresh)
        calls = [(c.raw_id, c.name, tools.side_effects(c.name)) for c in step.calls]
        return None if origin == "" else origin, calls, fresh

    def accept_replay(self, name: str, index: int, envelope_json: str) -> bool:
        # Called from a Rust thread, outside the run's context: its log fields are set here.
        with log_fields(**self._log_fields(node=name)):
            step = self._tool_steps[name]
            accepted = step.accept_replay(index, envelope_json)
            if accepted and self.events is not None:
                call = step.calls[index]
                self.events.tool_start(name, index, call.call_id, call.name, call.arguments, True)
                self.events.tool_end(name, index, call.call_id, call.name, call.arguments, step.replays[index], True)
            return accepted

    async def run_tool(self, name: str, index: int, idempotency_key: str | None,
                       ledger_key: str | None = None) -> tuple[str, bool, bool]:
        config = dict(self.config, _node_name=name)
        if self.emitter is not None:  # a streamed run: tools may emit progress chunks (StreamEmitter)
            config["_tenx_stream"] = (self.emitter.queue, self.emitter.loop)
        step = self._tool_steps[name]
        events = self.events
        call = step.calls[index]
        if events is not None:
            events.tool_start(name, index, call.call_id, call.name, call.arguments, False)
        with log_fields(node=name, tool=step.calls[index].name):
            out = await step.run(index, config, idempotency_key, ledger_key)
        if events is not None:
            message = step.message_of(index, out[0])
            if not _is_remote_call(message):
                events.tool_end(name, index, call.call_id, call.name, call.arguments, message, False,
                                error=message.text() or "tool error" if out[2] else None)
        if self.emitter is not None:
            step.pending_stream[index] = out[0]
        return out

    def unknown_outcome(self, name: str, index: int, idempotency_key: str | None) -> tuple[str, bool, bool] | None:
        """An at-most-once call found started but never completed (see ToolStep.unknown): None
        runs it again, else its answer as a tool result ``(envelope, record, is_error)``."""
        out = self._tool_steps[name].unknown(index, idempotency_key)
        if self.emitter is not None and out is not None:
            self._tool_steps[name].pending_stream[index] = out[0]
        return out

    def tool_settled(self, name: str, index: int) -> None:
        """The call's result is in the ledger (or needs no record): stream it now."""
        step = self._tool_steps.get(name)
        if self.emitter is None or step is None or index not in step.pending_stream:
            return
        message = step.message_of(index, step.pending_stream.pop(index))
        self.emitter.message(message, "tool_result", name, now=True)
        step.streamed.add(index)

    def finish_tools(self, name: str, items: list[tuple[str, str]]) -> str | NodeResult | None:
        step = self._tool_steps.pop(name)
        # The messages made here are new objects nobody else holds; without hooks, events or a
        # stream, nothing of the user's sees them before the step's snapshot.
        quiet = not self.has_lifecycle_hooks and self.events is None and self.emitter is None
        messages = step.finish(items, self._encoded if quiet else None)
        state = self.state
        assert state is not None
        # Calls the client runs: their placeholders go back to the caller, not into the context,
        # and the run pauses after this node until the client sends the results.
        remote = [m for m in messages if _is_remote_call(m)]
        if remote:
            messages = [m for m in messages if not _is_remote_call(m)]
        goto = handoff_target(step)
        self._index.append(state, messages)
        self.produced.extend(messages)
        _clear_answers(state)
        events = self.events
        if events is not None:
            by_call = {m.metadata.get("tool_call_id"): m for m in messages}
            for index, call in enumerate(step.calls):
                kind, payload = items[index]
                if kind in ("timeout", "failed"):
                    events.tool_end(name, index, call.call_id, call.name, call.arguments, by_call.get(call.call_id),
                                    False, error=str(payload))
                elif not (remote and any(_remote_id(m) == call.call_id for m in remote)):
                    events.tool_end(name, index, call.call_id, call.name, call.arguments, by_call.get(call.call_id),
                                    kind == "replayed")
            events.node_end(name, state.execution_meta.step, messages, goto)
        if self.emitter is not None:
            for index, m in enumerate(messages):
                if index not in step.streamed:  # replayed from the ledger, timed out or failed
                    self.emitter.message(m, "tool_result", name, now=False)
            self._stream_update("node_invoked", name, now=False)
        if remote:
            self.remote_calls = remote
            return NodeResult(goto, REMOTE_TOOL_REASON)
        return goto

    # -- results ---------------------------------------------------------------------------

    def response(self, granularity: str) -> dict[str, Any]:
        state = self.state
        assert state is not None
        messages: list[Message] = []
        last_user = self._caller_message(state)
        if last_user is not None:
            messages.append(last_user)
        messages.extend(m for m in self.produced if m is not last_user)
        messages.extend(self.remote_calls)
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
        new: list[Message] = []
        if result is None:
            # 10xGraph 0.10 refuses it too; silently accepting it hid a forgotten `return`.
            raise ValueError(
                "the node returned None: return a str, a Message, a list of them, the state, or a "
                "Command (Command(update=None) changes nothing)"
            )
        if isinstance(result, Command):
            goto = result.goto
            if result.state is not None:
                result_state = _require_state(result.state)
                # The messages the node added to the state it hands over are its output, like
                # those of a returned state: reported by invoke and streamed.
                new = _added(result_state, pre_len, pre_last)
                self.state = state = result_state
            result = result.update
        if isinstance(result, AgentState):
            if result is not state:
                self.state = result
            new = _added(result, pre_len, pre_last)
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
            self._index.append(target, new, self._fresh_ids)
        self.produced.extend(m for m in new if not m.delta)
        return goto

    @staticmethod
    def _apply_exec(state: AgentState, view: ExecView) -> None:
        """Mirrors the loop's execution metadata (owned by the Rust engine) into the live state
        before user code or a snapshot sees it."""
        # Assigning a pydantic field runs Python code (BaseModel.__setattr__); between two calls
        # of one run most of these are unchanged, so only the changed ones are assigned.
        em = state.execution_meta
        have = em.__dict__
        for name in _EXEC_FIELDS:
            value = getattr(view, name)
            if have.get(name) != value:
                setattr(em, name, value)
        status = view.status
        if have.get("status") != status:
            em.status = ExecutionStatus(status)
        stop = view.stop_current_execution
        if have.get("stop_current_execution") != stop:
            em.stop_current_execution = StopRequestStatus(stop)
        if view.error is not None:
            em.internal_data["error"] = view.error


# The ExecView fields mirrored as they are (status and stop are enums, converted).
_EXEC_FIELDS = ("current_node", "step", "interrupted_node", "interrupt_reason", "interrupt_data", "thread_id")


def _added(state: AgentState, pre_len: int, pre_last: Any) -> list[Message]:
    """The messages appended to ``state.context`` since it had ``pre_len`` ending in ``pre_last``
    (none when the node rewrote its context: the next snapshot stores it whole)."""
    ctx = state.context
    if len(ctx) >= pre_len and (pre_len == 0 or ctx[pre_len - 1].message_id == pre_last):
        return list(ctx[pre_len:])
    return []


def _is_remote_call(m: Message) -> bool:
    return any(isinstance(b, RemoteToolCallBlock) for b in m.content)


def _remote_id(m: Message) -> str | None:
    return next((b.id for b in m.content if isinstance(b, RemoteToolCallBlock)), None)


def _hook_error(text: str, raised: BaseException | None, node: str) -> Exception:
    """The error on_graph_error is given: for a node that raised, the NodeError the caller gets
    (10xGraph hands its hooks that wrapped error too), made without logging it a second time;
    for a failure of the loop itself (timeout, recursion limit, routing), an Exception with the
    loop's message."""
    if isinstance(raised, Exception) and text.startswith("Error in node"):
        from tenxgraph.core.exceptions import NodeError, _restore

        error = _restore(NodeError, text)
        assert isinstance(error, NodeError)
        error.message, error.error_code = text, "NODE_001"
        error.context = {"node_name": node, "error_type": type(raised).__name__}
        error.__cause__ = raised
        return error
    return Exception(text)


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
    """A deep copy: a dump and a validation, half the time of ``model_copy(deep=True)``. Called
    on pydantic-core's serializer and validator directly: ``model_dump`` / ``model_validate`` are
    Python wrappers that only pass their defaults on."""
    out = type(m).__pydantic_validator__.validate_python(m.__pydantic_serializer__.to_python(m, round_trip=True))
    if isinstance(m.parsed_content, BaseModel):  # structured output stays the caller's model class
        out.parsed_content = m.parsed_content.model_copy(deep=True)
    return out


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
