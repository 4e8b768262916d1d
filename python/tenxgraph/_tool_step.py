"""The Python half of one tool node: the calls, their branch states, and turning results into
messages. The Rust handler decides what runs (ledger lookup, timeouts, recording)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter

from tenxgraph import _sync_calls
from tenxgraph.core.exceptions import NodeError
from tenxgraph.core.graph.tool_merge import field_reducer, merge_tool_state
from tenxgraph.core.graph.tool_output import holds_as_json
from tenxgraph._required_nulls import refuse_required_nulls
from tenxgraph._state_codec import refuse_nonfinite
from tenxgraph.logs import NOT_RECORDED_EVENT, NOT_RECORDED_MESSAGE, run_logger
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph._run_values import id_twin
from tenxgraph.core.state.message import Message, generate_id
from tenxgraph.core.state.message_block import ErrorBlock, ToolResultBlock
from tenxgraph.prebuilt.tools.handoff import first_handoff, handoff_call_target, handoff_message
from tenxgraph.utils.interrupt import RESUME_ANSWERS_KEY, activate, deactivate, interrupt, pending_interrupt

__all__ = ["ToolStep"]

_log = run_logger("tenxgraph.tools")
_JSON = TypeAdapter(Any)


@dataclass
class _Call:
    call_id: str | None
    name: str
    arguments: Any
    # The id as the model gave it (a str or an int): the ledger keeps 123 and "123" apart.
    raw_id: str | int | None = None
    # The interrupt scope of the call: its id, made unique within the message (_name_scopes).
    scope_id: str = ""
    outcome_scope_id: str = ""  # the scope of a human's answer to "did it take effect?" (unknown())


@dataclass
class ToolStep:
    node_name: str
    tool_node: Any
    origin_id: Any
    calls: list[_Call]
    live: AgentState
    baseline: AgentState | None
    branches: dict[int, AgentState] = field(default_factory=dict)
    replays: dict[int, Message] = field(default_factory=dict)
    replayed_updates: dict[int, dict[str, Any]] = field(default_factory=dict)
    streamed: set[int] = field(default_factory=set)
    pending_stream: dict[int, str] = field(default_factory=dict)
    # The JSON text of each result message this process produced (the "value" of its envelope):
    # finish() and the streamed/published copies validate from it, instead of parsing the envelope
    # back from the text the Rust handler returns.
    texts: dict[int, str] = field(default_factory=dict)
    # ToolResult updates of calls that share the live state: applied when the node succeeds, so a
    # failing node never leaves a half-applied tool node behind.
    deferred_updates: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Where a sync tool's late result is recorded: (native store, thread_id, user_id); None
    # leaves late results unrecorded (see tenxgraph._sync_calls).
    ledger: tuple[Any, str, str] | None = None
    # The graph's CallbackManager: its TOOL callbacks wrap each call that really runs (a call
    # answered from the ledger runs nothing, so it fires none).
    callbacks: Any = None
    # Per call that returned, until its result is handed on: what makes the tool's own outcome,
    # and the state fields it changed in place by then. A call cut off after that (a cancel or a
    # Ctrl-C in an after_invoke callback or while its value becomes its message, node_timeout,
    # stop()) is still recorded (RunTools.run_tool), its changes with it: the node's failure
    # stores the state it started from, and the replay makes them again.
    cut_off: dict[int, tuple[Callable[[], Any], dict[str, Any] | None]] = field(default_factory=dict)
    # Whether a message id is the context's already (set by RunTools: its id index, no pass over
    # the history), and the ids this step's results took so far.
    id_in_context: Callable[[Any], bool] | None = None
    claimed: set[Any] = field(default_factory=set)
    # The graph's agent nodes (not tool nodes, not END): where a handoff call may go (set by
    # RunTools; None: by name alone).
    agents: Any = None

    @classmethod
    def begin(cls, node_name: str, tool_node: Any, state: AgentState) -> ToolStep:
        if not state.context:
            raise NodeError(f"ToolNode '{node_name}' has no messages to act on", "NODE_003", {"node_name": node_name})
        last = state.context[-1]
        raw_calls = last.tools_calls or []
        if not raw_calls:
            raise NodeError(
                f"ToolNode '{node_name}': the last message has no tool calls", "NODE_002", {"node_name": node_name}
            )
        calls = [_parse_call(c) for c in raw_calls]
        _name_scopes(calls)
        # One call works on the live state; several get their own copies, merged afterwards. Only
        # tools that take `state` can change it, so only their calls need a copy at all.
        writers = sum(1 for c in calls if tool_node.takes_state(c.name))
        baseline = _branch_copy(state) if len(calls) > 1 and writers > 0 else None
        return cls(node_name, tool_node, last.message_id, calls, state, baseline)

    def state_for(self, index: int) -> AgentState:
        if self.baseline is None:
            return self.live
        if index not in self.branches:
            self.branches[index] = _branch_copy(self.baseline)
        return self.branches[index]

    def accept_replay(self, index: int, envelope_json: str) -> bool:
        env = json.loads(envelope_json)
        try:
            if env["__kind__"] == "message":
                self.replays[index] = self._own_id(Message.model_validate(env["value"]))
            else:
                self.replays[index] = _result_message(self.calls[index], env["value"], False)
            update = env.get("state")
            if update is not None:
                if not isinstance(update, dict):
                    return False
                self.replayed_updates[index] = update
        except Exception as exc:  # a malformed record is no record: the tool runs again
            _log.warning("ledger record for call %s is malformed (%s); the tool will run", self.calls[index].call_id, exc,
                         extra={"tool": self.calls[index].name, "event": "ledger_record_malformed"})
            return False
        return True

    def _flight_key(self, idempotency_key: str | None) -> tuple[int, str] | None:
        """A sync call's key in the process-wide registry: the idempotency key names the thread
        and the ledger key; the store tells two databases with the same thread ids apart."""
        if self.ledger is None or not idempotency_key:
            return None
        return (id(self.ledger[0]), idempotency_key)

    def _late_recorder(self, index: int, ledger_key: str, state: AgentState, before: AgentState | None) -> Any:
        """What records a sync call's result that arrives after its run stopped waiting (on the
        worker thread), and measures there, as the tool returns, the fields it changed in place
        on ``state`` (``changes``: see tenxgraph.core.graph._sync_tools)."""
        assert self.ledger is not None
        native, thread_id, user_id = self.ledger
        call = self.calls[index]
        fields = {"tool": call.name, "ledger_key": ledger_key, "thread_id": thread_id}

        def record(outcome: Any) -> str:
            """How the record ended (see tenxgraph._sync_calls: ``RECORD_IN``, ``THREAD_GONE``,
            or another word for a result the ledger does not hold)."""
            envelope, recordable = self._envelope_of(index, outcome, ledger_key)
            if not recordable:
                return "not recordable"
            try:
                inserted = native.ledger_put_blocking(thread_id, user_id, ledger_key, envelope)
            except Exception as exc:  # noqa: BLE001 - the side effect happened: the alert line says so
                _log.error(NOT_RECORDED_MESSAGE, extra={**fields, "event": NOT_RECORDED_EVENT,
                                                        "error": f"late result of a sync tool: {exc}"})
                # Refused because the thread is gone (a late record needs its thread).
                gone = getattr(exc, "error_code", None) == "STORAGE_FENCED_001"
                return _sync_calls.THREAD_GONE if gone else "failed"
            if inserted:
                _log.warning("sync tool call finished after its run stopped waiting for it (deadline or stop()); "
                             "its result is recorded in the ledger, and a resume answers from it",
                             extra={**fields, "event": "sync_tool_late_result_recorded"})
            else:
                _log.info("sync tool call finished late; a result was recorded for it first, which stands",
                          extra={**fields, "event": "sync_tool_late_result_dropped"})
            return _sync_calls.RECORD_IN

        if before is not None:
            record.changes = lambda: self._changes(state, before)  # type: ignore[attr-defined]
        return record

    async def run(self, index: int, config: dict[str, Any], idempotency_key: str | None,
                  ledger_key: str | None = None) -> tuple[str, bool, bool]:
        call = self.calls[index]
        args = call.arguments
        if isinstance(args, str) or args is None:
            try:
                args = json.loads(args or "{}")
            except (json.JSONDecodeError, TypeError) as exc:
                msg = _result_message(call, f"Invalid tool arguments (not valid JSON): {exc}", True)
                return self._answer(index, msg), False, True  # the tool never ran: nothing to record
        if not isinstance(args, dict):
            msg = _result_message(call, f"Invalid tool arguments (not a JSON object): {args!r}", True)
            return self._answer(index, msg), False, True
        target = handoff_call_target(self.tool_node, call.name, self.agents)
        if target is not None:
            # A handoff: answered here with a tool result, recorded like any call; the node then
            # routes to the target (Run.finish_tools). The first handoff of the message wins: a
            # later one is told so (it was answered "Handoff to C" too, and C never got control).
            first, winner = first_handoff(self) or (index, target)
            if first != index:
                msg = _result_message(call, f"Not handed off to {target}: this message already hands off to "
                                            f"{winner} (the first handoff wins)", True)
                return self._answer(index, msg), True, True
            return self._answer(index, handoff_message(target, call.call_id or "")), True, False
        takes_state = self.tool_node.takes_state(call.name)
        state = self.state_for(index) if takes_state else self.live
        # What the tool may change in place, to record its changes with its result: a replay
        # (a resume after a sibling's interrupt(), a retry after a crash) does not run the tool,
        # and its changes were lost (10xGraph loses them too).
        before = None if not takes_state else self.baseline if state is not self.live else _branch_copy(state)
        flight_key = self._flight_key(idempotency_key) if ledger_key else None
        if flight_key is not None and ledger_key and _sync_calls.recorded(flight_key):
            adopted = await self._recorded_late(index, ledger_key, flight_key)
            if adopted is not None:
                return adopted
        answers = self.live.execution_meta.internal_data.get(RESUME_ANSWERS_KEY, {})
        token = activate(self.node_name, answers, tool_call_id=call.scope_id)
        late = self._late_recorder(index, ledger_key, state, before) if flight_key is not None and ledger_key else None
        try:
            outcome = await self.tool_node.execute(
                call.name, args, call.call_id or "", config, state, idempotency_key=idempotency_key,
                flight_key=flight_key, late_record=late, callback_manager=self.callbacks,
                on_return=lambda made: self.cut_off.__setitem__(index, (made, self._changes(state, before))),
            )
        finally:
            deactivate(token)
        if outcome.state_update:
            if state is self.live:
                self.deferred_updates[index] = outcome.state_update
            else:
                _apply_update(state, outcome.state_update)
        update = _with_changes(self._changes(state, before), outcome.state_update)
        message = self._own_id(outcome.message)
        text = self.texts[index] = _message_json(message)
        envelope, record = self._envelope_of(index, outcome, ledger_key, text, update)
        return envelope, record, _is_error(message)

    async def _recorded_late(self, index: int, ledger_key: str, flight_key: Any) -> tuple[str, bool, bool] | None:
        """A sync call whose late result this process recorded lately, after this attempt read
        the ledger: its row, as this attempt's result (``adopt``). When the row is gone (the
        thread was deleted since, and a new conversation reuses the ids) the call is forgotten
        and runs: it was handed the deleted thread's result (fourth red-team pass, session 37)."""
        assert self.ledger is not None
        native, thread_id, user_id = self.ledger
        try:
            rows = await native.ledger_get(thread_id, user_id, [ledger_key])
        except Exception:  # noqa: BLE001 - unread, the call joins the recorded one: it never runs twice
            return None
        envelope = rows.get(ledger_key)
        if envelope is None:
            # Gone since it went in, or refused for a thread gone: a new call, which runs. Never
            # recorded (the write failed): its result is joined, and this attempt records it
            # (dropping it ran the tool a second time: fifth red-team pass).
            if _sync_calls.recorded_as(flight_key) in (_sync_calls.RECORD_IN, _sync_calls.THREAD_GONE):
                _sync_calls.drop_recorded(flight_key)
            return None
        return self.adopt(index, envelope)

    def returned(self, index: int) -> tuple[str, bool, bool] | None:
        """Call ``index`` as it returned, when its run was cut off after that (its tool_timeout
        ran out in an after-invoke callback): ``(envelope, record, is_error)``, its text kept as
        a finished call's is; None when it had not returned."""
        cut = self.cut_off.pop(index, None)
        if cut is None:
            return None
        made, changed = cut
        outcome = made()
        if outcome.state_update:
            self.deferred_updates[index] = outcome.state_update
        message = self._own_id(outcome.message)
        text = self.texts[index] = _message_json(message)
        envelope, record = self._envelope_of(index, outcome, None, text, _with_changes(changed, outcome.state_update))
        return envelope, record, _is_error(message)

    def salvaged(self, index: int, ledger_key: str) -> tuple[str, bool] | None:
        """Call ``index`` cut off after it returned, as its record: ``(envelope, record)``;
        None when it had not returned."""
        cut = self.cut_off.pop(index, None)
        if cut is None:
            return None
        made, changed = cut
        outcome = made()
        return self._envelope_of(index, outcome, ledger_key, update=_with_changes(changed, outcome.state_update))

    def _changes(self, state: AgentState, before: AgentState | None) -> dict[str, Any] | None:
        """The fields a call that takes the state changed in place (``before``: the state as
        it started, None for a call that does not take it)."""
        if before is None:
            return None
        return _changed_fields(state, before, branch=state is not self.live) or None

    def _own_id(self, msg: Message) -> Message:
        """``msg`` under an id no other message of the context or of this step has: a tool that
        makes its own result message (``message_id=f"order-{order_id}"``) gave two calls one id,
        or the id of a message the thread holds, and the context's merge kept the first message
        of an id: the call's result was dropped, the call left unanswered. The later one gets a
        new id (the rule for input messages), recorded with the result."""
        mid = msg.message_id
        twin = id_twin(mid)
        taken = self.id_in_context is not None and (self.id_in_context(mid) or (twin is not None
                                                                                 and self.id_in_context(twin)))
        if taken or mid in self.claimed or (twin is not None and twin in self.claimed):
            msg = msg.model_copy(update={"message_id": generate_id(None)})
        self.claimed.add(msg.message_id)
        return msg

    def _envelope_of(self, index: int, outcome: Any, ledger_key: str | None = None,
                     message_json: str | None = None, update: dict[str, Any] | None = None) -> tuple[str, bool]:
        """The ledger envelope of an outcome, and whether it may be recorded; ``update``: the
        state changes recorded with it (default: the ToolResult's). Touches no state: a sync
        tool's late result is turned into its record on the worker thread."""
        call = self.calls[index]
        record = bool(outcome.recordable)
        state_json: str | None = None
        if update is None:
            update = outcome.state_update
        if update:
            refused = _update_refusal(type(self.live), update)
            if refused is not None:
                # Recorded without it: with it, every replay of the call (a retry, the close of
                # the failed node by the next turn) applied it again and failed the same way, and
                # the thread never took another turn. This attempt still applies it, so the turn
                # fails naming it (a tool's bug to see), and the result stands for the replay.
                _log.error("a tool's state update cannot be stored; its result is recorded without it, and a "
                           "retry of the turn goes on without the update", extra={
                               "event": "tool_state_update_unstorable", "tool": call.name,
                               "ledger_key": ledger_key or "", "error": refused})
            else:
                try:
                    dumped = _JSON.dump_python(update, mode="json")
                    if not holds_as_json(dumped):
                        raise ValueError("too deep, NaN/inf, or an int past 64 bits")
                    state_json = json.dumps(dumped)
                except Exception as exc:
                    record = False
                    _log.error(NOT_RECORDED_MESSAGE, extra={
                        "event": NOT_RECORDED_EVENT, "tool": call.name, "ledger_key": ledger_key or "",
                        "error": f"its state update is not JSON-serialisable: {exc}"})
        if message_json is None:
            message_json = _message_json(outcome.message)
        return _envelope_text(message_json, state_json), record

    def _answer(self, index: int, msg: Message) -> str:
        """The envelope of a result message made here; its text is kept (see ``texts``)."""
        text = self.texts[index] = _message_json(msg)
        return _envelope_text(text)

    def adopt(self, index: int, envelope_json: str) -> tuple[str, bool, bool] | None:
        """An earlier attempt's result of this call (it was still running in this process when
        this attempt began: tenxgraph._async_calls), as this attempt's ``(envelope, record,
        is_error)``: not run. Recorded again (the ledger keeps the first record): the earlier
        attempt's own record may have been refused, its run having lost the thread. None when
        the envelope is not one a replay takes (then the call runs)."""
        if not self.accept_replay(index, envelope_json):
            return None
        msg = self.replays[index]
        self.texts[index] = _message_json(msg)
        return envelope_json, True, _is_error(msg)

    def message_of(self, index: int, envelope_json: str | None = None) -> Message:
        """A fresh Message of a call's result: from the text kept when this process made it,
        else from the envelope."""
        text = self.texts.get(index)
        if text is not None:
            return Message.__pydantic_validator__.validate_json(text)  # model_validate_json, unwrapped
        if envelope_json is None:
            raise RuntimeError(f"tenxgraph: no result text kept for tool call {index} of node {self.node_name!r}")
        return Message.model_validate(json.loads(envelope_json)["value"])

    def unknown(self, index: int, idempotency_key: str | None,
                retries_spent: int = 0) -> tuple[str, bool, bool] | None:
        """An at-most-once call that an earlier attempt started and never recorded: it may or may
        not have taken effect, so it is not run again. Returns None (run it again) or the answer
        as a tool result: ``(envelope, record, is_error)``.

        With ``on_unknown="interrupt"`` a human decides: resume with ``"retry"`` (or
        ``{"action": "retry"}``) to run it again, or with the call's result (any JSON, or
        ``{"result": ...}``), which is recorded as if the tool had returned it."""
        call = self.calls[index]
        flight_key = self._flight_key(idempotency_key)
        if flight_key is not None and (_sync_calls.in_flight(flight_key) or _sync_calls.recorded(flight_key)):
            # Not unknown at all: the earlier attempt's thread is still running in this process.
            # "retry" makes the handler run the call, which waits for that thread.
            return None
        if self.tool_node.on_unknown(call.name) == "interrupt":
            answers = self.live.execution_meta.internal_data.get(RESUME_ANSWERS_KEY, {})
            # Its own interrupt key, apart from interrupt() calls inside the tool itself. The
            # answers stay with the thread until the node finishes: the n-th question (n "retry"
            # answers already spent, as the ledger row counts them) is a new one, or a crash during
            # a retried call found the same "retry" and ran the call again.
            token = activate(self.node_name, answers, tool_call_id=call.outcome_scope_id, asked=retries_spent)
            try:
                answer = interrupt(
                    {"tool": call.name, "arguments": call.arguments, "tool_call_id": call.call_id,
                     "idempotency_key": idempotency_key},
                    message=(f"Tool '{call.name}' started earlier but its result was never recorded: did it take "
                             "effect? Resume with 'retry' to run it again, or with its result."),
                    reason="tool_outcome_unknown",
                )
            finally:
                deactivate(token)
            if answer == "retry" or (isinstance(answer, dict) and answer.get("action") == "retry"):
                return None
            output = answer["result"] if isinstance(answer, dict) and "result" in answer else answer
            return self._answer(index, _result_message(call, output, False)), True, False
        text = (f"The outcome of tool '{call.name}' (call {call.call_id}) is unknown: it started earlier but "
                "its result was never recorded, and it must run at most once, so it was not run again. "
                f"Check whether it took effect (idempotency key {idempotency_key}) before trying again. "
                "[TOOL_OUTCOME_UNKNOWN]")
        return self._answer(index, _result_message(call, text, True, code="TOOL_OUTCOME_UNKNOWN")), False, True

    def finish(self, items: list[tuple[str, str | None]], encoded: dict[int, tuple[Message, str]] | None = None) -> list[Message]:
        """The node's tool messages, in call order. ``encoded`` gets, by ``id()``, each message
        made here from the text it was recorded as, with that text (see Run.snapshot)."""
        messages: list[Message] = []
        for index, (kind, payload) in enumerate(items):
            call = self.calls[index]
            if kind == "replayed":
                messages.append(self.replays[index])
            elif kind == "ran":
                msg = self.message_of(index)  # the engine sends no envelope back: the text is kept here
                text = self.texts.get(index)
                if text is not None and encoded is not None:  # message_of built msg from it
                    encoded[id(msg)] = (msg, text)
                messages.append(msg)
            elif kind == "timeout":
                if self.tool_node.is_sync(call.name):
                    # A thread cannot be cancelled: do not tell the model it was.
                    text = (f"Tool '{call.name}' exceeded its timeout of {float(str(payload)):g}s; it runs in a thread, "
                            "which cannot be cancelled, so it may still finish (its result is then recorded, "
                            "not shown here) [NODE_TIMEOUT_002]")
                else:
                    text = (f"Tool '{call.name}' exceeded its timeout of {float(str(payload)):g}s and was cancelled "
                            "[NODE_TIMEOUT_002]")
                messages.append(_result_message(call, text, True, code="NODE_TIMEOUT_002"))
            else:
                messages.append(_result_message(call, f"Tool '{call.name}' failed: {payload}", True))
        self._merge_updates()
        return messages

    def _merge_updates(self) -> None:
        """Each call's changes to the state, in call order, whatever their source: a branch's
        (a parallel call that takes `state`), a replayed record's, a ToolResult's. Before, the
        branches went first, then the replays, then the rest, so a run resumed after a crash or a
        pause ended with another state than a straight run (the last write of a field without a
        reducer, an order-sensitive reducer). Parallel calls' updates go through the field's
        reducer, as a branch's changes do (10xGraph merges every parallel call's branch).

        All or nothing: a reducer that raises leaves the live state as it was before the first
        merge, so the error state stored for the failed node holds none of them (it held the
        merges before the one that raised, and a retry, answering those calls from the ledger,
        applied them a second time)."""
        if not (self.branches or self.replayed_updates or self.deferred_updates):
            return
        live = self.live
        before = _branch_copy(live)
        parallel = len(self.calls) > 1
        try:
            for index in range(len(self.calls)):
                if self.baseline is not None and index in self.branches:
                    merge_tool_state(live, self.branches[index], self.baseline)
                for updates in (self.replayed_updates, self.deferred_updates):
                    if index in updates:
                        _apply_update(live, updates[index], reduce=parallel)
        except BaseException:
            context = live.context
            live.__dict__.update(before.__dict__)
            live.context = context
            raise


def _branch_copy(state: AgentState) -> AgentState:
    """A deep copy of everything the merge reads, in time independent of the history: `context` is
    never merged back, so a branch gets its own list of the same (shared) messages."""
    context = state.context
    state.context = []
    try:
        branch = copy.deepcopy(state)
    finally:
        state.context = context
    branch.context = list(context)
    return branch


def _name_scopes(calls: list[_Call]) -> None:
    """Each call's interrupt scope (its answers are stored under ``tool:<scope>:<n>``), unique
    within the message and made from the message alone, so a replay names them the same: the id
    when no other call has it, else the id (or nothing) with ``#<index>``, with more ``#`` while
    that is another call's id. An unknown outcome's scope, ``<scope>:outcome``, gets ``#`` too
    while it is a call's scope. Before, ``("c", "c", "c#1")`` gave the second and third call one
    scope, and a call without an id shared the scope of a call whose id was ``#<its index>``: one
    human answer was taken by a tool whose question was never shown."""
    ids = [c.call_id for c in calls]
    literal = {i for i in ids if i is not None}
    taken: set[str] = set()
    for index, c in enumerate(calls):
        if c.call_id and ids.count(c.call_id) == 1:  # "" is no scope: interrupt() reads it as the node's
            scope = c.call_id
        else:
            scope = f"{c.call_id or ''}#{index}"
            while scope in literal or scope in taken:
                scope += "#"
        taken.add(scope)
        c.scope_id = scope
    for c in calls:
        outcome = f"{c.scope_id}:outcome"
        while outcome in taken:
            outcome += "#"
        c.outcome_scope_id = outcome


def _parse_call(raw: Any) -> _Call:
    if not isinstance(raw, dict):
        return _Call(None, "", "{}")
    fn = raw.get("function") if isinstance(raw.get("function"), dict) else {}
    call_id = raw.get("id")
    raw_id = call_id if isinstance(call_id, (str, int)) and not isinstance(call_id, bool) else (
        None if call_id is None else str(call_id))
    return _Call(str(call_id) if call_id not in (None, "") else None, str(fn.get("name") or raw.get("name") or ""),
                 fn.get("arguments", raw.get("arguments", "{}")), raw_id=None if raw_id == "" else raw_id)


def _with_changes(changed: dict[str, Any] | None, update: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a call's record carries for the state: the fields it changed in place, then its
    ``ToolResult(state=...)`` update over them."""
    return {**changed, **(update or {})} if changed else update


def _changed_fields(state: AgentState, before: AgentState, *, branch: bool) -> dict[str, Any]:
    """The fields a tool changed on ``state`` against ``before``, as its recorded update: what a
    branch's merge takes (``merge_tool_state``: not ``context_summary``), or for the live state
    every field but the context and the loop's."""
    skip = _NOT_MERGED if branch else _NOT_UPDATED
    return {name: getattr(state, name) for name in type(state).model_fields
            if name not in skip and getattr(state, name) != getattr(before, name, _MISSING)}


_NOT_UPDATED = frozenset({"context", "execution_meta"})
_NOT_MERGED = _NOT_UPDATED | {"context_summary"}
_MISSING = object()


def _update_refusal(state_cls: type[AgentState], update: dict[str, Any]) -> str | None:
    """Why the state could not store ``update`` (a ToolResult's), or None: the checks a commit
    makes (NaN and infinities, ints past 64 bits, None where the field takes none), and that the
    fields load back, made on a state of the class holding only the update. Thread-safe (a sync
    tool's late result is recorded on its worker thread): it reads no live state."""
    fields = state_cls.model_fields
    kept = {k: v for k, v in update.items() if k in fields and k not in ("context", "execution_meta")}
    if not kept:
        return None
    try:
        trial = state_cls.model_construct(**kept)
        refuse_nonfinite(trial, "the tool's state update", skip="context", exact_ints=True)
        refuse_required_nulls(trial, "the tool's state update", skip="context")
        text = trial.__pydantic_serializer__.to_json(trial, exclude={"context"}, warnings=False)
        state_cls.__pydantic_validator__.validate_json(text)
    except Exception as exc:  # noqa: BLE001 - any refusal is the reason given
        return f"{type(exc).__name__}: {exc}"
    return None


def _apply_update(state: AgentState, update: dict[str, Any], reduce: bool = False) -> None:
    """A ToolResult's state update; with ``reduce``, a field with an ``Annotated`` reducer gets
    ``reducer(current, value)`` (see ``merge_tool_state``)."""
    fields = type(state).model_fields
    for key, value in update.items():
        if key in fields and key not in ("context", "execution_meta"):
            reducer = field_reducer(type(state), key) if reduce else None
            setattr(state, key, value if reducer is None else reducer(getattr(state, key), value))


# The largest result message kept as the tool returned it. PostgreSQL's jsonb holds a string of
# at most 256 MiB: a larger result could never be recorded, its ledger write failed every time,
# and every resume of the thread ran the finished tool again.
MAX_RESULT_TEXT = 200 * 1024 * 1024


def _message_json(msg: Message) -> str:
    """A result message's JSON as the ledger keeps it: one pydantic call (its outputs are already
    JSON-safe, see ToolNode), where a dump to Python objects and ``json.dumps`` took two passes.
    Past ``MAX_RESULT_TEXT``, the message is an error result the model can read instead."""
    text = msg.__pydantic_serializer__.to_json(msg).decode()  # model_dump_json, unwrapped
    if len(text) <= MAX_RESULT_TEXT:
        return text
    call_id = msg.metadata.get("tool_call_id") or next(
        (b.call_id for b in msg.content if isinstance(b, ToolResultBlock)), "")
    _log.error("a tool's result is too large to store; the model gets an error result instead", extra={
        "event": "tool_result_too_large", "tool_call_id": call_id, "size": len(text)})
    block = ToolResultBlock(call_id=call_id, is_error=True, status="failed",
                            output=f"the tool's result is too large to store: {len(text)} characters of JSON, "
                                   f"at most {MAX_RESULT_TEXT}")
    small = msg.model_copy(update={"content": [block]})
    return small.__pydantic_serializer__.to_json(small).decode()


_ENVELOPE_HEAD = '{"__kind__":"message","value":'


def _envelope_text(message_json: str, state_json: str | None = None) -> str:
    """The ledger envelope, ``{"__kind__": "message", "value": <message>[, "state": <update>]}``,
    spliced from texts already encoded (the envelope is written once per call)."""
    if state_json is None:
        return _ENVELOPE_HEAD + message_json + "}"
    return _ENVELOPE_HEAD + message_json + ',"state":' + state_json + "}"


def _is_error(msg: Message) -> bool:
    return any(isinstance(b, ErrorBlock) or (isinstance(b, ToolResultBlock) and b.is_error) for b in msg.content)


def _result_message(call: _Call, output: Any, is_error: bool, code: str | None = None) -> Message:
    blocks: list[Any] = [ToolResultBlock(call_id=call.call_id or "", output=output, is_error=is_error,
                                         status="failed" if is_error else "completed")]
    if is_error and code:
        blocks.append(ErrorBlock(message=str(output), code=code))
    meta = {"function_name": call.name, "tool_call_id": call.call_id}
    return Message.tool_message(blocks, meta=meta)
