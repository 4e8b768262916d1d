"""Message ids a run makes: a fresh one in place of an id it cannot keep (twins in one input, a
user message sent again), and the ids a thread gives the state prototype's messages.

A message id names one message of one thread in the store (PostgreSQL's ``messages`` table keys
on it alone), so the prototype's messages (a system prompt) cannot keep the prototype's ids in
every thread as 10xGraph's do. Each thread names them with ids derived from the thread's id and
the prototype's: the same on every turn and in every process, so a message sent again under the
prototype's id (a frontend that sends the whole history; a node that returns the prompt with its
reply) is that thread's copy, deduplicated as 10xGraph deduplicates it, and a ``RemoveMessage``
naming it removes it."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Iterable
from typing import Any

from tenxgraph.core.state.message import generate_id

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


def _as_kind(old: Any, n: int) -> Any:
    return str(n) if isinstance(old, str) else n


def _top(old_int: int) -> int:
    """As wide as ``old``, so that the new id fits the column the old one fit (31 bits for an
    "int" schema's ids, 63 for "bigint")."""
    return _INT4_TOP if old_int <= _INT4_TOP else _INT8_TOP


def fresh_id_like(old: Any) -> Any:
    """A new message id in place of ``old``, of its kind: the id generator's, or where that gives
    a str for an int id (none installed; the caller sets int ids itself, as on a
    ``PgCheckpointer(id_type="bigint")``), a random positive int as wide as ``old``, given as
    ``old`` was (an int, or its decimal text). A uuid text there was refused by the store
    (STORAGE_CONFIG_002; red-team, session 38)."""
    new = generate_id(None)
    old_int = _int_kind(old)
    if old_int is not None and not isinstance(new, int):
        new = _as_kind(old, secrets.randbelow(_top(old_int)) + 1)
    return new


def thread_copy_id(thread_id: Any, old: Any) -> Any:
    """The id the thread ``thread_id`` gives the prototype's message ``old``: derived from both,
    of ``old``'s kind (an int as wide, or its decimal text; else a uuid text)."""
    # As text: the store names a thread (and a message) by its id's text, so 7 and "7" are one.
    digest = hashlib.sha256(f"{thread_id}\x00{old}".encode("utf-8", "surrogatepass")).digest()
    old_int = _int_kind(old)
    if old_int is None and isinstance(generate_id(None), int):
        old_int = _INT8_TOP  # an int generator is installed: the store takes ints
    if old_int is not None:
        return _as_kind(old, int.from_bytes(digest[:8], "big") % _top(old_int) + 1)
    return str(uuid.UUID(bytes=digest[:16], version=5))


def prototype_ids(messages: Iterable[Any]) -> frozenset[Any]:
    """The ids of the prototype's messages (an empty set for most graphs)."""
    return frozenset(m.message_id for m in messages)


def as_thread_copies(messages: list[Any], proto: frozenset[Any], thread_id: Any) -> list[Any]:
    """``messages`` with each one under a prototype id renamed to the thread's copy of it (the
    same list when none is)."""
    if not proto or not any(m.message_id in proto for m in messages):
        return messages
    return [m.model_copy(update={"message_id": thread_copy_id(thread_id, m.message_id)}) if m.message_id in proto else m
            for m in messages]
