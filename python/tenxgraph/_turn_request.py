"""What a turn was asked with, kept with the thread for ``idempotent_turns``: the turn's last input
message id and a digest of its ``"state"`` update, as the client sent them.

A resend carries the same update; the thread's values may not equal it any more, since a node of
that turn may have changed a field the update set. Without this record such a resend was a new
turn (and a model asked to pay paid again); with it, the resend of the turn the record names is
that turn. Kept in ``execution_meta.internal_data`` (committed with the input step, carried by
every later step), one record per thread: a later turn with an update replaces it, and a resend
of an earlier turn falls back on comparing the values the thread holds."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic_core import to_jsonable_python

from tenxgraph.core.state.agent_state import AgentState

__all__ = ["TURN_REQUEST_KEY", "record", "recorded"]

TURN_REQUEST_KEY = "turn_request"


def _digest(state: AgentState, update: dict[str, Any]) -> str | None:
    """The update's fields (keys that are not fields are ignored, as the merge ignores them) as
    canonical JSON, hashed; None when it has no JSON form."""
    fields = type(state).model_fields
    try:
        text = json.dumps(to_jsonable_python({k: v for k, v in update.items() if k in fields}), sort_keys=True,
                          ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def record(state: AgentState, message_id: Any, update: dict[str, Any]) -> None:
    """Keeps, in ``state``, that the turn whose last input message is ``message_id`` was asked
    with ``update`` (or with none: an earlier turn's record is dropped)."""
    data = state.execution_meta.internal_data
    digest = _digest(state, update) if update else None
    if digest is None:
        data.pop(TURN_REQUEST_KEY, None)
    else:
        data[TURN_REQUEST_KEY] = {"message_id": str(message_id), "state": digest}


def recorded(state: AgentState, message_id: Any, update: dict[str, Any]) -> bool:
    """Whether the thread's record says the turn ending at ``message_id`` was asked with ``update``."""
    kept = state.execution_meta.internal_data.get(TURN_REQUEST_KEY)
    if not isinstance(kept, dict) or kept.get("message_id") != str(message_id):
        return False
    digest = _digest(state, update)
    return digest is not None and kept.get("state") == digest
