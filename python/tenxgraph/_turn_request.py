"""What a turn was asked with, kept with the thread for ``idempotent_turns``: the turn's last input
message id and a digest of its ``"state"`` update (of ``{}`` when it had none), as the client sent
them.

A resend carries the same update; the thread's values may not equal it any more, since a node of
that turn may have changed a field the update set. Without this record such a resend was a new
turn (and a model asked to pay paid again); with it, the resend of the turn the record names is
that turn. Kept in ``execution_meta.internal_data`` (committed with the input step, carried by
every later step) for the thread's last ``KEEP`` turns; a resend of an older one falls back on
comparing the values the thread holds."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic_core import to_jsonable_python

from tenxgraph.core.state.agent_state import AgentState

__all__ = ["KEEP", "TURN_REQUEST_KEY", "record", "recorded"]

TURN_REQUEST_KEY = "turn_request"
# Turns kept in the record: a resend of an older one is compared with the values the thread holds.
KEEP = 32


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


def _kept(state: AgentState) -> list[list[str]]:
    kept = state.execution_meta.internal_data.get(TURN_REQUEST_KEY)
    if not isinstance(kept, list):
        return []
    return [p for p in kept if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)]


def record(state: AgentState, message_id: Any, update: dict[str, Any]) -> None:
    """Keeps, in ``state``, that the turn whose last input message is ``message_id`` was asked
    with ``update`` (``{}`` for none: a resend with an update is then another request). The last
    ``KEEP`` turns are kept, oldest first (a list: PostgreSQL's jsonb does not keep an object's
    key order)."""
    key, digest = str(message_id), _digest(state, update)
    kept = [p for p in _kept(state) if p[0] != key]
    if digest is not None:
        kept.append([key, digest])
    state.execution_meta.internal_data[TURN_REQUEST_KEY] = kept[-KEEP:]


def recorded(state: AgentState, message_id: Any, update: dict[str, Any]) -> bool | None:
    """Whether the turn ending at ``message_id`` was asked with ``update``, as the thread's record
    says; None when the record does not hold that turn. The record decides where it holds it: the
    values the thread holds now may equal another update (a node set the field to what the
    resend says), or differ from the same one (a node changed it)."""
    key = str(message_id)
    kept = next((p[1] for p in _kept(state) if p[0] == key), None)
    if kept is None:
        return None
    digest = _digest(state, update)
    return digest is not None and kept == digest
