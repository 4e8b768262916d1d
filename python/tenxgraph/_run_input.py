"""The input side of ``tenxgraph._runtime.Run``: a resume checked against the question it
answers, a turn sent again recognised as one the thread holds, input messages under ids the
thread holds already.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

from pydantic_core import to_json

from tenxgraph import _turn_request as turn_request
from tenxgraph._context_index import ContextIndex
from tenxgraph._message_ids import fresh_id_like, id_type_of
from tenxgraph._run_values import id_twin
from tenxgraph._state_codec import STORED_DEPTH, core_refuses
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.execution_state import ExecutionStatus
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.reducers import RemoveMessage
from tenxgraph.utils.constants import END
from tenxgraph.utils.interrupt import RESUME_ANSWERS_KEY, check_answer, pending_interrupt

if TYPE_CHECKING:
    from tenxgraph.core.graph.compiled_graph import CompiledGraph

__all__ = ["RunInput", "stored_as_sent"]

# How JSON writes U+0000, and how Postgres gives it back (U+FFFD).
_NUL_JSON = "\\u0000".encode()
_NUL_AS_STORED = "\ufffd".encode()
# Where a resume value is kept: state > execution_meta > internal_data > answers > the value.
_ANSWER_AT_DEPTH = 4


def _as_stored(value: Any) -> bytes | None:
    """A value's JSON as a store gives it back (a NUL as U+FFFD), or None when it has none."""
    try:
        return to_json(value).replace(_NUL_JSON, _NUL_AS_STORED)
    except Exception:  # noqa: BLE001 (pydantic-core raises several kinds for values it cannot write)
        return None


def _same_as_stored(held: Any, sent: Any) -> bool:
    """Whether a state value the thread holds is what ``sent`` becomes once stored and loaded (a
    tuple comes back a list, a datetime a string where the field is ``Any``, a NUL as U+FFFD on
    PostgreSQL: the same value for a request sent again)."""
    if held == sent:
        return True
    sent_json = _as_stored(sent)
    return sent_json is not None and sent_json == _as_stored(held)


def stored_as_sent(kept: Message, sent: Message) -> bool:
    """Whether a message the thread holds under a sent message's id is that message as sent (a
    changed text under a stored id is new input). A NUL in a text comes back from PostgreSQL as
    U+FFFD (docs/bad-inputs.md): such a text is the one sent."""
    if kept.role != sent.role:
        return False
    if kept.content == sent.content:
        return True
    sent_json = to_json(sent.content)
    return _NUL_JSON in sent_json and to_json(kept.content) == sent_json.replace(_NUL_JSON, _NUL_AS_STORED)



class RunInput:
    """The input part of ``tenxgraph._runtime.Run`` (which sets these attributes)."""

    graph: CompiledGraph[Any]
    input_messages: list[Message]
    state_update: dict[str, Any]
    has_resume: bool
    resume_value: Any
    resume_for: Any
    start_node: str | None
    _index: ContextIndex

    if TYPE_CHECKING:  # Run's own

        def _log_fields(self, **more: str) -> dict[str, str]: ...

    def _replayed_turn(self, state: AgentState) -> tuple[Message, list[Message]] | None:
        """With ``config["idempotent_turns"]``: the input is a turn the thread holds, sent again
        (every message stored as sent: id, role and content; the last one a user message), on a
        thread that is not in the middle of a run: that turn's user message and what the thread
        holds after it, up to the next user message. A client's retry after a lost response, or
        two workers given one request, then get that turn instead of a second one (10xGraph's
        rule adds the message again and the model answers it twice: a payment asked for once
        could be made twice). A state update sent with it must match what the thread holds. A
        thread cut off mid-turn is resumed instead (``ainvoke`` does it), and so is one a request
        to go first stopped short (``"preempted"``); a failed one is not answered from the store
        (its turn is retried as 10xGraph does). Ids are compared as stored (``7`` is ``"7"``), and
        a NUL in a text as PostgreSQL gives it back."""
        if self.has_resume or self.start_node is not None:
            return None
        # A state update sent again is the same request where the thread holds its values, or
        # where the thread's record of the turn says it was asked with it (a node of the turn may
        # have changed a field the update set).
        asked = turn_request.recorded(state, self.input_messages[-1].message_id, self.state_update)
        if asked is False or (asked is None and any(
                not _same_as_stored(getattr(state, k), v) for k, v in self.state_update.items()
                if k in type(state).model_fields)):
            return None
        status = state.execution_meta.status
        if status not in (ExecutionStatus.COMPLETED, ExecutionStatus.INTERRUPTED_BEFORE,
                          ExecutionStatus.INTERRUPTED_AFTER):
            return None
        last = self.input_messages[-1]
        stored_ids = self._index.ids(state.context)
        if last.role != "user" or any(m.message_id not in stored_ids and id_twin(m.message_id) not in stored_ids
                                      for m in self.input_messages):
            return None  # a new message (the common case): no scan of the context
        ctx = state.context
        at = {str(m.message_id): i for i, m in enumerate(ctx)}
        if not all(stored_as_sent(ctx[at[str(m.message_id)]], m) for m in self.input_messages):
            return None
        start = at[str(last.message_id)]
        end = next((j for j in range(start + 1, len(ctx)) if ctx[j].role == "user"), len(ctx))
        if end == len(ctx) and state.execution_meta.interrupt_reason == "preempted":
            # Its turn, the thread's last, stopped short by a request to go first (on_busy=
            # "interrupt"; perhaps this one's): it goes on, and gets its reply, rather than being
            # answered cut short. An earlier turn sent again is answered as stored.
            return None
        return ctx[start], list(ctx[start + 1:end])

    def _rename_twins(self, state: AgentState) -> None:
        """Two new input messages under one id (a frontend's placeholder id on a history sent
        to a new thread): the later ones get new ids, so every one is stored. 10xGraph stores
        them all under the one id (its message list then holds the last one twice); the merge
        here kept the first and dropped the rest, and the model answered the first while the
        response showed the last."""
        stored = self._index.ids(state.context)
        seen: set[Any] = set()
        for i, m in enumerate(self.input_messages):
            if m.delta or isinstance(m, RemoveMessage) or m.message_id in stored:
                continue
            if m.message_id in seen:
                new = fresh_id_like(m.message_id, id_type_of(self.graph._checkpointer))
                self.input_messages[i] = m.model_copy(update={"message_id": new})
            else:
                seen.add(m.message_id)

    def _add_resent_user_message(self, state: AgentState) -> None:
        """Every input message's id was already in the thread (a frontend that sends the whole
        history with placeholder ids, or a turn sent again with the id of an earlier one): the
        last one, a user message, is added under a new id so the user is answered, as 10xGraph
        does. The run used to go on with the input dropped: the model answered the thread's last
        reply, and a new text under an old id was lost while the response showed it. Only where
        the thread's last turn is over (completed, failed, paused after its last node): on a
        thread paused or cut off mid-turn, a message sent again with its own id is the same turn
        being retried, and goes on as it was (10xGraph appends it there too, after a tool call
        with no result)."""
        last = self.input_messages[-1]
        meta = state.execution_meta
        over = meta.status in (ExecutionStatus.COMPLETED, ExecutionStatus.ERROR) or (
            meta.status == ExecutionStatus.INTERRUPTED_AFTER and meta.current_node == END)
        if not over or last.role != "user" or (state.context and state.context[-1].role == "user"):
            return
        new = fresh_id_like(last.message_id, id_type_of(self.graph._checkpointer))
        again = last.model_copy(update={"message_id": new})
        self._index.append(state, [again], keep_delta=True)  # 10xGraph adds it as it is, delta or not
        self.input_messages[-1] = again  # the response shows the message as stored
        self.graph._log.info("every input message's id was already in the thread; the last user message was "
                             "added again under a new id (%s)", again.message_id,
                             extra=self._log_fields(event="resent_user_message_added"))

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
            if self.resume_for is not None and self.resume_for != pending.id:
                raise ValueError(
                    f"the answer is for interrupt {self.resume_for!r}, but the thread waits at interrupt "
                    f"{pending.id!r} ({pending.key}): it was answered already; nothing was written"
                )
            check_answer(self.resume_value, pending.response_schema)
            try:
                # NaN and infinities too: JSON cannot hold them, and refused later (by the
                # state's commit) the run had already failed the paused thread.
                json.dumps(self.resume_value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"the resume value must be JSON-serialisable: {exc}") from exc
            except RecursionError:
                raise ValueError("the resume value is nested too deep to store; nothing was written") from None
            # What the state's JSON does not keep (an int past 64 bits came back a float to the
            # node's next run; a lone surrogate failed the commit with "not valid JSON").
            refused = core_refuses(self.resume_value, room=STORED_DEPTH - _ANSWER_AT_DEPTH)
            if refused is not None:
                raise ValueError(f"the resume value cannot be stored: it holds {refused}; nothing was written")
            answers = state.execution_meta.internal_data.setdefault(RESUME_ANSWERS_KEY, {})
            # A copy: interrupt() hands it to the node, which may keep it in the state, and that
            # state may be kept for the thread's next turn (tenxgraph._live_states); the caller's
            # object must not be part of it (as for input messages and ``state`` values).
            answers[pending.key] = copy.deepcopy(self.resume_value)
