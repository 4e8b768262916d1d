"""What a run takes in and hands out: the caller's input checked and copied, a node's return value
turned into messages, the response's copies and token usage."""

from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import BaseModel

from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.utils.interrupt import RESUME_ANSWERS_KEY

# The fields a caller's input_data['state'] may not set: the loop and the messages own them.
PROTECTED_FIELDS = frozenset({"context", "context_summary", "execution_meta"})


def added(state: AgentState, pre_ctx: list[Message], pre_len: int,
          pre_ids: set[Any] | None = None) -> list[Message]:
    """The messages a node added to ``state.context``, whose first ``pre_len`` messages of
    ``pre_ctx`` (with the ids ``pre_ids``, when known) were the context before it ran, by
    10xGraph's rule: the messages whose ids the context did not hold before, the first of each
    id, in order. A node that rewrote the history (trimmed, deleted, reordered, replaced or
    inserted a message) had its reply reported, streamed and handed to the hooks as nothing, and
    a summary put in place of the first message was never reported; one that appended a message
    under an id the context held, or two under one id, had them reported (red-team, session 37)."""
    ctx = state.context
    before = pre_ctx if len(pre_ctx) == pre_len else pre_ctx[:pre_len]
    # An identity-first list compare: ~1 ns per message while the node only appended.
    if len(ctx) >= pre_len and (ctx if len(ctx) == pre_len else ctx[:pre_len]) == before:
        candidates = ctx[pre_len:]
        if not candidates:
            return []
    else:
        candidates, pre_ids = ctx, None
    held = pre_ids if pre_ids is not None else {m.message_id for m in before}
    out: list[Message] = []
    seen: set[Any] = set()
    for m in candidates:
        mid = m.message_id
        if mid not in held and mid not in seen:
            seen.add(mid)
            out.append(m)
    return out


def clear_answers(state: AgentState | None) -> None:
    if state is not None:
        state.execution_meta.internal_data.pop(RESUME_ANSWERS_KEY, None)


def to_message(item: Any) -> Message:
    if isinstance(item, Message):
        return item
    if isinstance(item, str):
        return Message.text_message(item, role="assistant")
    raise ValueError(
        f"Unsupported content type {type(item).__name__!r} returned by a node: return a str, a Message, "
        "a list of them, the state, or a Command (a plain dict is not supported)"
    )


def require_state(value: Any) -> AgentState:
    if not isinstance(value, AgentState):
        raise ValueError(f"Command(state=...) must be an AgentState, got {type(value).__name__}")
    return value


def input_messages(input_data: Any) -> list[Message]:
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
            out.append(copy_message(m))
        elif isinstance(m, dict):
            out.append(Message.model_validate(m))
        else:
            raise ValueError(f"input_data['messages'] items must be Message objects, got {type(m).__name__}")
    return out


def copy_message(m: Message) -> Message:
    """A deep copy: a dump and a validation, half the time of ``model_copy(deep=True)``. Called
    on pydantic-core's serializer and validator directly: ``model_dump`` / ``model_validate`` are
    Python wrappers that only pass their defaults on."""
    out = type(m).__pydantic_validator__.validate_python(m.__pydantic_serializer__.to_python(m, round_trip=True))
    if isinstance(m.parsed_content, BaseModel):  # structured output stays the caller's model class
        out.parsed_content = m.parsed_content.model_copy(deep=True)
    return out


def copy_update_value(key: str, value: Any) -> Any:
    """A deep copy of an input ``"state"`` value (the state must not share objects with the
    caller); ValueError naming the key for a value that cannot be copied: nested past the
    recursion limit, or an object copy refuses (a generator, a lock, a socket), which was a raw
    TypeError ("cannot pickle 'generator' object")."""
    try:
        return copy.deepcopy(value)
    except RecursionError:
        raise ValueError(f"input 'state' key {key!r} is nested too deep to copy (past the interpreter's "
                         "recursion limit); nothing of it was stored") from None
    except (TypeError, copy.Error) as exc:
        raise ValueError(f"input 'state' key {key!r} cannot be copied into the state ({exc}): send plain "
                         "data; nothing of it was stored") from None


def state_update(input_data: dict[str, Any]) -> dict[str, Any]:
    update = input_data.get("state")
    if update is None:
        return {}
    if not isinstance(update, dict):
        raise ValueError("input_data['state'] must be a dict of state fields")
    return {k: v for k, v in update.items() if k not in PROTECTED_FIELDS and k != "current_node"}


def token_usage(messages: list[Message]) -> dict[str, int]:
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


# What int() reads as a plain decimal, in ASCII only: str.isdigit() is true of "²" too, whose int()
# raises (a message id "²" failed its step with "invalid literal for int()": red-team, session 25).
_DECIMAL = re.compile(r"-?[0-9]+")


def id_twin(mid: Any) -> Any:
    """The other Python value of the same id as stored (``7`` for ``"7"`` and the reverse: every
    store keys a message by ``str(message_id)``), or None."""
    if type(mid) is int:
        return str(mid)
    if type(mid) is str and _DECIMAL.fullmatch(mid):
        n = int(mid)
        return n if str(n) == mid else None  # "007" is stored as "007", never as 7's "7"
    return None


def refuse_id_twins(fresh: list[Message], ids: set[Any]) -> None:
    """ValueError when a message about to be written has an id that differs in Python from one the
    context holds but is the same id as stored (``7`` and ``"7"``: every store keys a message by
    ``str(message_id)``). The context kept both (``add_messages`` compares the ids themselves) and
    the store kept one: a message was lost without a word (memory, SQLite), or PostgreSQL failed
    the step. Looked up in the context's id set: no pass over the history."""
    for m in fresh:
        mid = m.message_id
        twin = id_twin(mid)
        if twin is not None and twin in ids:
            raise ValueError(f"message ids {twin!r} and {mid!r} are one id as stored ({str(mid)!r}): give each "
                             "message its own id. Nothing of this step was stored")
