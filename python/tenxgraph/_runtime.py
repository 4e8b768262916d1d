"""The Python half of one run: the live pydantic state and what the Rust loop asks of it.

The Rust engine owns the loop (routing, steps, limits, commits, timeouts, stop). It calls back
into a ``Run`` for the parts that are Python by nature: building the state, calling a node and
turning its return value into state and messages, evaluating a condition, and dumping what a step
must persist. Only the node's new messages are dumped per step, so a step's cost does not grow
with the thread's history.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from tenxgraph import _node_context, _turn_request as turn_request
from tenxgraph._cold_load import validate_stored_state
from tenxgraph._context_index import ContextIndex
from tenxgraph._run_hooks import NOT_MERGED, RunHooks
from tenxgraph._message_ids import (
    ThreadCopies,
    as_thread_copies,
    id_type_of,
    keep_prototype_copies,
    name_prototype_copies,
    prototype_copies,
)
from tenxgraph._run_input import RunInput, stored_as_sent
from tenxgraph._run_remote_tools import keep_remote_tools, mark_remote_turn, use_remote_tools
from tenxgraph._run_tools import RunTools, at_remote_pause, check_waiting_calls, renamed_remote_results
from tenxgraph._run_values import (
    added,
    clear_answers,
    copy_update_value,
    input_messages,
    copy_message,
    refuse_id_twins,
    require_state,
    state_update,
    to_message,
    token_usage,
)
from tenxgraph._state_codec import (
    STATE_META_KEY,
    encode_message_shaped,
    encode_state,
    encode_state_meta,
    encode_state_shaped,
)
from tenxgraph._tool_step import ToolStep
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.execution_state import ExecutionStatus, StopRequestStatus
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.reducers import REMOVE_ALL_MESSAGES, RemoveMessage
from tenxgraph.logs import log_fields
from tenxgraph.utils.callbacks import CallbackContext, InvocationType
from tenxgraph.utils.command import Command
from tenxgraph.utils.constants import END
from tenxgraph.utils.interrupt import (
    RESUME_ANSWERS_KEY,
    GraphInterrupt,
    activate,
    deactivate,
)

if TYPE_CHECKING:
    from tenxgraph._core import ExecView, RunOptions
    from tenxgraph._live_states import Held
    from tenxgraph._run_hooks import StartEffect
    from tenxgraph.core.graph.compiled_graph import CompiledGraph

__all__ = ["Run", "STATE_META_KEY", "encode_state", "encode_state_meta", "stored_as_sent"]

# How JSON writes U+0000, which Postgres stores as U+FFFD (see Run.reshaped).
_NUL = "\\u0000"


class Run(RunInput, RunHooks, RunTools):
    """One ``ainvoke`` call. Not reused across calls."""

    def __init__(self, graph: CompiledGraph[Any], config: dict[str, Any], input_data: dict[str, Any]) -> None:
        self.graph = graph
        # The nodes and the topology this run drives, taken together (see override_node).
        self.nodes = graph._nodes
        self.native = graph._native
        self.config = config
        self.input_messages = input_messages(input_data)
        # As sent: `prepare` may run twice (a start refused on a kept head prepares again from a
        # read), and its merge renames messages in `input_messages` for the state it merges into.
        self._sent_messages = list(self.input_messages)
        self._sent_remote_tools = config.get("remote_tools")  # the same: see use_remote_tools
        self.state_update = state_update(input_data)
        start = input_data.get("state", {}).get("current_node") if isinstance(input_data.get("state"), dict) else None
        if start is not None and not isinstance(start, str):
            raise ValueError("input_data['state']['current_node'] must be a node name")
        self.start_node: str | None = start
        self.state: AgentState | None = None
        self.has_resume = isinstance(input_data, dict) and "resume" in input_data
        self.resume_value = input_data.get("resume") if self.has_resume else None
        # The question the answer is for (``pending_interrupt(state).id`` as the client read it):
        # with it, an answer that arrives after its question was answered (a client's retry after
        # a lost response, a second worker given the same request) is refused instead of being
        # taken as the answer to whatever the thread waits at by then.
        self.resume_for = input_data.get("interrupt_id") if self.has_resume else None
        self.produced: list[Message] = []
        # The thread was finished and the input asked to finish it: nothing runs, and the
        # response (ainvoke) or the stream (astream) is the stored last turn.
        self.answered_from_store = False
        self._tool_steps: dict[str, ToolStep] = {}
        self._index = ContextIndex()
        # The thread's copies of the prototype's messages, by prototype id (see _message_ids).
        self._proto_copies = ThreadCopies({})
        # Ids of messages a node of this run added to the context, new to it, that no tool node
        # has acted on yet: a tool node on such a message skips the ledger lookup (nothing can
        # be recorded under a message no earlier attempt saw; ToolBatch::fresh in the core).
        self._fresh_ids: set[Any] = set()
        # The run started on a thread whose latest row is not a finished turn (see _run_tools).
        self._after_unfinished = False
        # The context's message objects as of the last commit (see snapshot).
        self._committed: list[Message] = []
        # Tool messages the last tool node made from their recorded texts, by id(), with those
        # texts: the next snapshot stores them without dumping them again. Filled only when no
        # code of the user's can see them before that snapshot, and emptied by every call that
        # runs user code (run_node, eval_condition, lifecycle, begin_tools).
        self._encoded: dict[int, tuple[Message, str]] = {}
        self._finished: list[tuple[str, str]] = []
        self._tools_cut = False
        # A node's user code is running (run_node): a commit then is the engine's of a dropped node.
        self._node_in_flight = False
        self._node_step: int | None = None  # the step run_node last started
        self._tool_tasks: set[asyncio.Task[Any]] = set()
        self.entered: set[str] = set()
        self.emitter: Any = None  # a tenxgraph._stream.Emitter when the run is streamed
        # Durable commits this run made: none means its input was refused before it started.
        self.commits = 0
        self.events: Any = None  # a tenxgraph._events.RunEvents when the graph has a publisher
        # Client-run tool calls of a pause (RemoteToolCallBlock messages): in the response, never
        # in the context.
        self.remote_calls: list[Message] = []
        # What this process kept from the thread's previous run (tenxgraph._live_states.Held:
        # version, write mark, state, context index, state row); used when the store confirms
        # the thread is still there.
        self.known: Held | None = None
        # A commit of this run held a value a load of its JSON would give back changed (a tuple
        # where the model declares Any, a datetime in metadata, ...): the run's state is then not
        # kept as a live state, so the next turn sees what a load gives, as in any other process.
        self.reshaped = False
        # The state row of this run's last commit (a _core.KeptState), kept with its live state.
        self.kept_row: Any = None
        # (state text, context length, last message) as the last snapshot wrote them (see snapshot).
        self.committed_as: tuple[str, int, Any] | None = None
        # The text the run's state was loaded from (the stored row, or the kept live state's
        # commit), for _undo_node_changes before the run's first commit.
        self._loaded_text: str | bytes | None = None
        # The run's settings as the engine resolved them from ``config`` (a _core.RunOptions).
        self.options: RunOptions | None = None
        self._callbacks = graph._callbacks
        # Only lifecycle hooks make the loop call back at its lifecycle points (see lifecycle()).
        self.has_lifecycle_hooks = bool(self._callbacks._lifecycle_hooks)
        self.closing_failed_tools = False
        self._input_data = input_data
        self._resumed_node: str | None = None  # set when this run resumes a paused thread
        self._before_node: AgentState | None = None  # the state a node started from (for hooks)
        self._node_error: BaseException | None = None
        self.failed_at: tuple[str, int] | None = None  # the node that raised, and its step
        self._initial_commit = False  # see _fire_lifecycle
        self._start_effect: StartEffect | None = None  # what the start hooks changed (once per call)
        self._caller: Any = NOT_MERGED  # see prepare

    def _log_fields(self, **more: str) -> dict[str, str]:
        """The run's log fields, for lines made where the run's context is not current (the Rust
        loop calls ``prepare`` and ``accept_replay`` from its own threads)."""
        return {"thread_id": str(self.config["thread_id"]), "run_id": str(self.config["run_id"]), **more}

    # -- called by the Rust loop -----------------------------------------------------------

    def prepare(self, state_json: bytes | str | None, stored_class: str | None, exec_view: ExecView,
                known: bool = False) -> tuple[int, str | None, bool]:
        """Builds the live state and merges the input. Returns the cursor of stored messages, and
        whether the input is a stored turn sent again, answered from the store (see
        ``_replayed_turn``): then nothing runs.

        ``state_json``: the stored state with its messages as ``context``, one JSON document as
        UTF-8 bytes (``__state_meta__`` already taken out by Rust: ``stored_class`` is what it
        named).
        ``known``: the thread's latest row is still the commit ``self.known`` was kept from."""
        self._loaded_text = state_json
        if known:
            assert self.known is not None, "the store confirmed a state this run does not hold"
            state, self._index = self.known[2], self.known[3]
            self._loaded_text = self.known[5][0] if self.known[5] is not None else None
        elif state_json is None:
            state = self.graph._prototype.model_copy(deep=True)
            # The prototype's messages (a system prompt) are the new thread's first messages,
            # stored with its input: counted as stored, they were seen by the first turn's nodes
            # and never written, so every later turn and every other worker ran without them
            # (10xGraph stores them; differential red-team, session 38). Under the thread's ids
            # for them (see _message_ids).
            self._proto_copies = name_prototype_copies(state, id_type_of(self.graph._checkpointer))
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
        # (A new thread's prototype says running: no row, no earlier attempt.)
        self._after_unfinished = ((state_json is not None or known)
                                  and state.execution_meta.status != ExecutionStatus.COMPLETED)
        if state_json is not None or known:
            self._proto_copies = prototype_copies(state, self.graph._prototype.context,
                                                  lambda: self._index.ids(state.context),
                                                  id_type_of(self.graph._checkpointer))
        # A start refused after a replay was decided on a kept copy prepares again from a read,
        # with the input as sent (a rename made for the kept copy does not hold for the read).
        self.answered_from_store, self.produced = False, []
        self.input_messages = as_thread_copies(list(self._sent_messages), self._proto_copies)
        if self.has_lifecycle_hooks and state.execution_meta.status in (
            ExecutionStatus.INTERRUPTED_BEFORE, ExecutionStatus.INTERRUPTED_AFTER
        ):
            self._resumed_node = state.execution_meta.interrupted_node or ""
        self._check_resume(state)
        new_turn = bool(self.input_messages) and not self.has_resume and not at_remote_pause(state)
        use_remote_tools(state, self.config, self._sent_remote_tools, new_turn)
        if self.start_node is None:
            check_waiting_calls(state, self.input_messages, str(self.config["thread_id"]))
            if self.input_messages and at_remote_pause(state):
                self.input_messages = renamed_remote_results(self.input_messages, self._index.ids(state.context))
        if self.input_messages and self.config.get("idempotent_turns") is True:
            replayed = self._replayed_turn(state)
            if replayed is not None:  # before the run's events: nothing runs
                self._caller, self.produced = replayed
                self.answered_from_store = True
                self.state = state
                self.graph._log.info("the input is a turn the thread holds, sent again: answered with its stored "
                                     "result (idempotent_turns)", extra=self._log_fields(event="turn_replayed"))
                ctx = state.context
                return len(ctx), (str(ctx[-1].message_id) if ctx else None), True
        if self.events is not None and self.input_messages and not self.has_resume:
            # A turn that starts at the entry point (10xGraph ran START as a node first); the
            # stored status is the core's, so this reads where the core is about to start.
            if exec_view.current_node == self.graph._builder.entry_point and exec_view.step == 0:
                self.events.start_node_ran(0)
        if self.input_messages and not self.has_resume:
            # A new turn. Answers a node got from interrupt() and never spent (it raised, timed
            # out or was stopped after the answer came) belong to that turn's questions: kept,
            # the same interrupt() of this turn returned the old answer without asking (an
            # approval of one request given to the next; 10xGraph does that). A resume or a
            # continue (`{}`) of the same turn still finds them.
            clear_answers(state)
        stored_len = 0 if state_json is None and not known else len(state.context)
        self._committed = list(state.context[:stored_len])
        last_id = str(state.context[-1].message_id) if stored_len else None
        if self.input_messages:
            if len(self.input_messages) > 1:
                self._rename_twins(state)
            self._index.append(state, self.input_messages)
            if len(state.context) == stored_len and (known or state_json is not None):
                self._add_resent_user_message(state)
            # The response's user message, as 10xGraph picks it: the context's last one once the
            # input is merged (a sent message whose id was stored already is not the one kept).
            self._caller = next((m for m in reversed(state.context) if m.role == "user"), None)
        keep_remote_tools(state, self._sent_remote_tools, new_turn)
        if self.input_messages and self.config.get("idempotent_turns") is True:
            turn_request.record(state, self.input_messages[-1].message_id, self.state_update)
        fields = type(state).model_fields
        for key, value in self.state_update.items():
            # 10xGraph sets only the keys the state has; others are ignored, not an error.
            if key in fields:
                setattr(state, key, copy_update_value(key, value))  # not shared with the caller
            else:
                self.graph._log.warning(
                    "input 'state' key %r is not a field of %s; ignored", key, type(state).__name__,
                    extra=self._log_fields(),
                )
        # Paused after the graph's last node and told to go on: nothing is left to run either.
        meta = state.execution_meta
        paused_at_end = (meta.status == ExecutionStatus.INTERRUPTED_AFTER and meta.current_node == END
                         and not self.input_messages)
        self._apply_exec(state, exec_view)
        if state.execution_meta.status == ExecutionStatus.COMPLETED or paused_at_end:
            # Only a finished thread asked to finish is prepared completed: nothing runs, and the
            # response is the stored last turn.
            start = max((i for i, m in enumerate(state.context) if m.role == "user"), default=-1) + 1
            self.produced = list(state.context[start:])
            self.answered_from_store = True
        self.state = state
        return stored_len, last_id, False

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
        # The index's copy of the context as the node starts, and its ids (see ContextIndex.seen).
        pre_ctx, pre_ids = self._index.seen(state.context)
        pre_n = len(pre_ids)
        answers = state.execution_meta.internal_data.get(RESUME_ANSWERS_KEY, {})
        events = self.events
        step = state.execution_meta.step
        if events is not None:
            events.node_start(name, step)
        if self.has_lifecycle_hooks:
            self._before_node = state.model_copy(deep=True)
        token = activate(name, answers)
        sink = self.emitter.delta_sink(name, node.function_name) if self.emitter is not None else None
        node_token = _node_context.use(_node_context.NodeContext(self.graph, name, sink))
        self._node_in_flight = True
        self._node_step = step
        try:
            with log_fields(node=name):
                if self._callbacks.wraps(InvocationType.AI):
                    result = await self._call_with_callbacks(node, state, config)
                else:
                    result = await node.call(state, config)
        except GraphInterrupt:
            self._undo_node_changes()
            raise
        except BaseException as exc:  # noqa: BLE001 - re-raised; settled first
            # Any failure, not only Exception and CancelledError: a library's timeout or cancel
            # type built on BaseException (gevent's Timeout) stored the node's change and the
            # retry made it again (red-team, session 36).
            if events is not None:
                events.node_error(name, step, exc)
            if isinstance(exc, Exception):
                self._node_error = exc
                self.failed_at = (name, step)
            # Failed, timed out or stopped, the node runs again from its start on the retry:
            # what it changed in place before that is not stored with the failure (it was, and
            # the retry did it again: a counter bumped twice; red-team, session 35). Unless the
            # engine's commit of the drop came first (see snapshot).
            self._settle_dropped_node()
            raise
        finally:
            self._node_in_flight = False
            _node_context.reset(node_token)
            deactivate(token)
        produced_before = len(self.produced)
        try:
            goto = self._absorb(result, state, pre_ctx, pre_len,
                                   pre_ids if len(pre_ids) == pre_n else None)
        except Exception as exc:
            if events is not None:
                events.node_error(name, step, exc)
            self.failed_at = (name, step)
            # A return value refused (None, an int): the node runs again too (red-team, session 35).
            self._undo_node_changes()
            raise
        clear_answers(self.state)  # the node finished: its answers are spent
        if events is not None:
            events.node_end(name, step, self.produced[produced_before:], goto)
        if self.emitter is not None:
            for m in self.produced[produced_before:]:
                self.emitter.node_message(m, name, node.function_name)
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

    def committed(self, version: int) -> None:
        """The step is durable: release the chunks held back for it."""
        self.commits += 1
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
        self._settle_dropped_node()
        state = self.state
        assert state is not None, "prepare() runs first"
        self._apply_exec(state, exec_view)
        mark_remote_turn(state)
        # What else edits the live state in place (hooks, a tool's injected state) is renamed
        # here, and the map is put back if a node dropped it.
        self._with_thread_copies(state)
        keep_prototype_copies(state, self._proto_copies)
        data, reshaped = encode_state_shaped(state)
        ctx = state.context
        n = len(ctx)
        # Only new messages are written while the stored ones are still the same objects in the
        # same order (an identity-first list compare, ~1 ns per message). A node that replaced or
        # removed an earlier message gets the whole context written; before, such an edit that
        # kept the length and the last id was never stored.
        grown = (cursor_len <= n and (cursor_len == 0 or str(ctx[cursor_len - 1].message_id) == cursor_last_id)
                 and ctx[:cursor_len] == self._committed[:cursor_len])
        fresh = ctx[cursor_len:] if grown else ctx
        if not grown:
            # The context is written whole, as it is now: the index is rebuilt from it too (a
            # message whose id a node changed in place left its old id in the index, which a
            # kept live state would carry into the thread's next turns).
            self._index.forget()
        refuse_id_twins(fresh, self._index.ids(ctx))
        self._committed = list(ctx)
        encoded = self._encoded
        messages = []
        for m in fresh:
            e = encoded.get(id(m))
            if e is not None and e[0] is m:  # made from its recorded text
                text = e[1]
            else:
                text, loose = encode_message_shaped(m)
                reshaped = reshaped or loose
            # A NUL (always escaped in JSON) comes back from Postgres as U+FFFD.
            reshaped = reshaped or _NUL in text
            messages.append((str(m.message_id), text))
        encoded.clear()
        # Sticky for the run: a value a load would give back changed is in the state from then on.
        self.reshaped = self.reshaped or reshaped or _NUL in data
        # What this commit holds, for a live state kept after it (tenxgraph._live_states): the
        # state's text, and the context's length and last object.
        self.committed_as = (data, n, ctx[-1] if n else None)
        return data, messages, not grown, n, (str(ctx[-1].message_id) if n else None)

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
            messages = [copy_message(m) for m in messages]
        usage = token_usage(messages)
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

    # -- helpers ---------------------------------------------------------------------------

    def _absorb(self, result: Any, state: AgentState, pre_ctx: list[Message], pre_len: int,
                pre_ids: set[Any] | None) -> str | None:
        """10xGraph's process_node_result: returns the goto, updates ``self.state``."""
        goto: str | None = None
        new: list[Message] = []
        # A context the node rebuilt in place from the prototype's prompt (`state.context[:] =
        # [PROMPT]`, then a reply returned): the thread's copy, before anything merges (sixth
        # pass, session 38: the prototype's id was stored, and other Postgres threads failed).
        self._with_thread_copies(state)
        if result is None:
            # 10xGraph 0.10 refuses it too; silently accepting it hid a forgotten `return`.
            raise ValueError(
                "the node returned None: return a str, a Message, a list of them, the state, or a "
                "Command (Command(update=None) changes nothing)"
            )
        if isinstance(result, Command):
            goto = result.goto
            if goto is not None and not isinstance(goto, str):
                # Checked before anything merges: refused later (the core takes a name), the
                # update was stored with the failure and made again by the retry (a second
                # reply; differential red-team, session 38).
                raise TypeError(f"Command.goto must be the name of a node (a str) or None, not "
                                f"{type(goto).__name__}: {goto!r}")
            if result.state is not None:
                result_state = self._with_thread_copies(require_state(result.state))
                # The messages the node added to the state it hands over are its output, like
                # those of a returned state: reported by invoke and streamed.
                new = added(result_state, pre_ctx, pre_len, pre_ids)
                self.state = state = result_state
            result = result.update
        if isinstance(result, AgentState):
            self._with_thread_copies(result)
            if result is not state:
                self.state = result
            new = added(result, pre_ctx, pre_len, pre_ids)
        elif result is not None:
            items = result if isinstance(result, list) else [result]
            seen_new: set[Any] = set()
            for item in items:
                msg = to_message(item)
                if self._proto_copies and msg.message_id in self._proto_copies:  # the thread's copy of one
                    msg = as_thread_copies([msg], self._proto_copies)[0]
                if isinstance(msg, RemoveMessage):
                    # Tombstones apply in order (add_messages): a message after one, with its
                    # id, is its replacement. It was deduplicated against the tombstone and
                    # dropped, so a replace by id deleted the message (red-team, session 37).
                    new.append(msg)
                    if msg.message_id == REMOVE_ALL_MESSAGES:
                        seen_new.clear()
                    else:
                        seen_new.discard(msg.message_id)
                elif msg.message_id not in seen_new:
                    seen_new.add(msg.message_id)
                    new.append(msg)
            target = self.state
            assert target is not None
            self._index.append(target, new, self._fresh_ids)
        # A tombstone is an edit, not a message of the turn: not returned, streamed or hooked.
        self.produced.extend(m for m in new if not m.delta and not isinstance(m, RemoveMessage))
        return goto

    def _with_thread_copies(self, state: AgentState) -> AgentState:
        """``state`` (a node's returned state) with a message it holds under a prototype id
        renamed, in place, to the thread's copy: a summarising node that rebuilds the context
        from the prototype's prompt stored the prototype's id, and every other thread then
        failed on it (STORAGE_FORBIDDEN_002; red-team, session 38)."""
        if self._proto_copies:
            renamed = as_thread_copies(state.context, self._proto_copies)
            if renamed is not state.context:
                state.context[:] = renamed
        return state

    def _settle_dropped_node(self) -> None:
        """A node still in flight here failed, or was dropped by the engine (node_timeout,
        stop()), whose commit and error hooks may come before the node's task has unwound: the
        state goes back to the node's start once, before any of them sees it."""
        if self._node_in_flight:
            self._node_in_flight = False
            self._undo_node_changes()

    def _undo_node_changes(self) -> None:
        """A node (or its tool call) paused at interrupt(), failed, timed out or was stopped: it
        runs again from its start when the thread is resumed, so the pause stores the state it started from, as the run's last
        commit wrote it (or as it was loaded), with the context's messages of that commit. Before,
        what the node changed before interrupt() was stored with the pause and done again on
        resume (a counter bumped twice, a message appended twice; 10xGraph does that). A message
        the node edited in place is not put back (as at a step: see snapshot)."""
        text = self.committed_as[0] if self.committed_as is not None else self._loaded_text
        if text is None:
            return
        try:
            data = json.loads(text)
            # Only when that text is the node's start: with durable_checkpoint_every_step=False
            # the steps since the last commit are in the live state alone, and putting that
            # commit back lost them (a finished tool's call and result, its tool fired again on
            # the retry: red-team, session 35). Then the node's changes stay, as 10xGraph keeps them.
            if (data.get("execution_meta") or {}).get("step") != self._node_step:
                return
            data.pop(STATE_META_KEY, None)
            data.pop("context", None)
            # In JSON mode, as a load reads it: a strict model refuses a datetime's text in Python mode.
            state = type(self.state or self.graph._prototype).model_validate_json(json.dumps(data))
        except Exception as exc:  # noqa: BLE001 - the pause must still happen: stored as the node left it
            self.graph._log.warning("the node's state could not be put back as it started (%s); the pause or "
                                    "failure stores it as the node left it", exc,
                                    extra=self._log_fields(event="pause_state_not_restored"))
            return
        state.context = list(self._committed)
        self.state = state

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
