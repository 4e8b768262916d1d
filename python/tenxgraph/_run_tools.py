"""Tool nodes as the Rust handler drives them: ``begin_tools`` parses the calls, ``run_tool`` runs
one inside the replay-safe handler, ``accept_replay`` / ``unknown_outcome`` answer from the ledger,
``finish_tools`` turns the results into the node's messages."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING, Any

from tenxgraph import _async_calls
from tenxgraph._core import NodeResult
from tenxgraph._run_values import clear_answers
from tenxgraph._tool_step import ToolStep
from tenxgraph.core.exceptions import ThreadBusyError
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.execution_state import ExecutionStatus
from tenxgraph.core.state.message import Message, generate_id
from tenxgraph.core.state.message_block import RemoteToolCallBlock, ToolResultBlock
from tenxgraph.logs import NOT_RECORDED_EVENT, NOT_RECORDED_MESSAGE, log_fields, run_logger
from tenxgraph.prebuilt.tools.handoff import handoff_target
from tenxgraph.utils.interrupt import GraphInterrupt

if TYPE_CHECKING:
    from tenxgraph._context_index import ContextIndex
    from tenxgraph._core import ExecView
    from tenxgraph.core.graph.compiled_graph import CompiledGraph
    from tenxgraph.utils.callbacks import CallbackManager

__all__ = ["REMOTE_TOOL_REASON", "RunTools", "at_remote_pause", "check_waiting_calls", "renamed_remote_results",
           "unanswered_calls"]

_log = run_logger("tenxgraph.tools")
# How long a cancelled run waits for its tool tasks to unwind before recording what finished.
_UNWIND_SECONDS = 5.0
# The bound of each ledger write made on the way out (cancelled runs, late results): the comment
# of record_finished_tools promised "each write is bounded", which only the store's own
# deadlines made true (none on Postgres).
_RECORD_SECONDS = 10.0

# 10xGraph's execution_meta.interrupt_reason while a tool node waits for the client's results.
REMOTE_TOOL_REASON = "remote_tool_call"
# The failed state of a routing error out of a committed node (the engine's ROUTING_FAILED_REASON).
ROUTING_FAILED_REASON = "routing_failed"


class _LeaseRanOut(BaseException):
    """A call was to start after its run's lease may have run out: not started. Not an
    Exception, so no tool-error handling takes it; the Rust handler renews the lease and hands
    the call over again, or, when a newer holder has the thread, ends the run fenced."""


class RunTools:
    """The tool-node part of ``tenxgraph._runtime.Run`` (which sets these attributes)."""

    graph: CompiledGraph[Any]
    nodes: dict[str, Any]
    config: dict[str, Any]
    state: AgentState | None
    produced: list[Message]
    remote_calls: list[Message]
    emitter: Any
    events: Any
    has_lifecycle_hooks: bool
    # The run only closes a failed tool node (CompiledGraph._close_failed_tools).
    closing_failed_tools: bool
    _callbacks: CallbackManager
    _tool_steps: dict[str, ToolStep]
    _index: ContextIndex
    _fresh_ids: set[Any]
    _after_unfinished: bool
    _before_node: AgentState | None
    _encoded: dict[int, tuple[Message, str]]
    # (ledger key, envelope) of every recordable result a tool of this run returned: the Rust
    # handler records each (at once, or in the step's transaction), but a run whose await is
    # cancelled drops that work with its future (see record_finished_tools).
    _finished: list[tuple[str, str]]
    _tools_cut: bool
    _node_step: int | None
    _node_in_flight: bool
    # The asyncio tasks running this run's tool calls (run_tool), while they run.
    _tool_tasks: set[asyncio.Task[Any]]
    # The ledger keys of the calls whose run_tool began: a call the Rust core handed over whose
    # task the run's drop cancelled before it began never ran (see _core.release_abandoned).
    entered: set[str]

    if TYPE_CHECKING:  # Run's own

        def _log_fields(self, **more: str) -> dict[str, str]: ...

        def _apply_exec(self, state: AgentState, view: ExecView) -> None: ...

        def _stream_update(self, status: str, node: str, *, now: bool) -> None: ...

        def _undo_node_changes(self) -> None: ...

    def begin_tools(self, name: str, exec_view: ExecView) -> tuple[Any, list[tuple[Any, str, str]], bool]:
        self._encoded.clear()
        state = self.state
        assert state is not None, "prepare() runs first"
        self._apply_exec(state, exec_view)
        self._node_step = state.execution_meta.step  # what _undo_node_changes puts back is this node's start
        events = self.events
        if events is not None:
            events.node_start(name, state.execution_meta.step)
            events.tools_begun(name)
        if self.has_lifecycle_hooks:
            self._before_node = state.model_copy(deep=True)
        try:
            step = ToolStep.begin(name, self.nodes[name].func, state)
        except Exception as exc:
            if self.closing_failed_tools and getattr(exc, "error_code", None) == "NODE_002" \
                    and _calls_all_answered(state.context):
                # Closing a failed tool node whose calls were answered already (the node ran and
                # what failed came after it, e.g. the routing out of it): nothing to answer. Calls
                # left without results (10xGraph's wedge: a user message after them) are not
                # closed over: the thread stays failed, with the node's own error.
                step = ToolStep(name, self.nodes[name].func, None, [], state, None)
            else:
                if events is not None:
                    events.node_error(name, state.execution_meta.step, exc)
                raise
        step.callbacks = self._callbacks
        step.agents = self.graph._agent_nodes
        index = self._index
        step.id_in_context = lambda mid: mid in index.ids(state.context)
        step.ledger = (self.graph._checkpointer._native, str(self.config["thread_id"]), str(self.config["user_id"]))
        self._tool_steps[name] = step
        # The node runs again from its start on a retry, as any node does: a finished call is
        # answered from the ledger with the changes recorded with its result, the others run
        # again. So a failure, node_timeout or stop() stores the state the node started from (a
        # sole call that takes the state works on the live state, and its change was stored
        # and made again by the retry: session 37), also if it fails after merging branches.
        self._node_in_flight = True
        if self.emitter is not None:
            self._stream_update("invoking_node", name, now=True)
        origin = step.origin_id
        if not isinstance(origin, (str, int)) or isinstance(origin, bool):
            origin = None if origin is None else str(origin)
        tools = step.tool_node
        # Only where the thread's latest row is a finished turn (or there is none): a run before
        # this one may have recorded results under ids a node of this run makes again (a model
        # that derives its ids, a cached response) without committing the message
        # (durable_checkpoint_every_step=False, or a kill before the step's commit), and the
        # skipped lookup fired a recorded charge again. Not only for a takeover of a `running`
        # row: a takeover that failed in the model (`error`) or paused again at a gate
        # (`interrupted_before`) committed without the message too (red-teams, session 43).
        fresh = step.origin_id in self._fresh_ids and not self._after_unfinished
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

    def run_tool(self, name: str, index: int, idempotency_key: str | None, ledger_key: str | None = None,
                 lease_left: float | None = None) -> Any:
        """The coroutine the Rust handler runs as call ``index``'s task. ``lease_left``: seconds,
        from now, the run surely holds the thread; the call does not start after that (a task
        queued when the process froze past its lease starts when it thaws, after a newer holder
        may have run and recorded the same call)."""
        start_by = None if lease_left is None else time.monotonic() + lease_left
        return self._run_tool(name, index, idempotency_key, ledger_key, start_by)

    async def _run_tool(self, name: str, index: int, idempotency_key: str | None, ledger_key: str | None,
                        start_by: float | None) -> tuple[str, bool, bool]:
        if start_by is not None and time.monotonic() >= start_by:
            raise _LeaseRanOut(f"the run's lease may have run out before tool call {index} of {name!r} started")
        if ledger_key is not None:
            self.entered.add(ledger_key)
        config = dict(self.config, _node_name=name)
        if self.emitter is not None:  # a streamed run: tools may emit progress chunks (StreamEmitter)
            config["_tenx_stream"] = (self.emitter.queue, self.emitter.loop)
        step = self._tool_steps[name]
        events = self.events
        call = step.calls[index]
        if events is not None:
            events.tool_start(name, index, call.call_id, call.name, call.arguments, False)
        # An async call of this store and idempotency key still running in this process (an
        # earlier attempt that ignored its cancellation): waited for, its result taken.
        flight_key = (step._flight_key(idempotency_key) if ledger_key is not None and idempotency_key
                      and not step.tool_node.is_sync(call.name) else None)
        mine, adopted = None, None
        while flight_key is not None:
            mine, earlier = _async_calls.start(flight_key)
            if earlier is None:
                break
            _log.info("async tool call still running from an earlier attempt: waiting for it, not starting it again",
                      extra={"tool": call.name, "ledger_key": ledger_key, "event": "async_tool_joined"})
            envelope = await _async_calls.wait(earlier)
            adopted = step.adopt(index, envelope) if envelope is not None else None
            if adopted is not None:
                break
        task = asyncio.current_task()
        if task is not None and adopted is None:
            self._tool_tasks.add(task)
        try:
            with log_fields(node=name, tool=step.calls[index].name):
                out = adopted if adopted is not None else await step.run(index, config, idempotency_key, ledger_key)
        except BaseException as exc:
            if isinstance(exc, GraphInterrupt) and step.baseline is None:
                # The call paused, and worked on the live state (the node's only call, or no call
                # takes state): what it changed before interrupt() is not the node's result.
                self._undo_node_changes()
            # Cut off after the tool returned (a cancel or a Ctrl-C in an after_invoke callback,
            # or while its value became its message): still a finished call, recorded as the tool
            # returned it once the run unwinds (record_finished_tools).
            salvaged = self._salvage(step, index, ledger_key)
            if mine is not None:
                _async_calls.finish(flight_key, mine, salvaged)
            raise
        finally:
            if task is not None:
                self._tool_tasks.discard(task)
        step.cut_off.pop(index, None)
        if out[1] and ledger_key is not None:
            self._finished.append((ledger_key, out[0]))
            if task is not None and task.cancelling():
                # The run stopped waiting for this call (tool_timeout, node_timeout, stop()), the
                # tool swallowed its cancellation and returned: its side effect happened and
                # nobody else will record it. Recorded now, as a sync tool's late result is, so
                # a resume answers it from the ledger instead of firing it again.
                await self._record_late_async(ledger_key, out[0])
        if mine is not None:
            _async_calls.finish(flight_key, mine, out[0] if out[1] else None)
        if events is not None:
            message = step.message_of(index, out[0])
            if not is_remote_call(message):
                events.tool_end(name, index, call.call_id, call.name, call.arguments, message, False,
                                error=message.text() or "tool error" if out[2] else None)
        if self.emitter is not None:
            step.pending_stream[index] = out[0]
        return out

    def returned_when_cut(self, name: str, index: int) -> tuple[str, bool, bool] | None:
        """The engine cut call ``index`` off at its tool_timeout: its result if it had returned
        (see ToolStep.returned), which the engine records and the model gets."""
        step = self._tool_steps.get(name)
        if step is None:
            return None
        try:
            return step.returned(index)
        except Exception as exc:  # noqa: BLE001 - then it is a timeout as before, and the alert says why
            _log.error(NOT_RECORDED_MESSAGE, extra={"event": NOT_RECORDED_EVENT, "tool": step.calls[index].name,
                                                    "error": f"it returned before its timeout, but its value could "
                                                             f"not be kept: {exc}"})
            return None

    def tools_cut(self, name: str) -> None:
        """The engine dropped tool node ``name`` while it ran (see ``cut_off_tools``)."""
        self._tools_cut = True

    def cut_off_tools(self) -> bool:
        """Whether the engine dropped a tool node of this run while it ran (node_timeout, stop(),
        a lost lease: the node's future goes, with any ledger write still in flight). A call cut
        by its own tool_timeout is not one: the engine kept what it returned (returned_when_cut),
        and a tool that ignores its cancellation records its late result itself, so the run's
        return does not wait for it."""
        return self._tools_cut

    def _salvage(self, step: ToolStep, index: int, ledger_key: str | None) -> str | None:
        """The envelope of a call cut off after it returned, queued for the record; None."""
        if ledger_key is None:
            step.cut_off.pop(index, None)
            return None
        try:
            salvaged = step.salvaged(index, ledger_key)
            if salvaged is None:
                return None
            envelope, record = salvaged
        except Exception as exc:  # noqa: BLE001 - the side effect happened: the alert line says so
            _log.error(NOT_RECORDED_MESSAGE, extra={"ledger_key": ledger_key, "event": NOT_RECORDED_EVENT,
                                                    "error": f"its run was cut off and its value could not be kept: {exc}"})
            return None
        if not record:
            return None
        self._finished.append((ledger_key, envelope))
        return envelope

    async def _record_late_async(self, key: str, envelope: str) -> None:
        native = self.graph._checkpointer._native
        thread_id, user_id = str(self.config["thread_id"]), str(self.config["user_id"])
        try:
            inserted = await asyncio.wait_for(native.ledger_put(thread_id, user_id, key, envelope, late=True), _RECORD_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the side effect happened: the alert line says so
            _log.error(NOT_RECORDED_MESSAGE, extra={"ledger_key": key, "event": NOT_RECORDED_EVENT,
                                                    "error": f"late result of an async tool that ignored its cancellation: {exc}"})
            return
        if inserted:
            _log.warning("async tool call ignored its cancellation and finished after its run stopped waiting; its "
                         "result is recorded in the ledger, and a resume answers from it",
                         extra={"ledger_key": key, "event": "async_tool_late_result_recorded"})

    async def record_finished_tools(self) -> None:
        """Called when the run's await is cancelled (a client's timeout, ``task.cancel()``, a
        stream closed, the loop ending): the Rust future is dropped on the spot, and with it the
        ledger write of a tool that had already returned (a result not yet polled, its own commit
        in flight, or the step's transaction that was to carry it). Those results are written
        here before the cancellation reaches the caller, so a retry answers them from the ledger
        instead of firing the tools again. First result wins: a row the handler did write stays.
        Unfenced, like a sync tool's late result: the side effect happened, whoever holds the
        thread now.

        The tool tasks the dropped future cancelled unwind first (bounded), so a call cut off
        after it returned is on the list. The caller is held until the writes are done, also
        when cancelled again: a retry it starts at once must find them."""
        native = self.graph._checkpointer._native
        thread_id, user_id = str(self.config["thread_id"]), str(self.config["user_id"])

        async def put_all() -> None:
            unwinding = [t for t in self._tool_tasks if not t.done()]
            if unwinding:
                await asyncio.wait(unwinding, timeout=_UNWIND_SECONDS)
            pending, self._finished = self._finished, []
            for key, envelope in pending:
                try:
                    if await asyncio.wait_for(native.ledger_put(thread_id, user_id, key, envelope, late=True), _RECORD_SECONDS):
                        _log.warning("tool call finished before its run was cancelled; its result is recorded "
                                     "in the ledger, and a resume answers from it",
                                     extra={"ledger_key": key, "event": "tool_result_recorded_after_cancel"})
                except Exception as exc:  # noqa: BLE001 - the side effect happened: the alert line says so
                    _log.error(NOT_RECORDED_MESSAGE, extra={"ledger_key": key, "event": NOT_RECORDED_EVENT,
                                                            "error": f"after the run was cancelled: {exc}"})

        if not self._finished and not self._tool_tasks:
            return
        task = asyncio.ensure_future(put_all())
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                pass  # cancelled again: still held until the results are on record (each write is bounded)

    def unknown_outcome(self, name: str, index: int, idempotency_key: str | None,
                        retries_spent: int = 0) -> tuple[str, bool, bool] | None:
        """An at-most-once call found started but never completed (see ToolStep.unknown): None
        runs it again, else its answer as a tool result ``(envelope, record, is_error)``."""
        out = self._tool_steps[name].unknown(index, idempotency_key, retries_spent)
        if self.emitter is not None and out is not None:
            self._tool_steps[name].pending_stream[index] = out[0]
        return out

    def tool_settled(self, name: str, index: int) -> None:
        """The call's result is in the ledger (or needs no record): stream it now."""
        step = self._tool_steps.get(name)
        if self.emitter is None or step is None or index not in step.pending_stream:
            return
        message = step.message_of(index, step.pending_stream.pop(index))
        self.emitter.tool_message(message, name, step.calls[index], now=True)
        step.streamed.add(index)

    def finish_tools(self, name: str, items: list[tuple[str, str | None]]) -> str | NodeResult | None:
        step = self._tool_steps.pop(name)
        # The messages made here are new objects nobody else holds; without hooks, events or a
        # stream, nothing of the user's sees them before the step's snapshot.
        quiet = not self.has_lifecycle_hooks and self.events is None and self.emitter is None
        messages = step.finish(items, self._encoded if quiet else None)
        state = self.state
        assert state is not None
        # Calls the client runs: their placeholders go back to the caller, not into the context,
        # and the run pauses after this node until the client sends the results.
        remote = [m for m in messages if is_remote_call(m)]
        # Each message's call, by position before the placeholders are taken out.
        local = [i for i, m in enumerate(messages) if not is_remote_call(m)]
        if remote:
            messages = [messages[i] for i in local]
        goto = handoff_target(step)
        if self.emitter is not None:
            # Held for the step's commit, and made before the live state changes: a chunk that
            # could not be made fails the node with the state as it was before it.
            for index, m in zip(local, messages, strict=True):
                if index not in step.streamed:  # replayed from the ledger, timed out or failed
                    self.emitter.tool_message(m, name, step.calls[index], now=False)
        self._index.append(state, messages)
        self.produced.extend(messages)
        clear_answers(state)
        events = self.events
        if events is not None:
            by_call = {m.metadata.get("tool_call_id"): m for m in messages}
            for index, call in enumerate(step.calls):
                kind, payload = items[index]
                if kind in ("timeout", "failed"):
                    events.tool_end(name, index, call.call_id, call.name, call.arguments, by_call.get(call.call_id),
                                    False, error=str(payload))
                elif not (remote and any(remote_id(m) == call.call_id for m in remote)):
                    events.tool_end(name, index, call.call_id, call.name, call.arguments, by_call.get(call.call_id),
                                    kind == "replayed")
            events.node_end(name, state.execution_meta.step, messages, goto)
        if self.emitter is not None:
            self._stream_update("node_invoked", name, now=False)
        self._node_in_flight = False  # the node's step commits what it changed
        if remote:
            self.remote_calls = remote
            return NodeResult(goto, REMOTE_TOOL_REASON)
        return goto


def is_remote_call(m: Message) -> bool:
    return any(isinstance(b, RemoteToolCallBlock) for b in m.content)


def remote_id(m: Message) -> str | None:
    return next((b.id for b in m.content if isinstance(b, RemoteToolCallBlock)), None)


def _calls_all_answered(context: list[Any]) -> bool:
    """Whether every call of the last message that asked for tools has a tool result after it."""
    return not unanswered_calls(context)


def unanswered_calls(context: list[Any]) -> list[str]:
    """The ids of the calls of the last message that asked for tools with no tool result after
    it, in call order."""
    for i in range(len(context) - 1, -1, -1):
        calls = context[i].tools_calls
        if calls:
            answered = _result_ids(context[i + 1:])
            return [cid for cid in (str(c.get("id")) for c in calls if isinstance(c, dict)) if cid not in answered]
    return []


def _result_ids(messages: list[Any]) -> set[str]:
    return {str(b.call_id) for m in messages if m.role == "tool" for b in m.content if isinstance(b, ToolResultBlock)}


def _refuse_answered_again(state: Any, given: set[str], thread_id: str) -> None:
    """Results sent for calls the thread has answered already (a client's retry of its results
    after a lost response): a second answer to one call, which went in as a new turn and had the
    model answer twice."""
    again = sorted(given & _result_ids(state.context))
    if again:
        raise ThreadBusyError(
            f"Thread {thread_id!r} has results for tool call(s) {', '.join(map(repr, again))} already: the "
            "results sent would answer them a second time. Nothing was written.",
            "STORAGE_BUSY_001",
            {"thread_id": thread_id, "answered_already": again},
        )


def _refuse_never_asked(state: Any, given: set[str], thread_id: str) -> None:
    """Results that lead the input for calls no message of the thread asked for (a client's
    results sent to the wrong thread, or after its thread was deleted): stored as a new turn, a
    tool message answering no call, which every provider refuses on each later turn (red-team,
    session 36; 10xGraph takes it). At a pause for the client's tools they were refused already."""
    asked = {str(c.get("id")) for m in state.context for c in (m.tools_calls or []) if isinstance(c, dict)}
    unknown = sorted(given - asked)
    if unknown:
        raise ThreadBusyError(
            f"Thread {thread_id!r} never asked for tool call(s) {', '.join(map(repr, unknown))}: results for them "
            "would answer no call, a history every provider refuses. Send them to the thread that asked. "
            "Nothing was written.",
            "STORAGE_BUSY_001",
            {"thread_id": thread_id, "unknown": unknown},
        )


def renamed_remote_results(sent: list[Message], stored_ids: Any) -> list[Message]:
    """At a pause for the client's tools, a result message under an id the thread holds already
    (a client that names its result messages the same way each time, or reuses another message's
    id) was merged away as stored, and the run went on with the call unanswered. Such a result
    gets a new id, as a tool's own result message under a taken id does."""
    out = list(sent)
    for i, m in enumerate(out):
        if m.role != "tool":
            break
        if m.message_id in stored_ids:
            out[i] = m.model_copy(update={"message_id": generate_id(None)})
    return out


def at_remote_pause(state: Any) -> bool:
    """The thread waits for the client's results of its remote tool calls."""
    meta = state.execution_meta
    return meta.status == ExecutionStatus.INTERRUPTED_AFTER and meta.interrupt_reason == REMOTE_TOOL_REASON


def check_waiting_calls(state: Any, sent: list[Message], thread_id: str) -> None:
    """At a pause for the client's tools, what comes in must be the client's results: a tool
    message for every call still waiting, before anything else it sends. Anything else (a user
    message, a bare ``{}``, results for other ids or for some of the calls only) went on past the
    tool node with calls unanswered, a history every provider refuses from then on (10xGraph
    0.10 takes it too). Refused as new input while tool calls wait is, ``ThreadBusyError``
    STORAGE_BUSY_001, before anything is written; so are results, anywhere, for calls the thread
    has answered already, and new messages for a thread that failed routing out of a node whose
    tool calls wait for results (``{}`` routes on first)."""
    lead = []
    for m in sent:
        if m.role != "tool":
            break
        lead.append(m)
    meta = state.execution_meta
    if meta.status == ExecutionStatus.ERROR and meta.interrupt_reason == ROUTING_FAILED_REASON and sent:
        waiting = unanswered_calls(state.context)
        if waiting:
            # The node that failed routing asked for tools: a new turn would run it again and
            # leave these calls unanswered for good; `{}` routes on from it and runs them.
            raise ThreadBusyError(
                f"Thread {thread_id!r} failed routing out of node {meta.current_node!r}, whose tool call(s) "
                f"{', '.join(map(repr, waiting))} wait for results: finish it with ainvoke({{}}, config) (it routes "
                "again, running nothing twice), then send the new input. Nothing was written.",
                "STORAGE_BUSY_001",
                {"thread_id": thread_id, "node": meta.current_node, "waiting_for": waiting},
            )
    if not at_remote_pause(state):
        if lead:
            given = _result_ids(lead)
            _refuse_answered_again(state, given, thread_id)
            _refuse_never_asked(state, given, thread_id)
        return
    waiting = unanswered_calls(state.context)
    if not waiting:
        return
    counted = collections.Counter(str(b.call_id) for m in lead for b in m.content if isinstance(b, ToolResultBlock))
    twice = sorted(c for c, n in counted.items() if n > 1)
    if twice:
        # Both were stored: the call answered twice, a history providers refuse.
        raise ThreadBusyError(
            f"Thread {thread_id!r} waits for one result per tool call; the results sent answer "
            f"{', '.join(map(repr, twice))} more than once. Nothing was written.",
            "STORAGE_BUSY_001",
            {"thread_id": thread_id, "node": meta.current_node, "answered_twice": twice},
        )
    given = _result_ids(lead)
    missing = [c for c in waiting if c not in given]
    stray = sorted(given - set(waiting))
    if not missing and not stray:
        return
    what = (f"it has no result for {', '.join(map(repr, missing))}" if missing
            else f"{', '.join(map(repr, stray))} answer(s) no call the thread waits for")
    raise ThreadBusyError(
        f"Thread {thread_id!r} waits at node {meta.current_node!r} for the client's results of tool call(s) "
        f"{', '.join(map(repr, waiting))}; send them first, as tool messages: {what}. Nothing was written.",
        "STORAGE_BUSY_001",
        {"thread_id": thread_id, "node": meta.current_node, "waiting_for": waiting, "missing": missing,
         "unknown": stray},
    )
