"""Message ids a run makes: a fresh one in place of an id it cannot keep (twins in one input, a
user message sent again), and the ids a thread gives the state prototype's messages.

A message id names one message of one thread in the store (PostgreSQL's ``messages`` table keys
on it alone), so the prototype's messages (a system prompt) cannot keep the prototype's ids in
every thread as 10xGraph's do. A new thread gives each a fresh id and keeps which prototype id
each stands for in its state (``internal_data["prototype_ids"]``): on every later turn, in any
process, a message that comes in under a prototype id (a frontend that sends the whole history;
a node that returns the prompt with its reply, or a state holding it) is the thread's copy,
deduplicated as 10xGraph deduplicates it, and a ``RemoveMessage`` naming it removes it. Fresh
ids, not ids derived from the thread's: a derived int id as narrow as an int schema's could be
another thread's for good (red-team, session 38), where a fresh one is drawn again by the retry."""

from __future__ import annotations

import secrets
from typing import Any

from tenxgraph.core.state.message import generate_id

PROTOTYPE_IDS_KEY = "prototype_ids"

_INT4_TOP = 2**31 - 1
_INT8_TOP = 2**63 - 1


def _int_kind(old: Any) -> int | None:
    """The int ``old`` stands for (an int, or its decimal text: an int-id PostgreSQL schema takes
    both), or None."""
    if isinstance(old, bool):
        return None
    if isinstance(old, int):
        return old
    if isinstance(old, str) and old.isascii() and old.isdigit():
        return int(old)
    return None


def fresh_id_like(old: Any, narrow: bool = True) -> Any:
    """A new message id in place of ``old``, of its kind: the id generator's, or where that gives
    a str for an int id (none installed; the caller sets int ids itself, as on a
    ``PgCheckpointer(id_type="bigint")``), a random positive int given as ``old`` was (an int, or
    its decimal text): 63 bits, or 31 where ``old`` fits them and the store may be ``narrow`` (an
    ``id_type="int"`` schema), so it fits the column ``old`` fit. A uuid text there was refused by
    the store (STORAGE_CONFIG_002; red-team, session 38)."""
    new = generate_id(None)
    old_int = _int_kind(old)
    if old_int is not None and not isinstance(new, int):
        n = secrets.randbelow(_INT4_TOP if narrow and old_int <= _INT4_TOP else _INT8_TOP) + 1
        new = str(n) if isinstance(old, str) else n
    return new


def narrow_ids(checkpointer: Any) -> bool:
    """Whether the store may hold message ids of 32 bits only (a ``PgCheckpointer(id_type="int")``);
    any other takes 63 bits, so fresh ints are drawn from those (a collision with another
    thread's id is that much less likely)."""
    return getattr(checkpointer, "id_type", None) == "int"


def name_prototype_copies(state: Any, narrow: bool = True) -> dict[Any, Any]:
    """Gives a new thread's copies of the prototype's messages (``state.context``) fresh ids and
    records which prototype id each stands for; returns that map (the first copy of an id
    stands for it: two prototype messages under one id are two messages of the thread)."""
    if not state.context:
        return {}
    pairs: dict[Any, Any] = {}
    for i, m in enumerate(state.context):
        new = fresh_id_like(m.message_id, narrow)
        pairs.setdefault(m.message_id, new)
        state.context[i] = m.model_copy(update={"message_id": new})
    _record(state, pairs)
    return pairs


def prototype_copies(state: Any) -> dict[Any, Any]:
    """The map a thread recorded when it started (empty for a thread that did not start from a
    prototype with messages: one seeded by ``aput_state``, or written by 10xGraph, holds the
    prototype's ids themselves, and they dedup as they are)."""
    pairs = state.execution_meta.internal_data.get(PROTOTYPE_IDS_KEY)
    if not isinstance(pairs, list):
        return {}
    return {p[0]: p[1] for p in pairs if isinstance(p, list) and len(p) == 2}


def keep_prototype_copies(state: Any, copies: dict[Any, Any]) -> None:
    """Puts the thread's map back into ``state`` before a commit when a node dropped it (a
    summarising node that returns a new ``AgentState``, one that clears ``internal_data``): the
    next turn read no map, the prompt it returned kept the prototype's id, and on PostgreSQL
    every other thread then failed on it (STORAGE_FORBIDDEN_002; red-team, session 38)."""
    if copies and PROTOTYPE_IDS_KEY not in state.execution_meta.internal_data:
        _record(state, copies)


def _record(state: Any, copies: dict[Any, Any]) -> None:
    """The map as the state keeps it: [old, new] pairs (a JSON object would make int ids text)."""
    state.execution_meta.internal_data[PROTOTYPE_IDS_KEY] = [[old, new] for old, new in copies.items()]


def as_thread_copies(messages: list[Any], copies: dict[Any, Any]) -> list[Any]:
    """``messages`` with each one under a prototype id renamed to the thread's copy of it (the
    same list when none is)."""
    if not copies or not any(m.message_id in copies for m in messages):
        return messages
    return [m.model_copy(update={"message_id": copies[m.message_id]}) if m.message_id in copies else m
            for m in messages]
