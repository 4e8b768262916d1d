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
from collections.abc import Callable
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


def fresh_id_like(old: Any, id_type: str = "int") -> Any:
    """A new message id in place of ``old``, of its kind: the id generator's, or where that gives
    a str for an int id (none installed; the caller sets int ids itself, as on a
    ``PgCheckpointer(id_type="bigint")``), a random positive int given as ``old`` was (an int, or
    its decimal text). Also an int for any ``old`` where the store keeps int ids only
    (``id_type`` "int" or "bigint", see ``id_type_of``): a prototype's message built without an
    id got a uuid there, and the first turn was refused (STORAGE_CONFIG_002; seventh pass,
    session 39). 31 bits where the column may be ``int`` and ``old`` fits them (a uuid text there
    was refused too; red-team, session 38), 63 otherwise."""
    new = generate_id(None)
    if isinstance(new, int):
        return new
    old_int = _int_kind(old)
    if old_int is None and id_type == "string":
        return new
    narrow = id_type == "int" and (old_int is None or old_int <= _INT4_TOP)
    n = secrets.randbelow(_INT4_TOP if narrow else _INT8_TOP) + 1
    return str(n) if isinstance(old, str) and old_int is not None else n


def id_type_of(checkpointer: Any) -> str:
    """The store's message id column: "int" or "bigint" (a ``PgCheckpointer(id_type=...)``), or
    "string" (any other store, whose ids of any kind fit)."""
    kind = getattr(checkpointer, "id_type", None)
    return kind if kind in ("int", "bigint") else "string"


class ThreadCopies:
    """A thread's ids for prototype ids: those it recorded (``pairs``), and those of this
    process's prototype it has not met yet (``unnamed``), named when a message first comes in
    under one. The recorded ids were the ids of the process that started the thread; a
    prototype built without ids (``Message.text_message(...)``) has other ids in every process,
    and a deploy can change them. Unnamed, the prompt a node returned in another process was
    stored under that process's id, and on PostgreSQL every other thread doing so failed
    (STORAGE_FORBIDDEN_002; seventh pass, session 39). A new name is a message of its own, as
    in 10xGraph, where that id is not the thread's prompt's either."""

    __slots__ = ("pairs", "_unnamed", "_id_type", "grown")

    def __init__(self, pairs: dict[Any, Any], unnamed: set[Any] | None = None, id_type: str = "int") -> None:
        self.pairs = pairs
        self._unnamed = unnamed or set()
        self._id_type = id_type
        self.grown = False  # a name was added since the thread's map was read

    def __bool__(self) -> bool:
        return bool(self.pairs) or bool(self._unnamed)

    def __contains__(self, mid: Any) -> bool:
        return mid in self.pairs or mid in self._unnamed

    def __getitem__(self, mid: Any) -> Any:
        if mid in self.pairs:
            return self.pairs[mid]
        new = self.pairs[mid] = fresh_id_like(mid, self._id_type)
        self._unnamed.discard(mid)
        self.grown = True
        return new


def name_prototype_copies(state: Any, id_type: str = "int") -> ThreadCopies:
    """Gives a new thread's copies of the prototype's messages (``state.context``) fresh ids and
    records which prototype id each stands for; returns that map (the first copy of an id
    stands for it: two prototype messages under one id are two messages of the thread)."""
    pairs: dict[Any, Any] = {}
    for i, m in enumerate(state.context):
        new = fresh_id_like(m.message_id, id_type)
        pairs.setdefault(m.message_id, new)
        state.context[i] = m.model_copy(update={"message_id": new})
    if pairs:
        _record(state, pairs)
    return ThreadCopies(pairs, id_type=id_type)


def prototype_copies(state: Any, prototype: list[Any], held: Callable[[], set[Any]],
                     id_type: str = "int") -> ThreadCopies:
    """The map a thread recorded when it started, with this process's ``prototype`` ids it
    lacks left to name, unless the thread holds one itself (``held()``, the ids of its
    messages: a thread seeded by ``aput_state``, or written by 10xGraph, holds the prototype's
    ids, and they dedup as they are)."""
    stored = state.execution_meta.internal_data.get(PROTOTYPE_IDS_KEY)
    pairs = {p[0]: p[1] for p in stored if isinstance(p, list) and len(p) == 2} if isinstance(stored, list) else {}
    unnamed = {m.message_id for m in prototype} - pairs.keys()
    if unnamed:
        unnamed -= held()
    return ThreadCopies(pairs, unnamed, id_type)


def keep_prototype_copies(state: Any, copies: ThreadCopies) -> None:
    """Puts the thread's map into ``state`` before a commit when a node dropped it (a
    summarising node that returns a new ``AgentState``, one that clears ``internal_data``: the
    next turn read no map, the prompt it returned kept the prototype's id, and on PostgreSQL
    every other thread then failed on it; red-team, session 38), or when it named a prototype id
    of this process. Recorded without the pairs whose copy the thread no longer holds: every
    process names its own id once, and a summarising node drops the last one's copy, so the map
    grew by a pair per process for ever (82 bytes each, rewritten at every step: a turn 6x
    slower at 1,000; eighth pass, session 39). A message that comes in later under a dropped
    pair's id is named again, a message of its own, as it was with the pair (its copy was gone).
    This run keeps every pair it has (``copies.pairs``), so none of its ids is stored as it is."""
    if copies.pairs and (copies.grown or PROTOTYPE_IDS_KEY not in state.execution_meta.internal_data):
        held = {m.message_id for m in state.context}
        _record(state, {old: new for old, new in copies.pairs.items() if new in held})


def _record(state: Any, copies: dict[Any, Any]) -> None:
    """The map as the state keeps it: [old, new] pairs (a JSON object would make int ids text)."""
    state.execution_meta.internal_data[PROTOTYPE_IDS_KEY] = [[old, new] for old, new in copies.items()]


def as_thread_copies(messages: list[Any], copies: ThreadCopies) -> list[Any]:
    """``messages`` with each one under a prototype id renamed to the thread's copy of it (the
    same list when none is)."""
    if not copies or not any(m.message_id in copies for m in messages):
        return messages
    return [m.model_copy(update={"message_id": copies[m.message_id]}) if m.message_id in copies else m
            for m in messages]
