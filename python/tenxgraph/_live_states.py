"""Live states kept between runs, so a thread's next turn in this process skips its history.

Loading a thread means reading every message and validating it back into pydantic objects: a
turn then costs O(history). A run that ended cleanly already holds the exact state it committed
last, so the graph keeps it here keyed by thread, with the version and the write mark of that
commit. The next run names that commit to the store (``known_version``/``known_mark``); the store
reads only the state row and, if it is still that commit, skips the messages and the run reuses
the object. With that commit's state row kept too (``row``, opaque to Python), a store that
checks the head in the input commit itself (Postgres) reads nothing before that commit. Any
other write to the thread (another process, ``aput_state``, a delete and re-create) changes the
latest row, the store reads everything as before, and the kept state is dropped: correctness
never depends on this cache, only the cost of a load does.

Only states nobody else holds a reference to are kept: runs answered with the default ``"low"``
response granularity, whose returned messages are copies. A run takes its thread's entry out
before it starts, so two runs can never share one live state. Code of the user's can still hold
the state after its run (a background task a node started, a hook, a node cancelled by ``stop()``
that is still in its cleanup): an entry is used only while the state still dumps to the text its
last commit wrote and its context still has that length and that last message (``unchanged``);
a stopped run's state is not kept at all, its cancelled node may still be running. Nor is the
state of a run that committed a value a load would give back changed (``Run.reshaped``: a tuple or
a datetime where the model declares ``Any``, see ``tenxgraph._round_trip``): the next turn must
see what a load gives, as it would in any other process.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tenxgraph.core.state.agent_state import AgentState

__all__ = ["LiveStates", "Held", "DEFAULT_LIVE_STATES", "resolve_limit"]

DEFAULT_LIVE_STATES = 256
# Besides the thread count, a bound on the messages held in all: a few huge threads must not
# pin gigabytes. About 1-2 KB of Python objects per message.
MAX_HELD_MESSAGES = 200_000

# (version, write mark, state, the run's context index for that state, that commit's state row
# as the engine wrote it: a _core.KeptState, or None, and what that commit wrote as Run.snapshot
# saw it: (state text, context length, last message), or None)
Held = tuple[int, str, "AgentState", Any, Any, Any]


def resolve_limit(value: Any) -> int:
    """``compile(live_states=...)``, else ``TENXGRAPH_LIVE_STATES``, else 256. 0 turns it off."""
    source = "live_states"
    if value is None:
        raw = os.environ.get("TENXGRAPH_LIVE_STATES")
        if raw is None or raw.strip() == "":
            return DEFAULT_LIVE_STATES
        source = "TENXGRAPH_LIVE_STATES"
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"TENXGRAPH_LIVE_STATES must be a whole number >= 0, got {raw!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{source} must be a whole number >= 0 (0 keeps no live state), got {value!r}")
    return value


class LiveStates:
    """A small LRU of ``Held`` per (thread_id, user_id)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: OrderedDict[tuple[str, str], Held] = OrderedDict()
        self._messages = 0
        # A graph may be run from several threads (the sync wrappers run their own loops).
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, key: tuple[str, str]) -> Held | None:
        """The thread's entry, taken out; None when there is none or its state changed since its
        commit (see ``unchanged``)."""
        with self._lock:
            held = self._take(key)
        return held if held is not None and unchanged(held) else None

    def _take(self, key: tuple[str, str]) -> Held | None:
        held = self._entries.pop(key, None)
        if held is not None:
            self._messages -= len(held[2].context)
        return held

    def keep(self, key: tuple[str, str], version: int, mark: str, state: AgentState, index: Any,
             row: Any = None, committed_as: Any = None) -> None:
        if self.limit == 0:
            return
        size = len(state.context)
        with self._lock:
            self._take(key)
            if size > MAX_HELD_MESSAGES:
                return
            self._entries[key] = (version, mark, state, index, row, committed_as)
            self._messages += size
            while len(self._entries) > self.limit or self._messages > MAX_HELD_MESSAGES:
                _, (_, _, old, _, _, _) = self._entries.popitem(last=False)
                self._messages -= len(old.context)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._messages = 0


def unchanged(held: Held) -> bool:
    """The kept state is still what its commit wrote: the same state text (one dump of the state
    without its messages, the size of a step's) and the same context length and last message
    object. A message edited in place is not seen (as at a step: see Run.snapshot)."""
    committed_as = held[5]
    if committed_as is None:
        return False
    from tenxgraph._state_codec import encode_state_text

    text, n, last = committed_as
    state = held[2]
    ctx = state.context
    if len(ctx) != n or (n and ctx[-1] is not last):
        return False
    try:
        return encode_state_text(state) == text
    except Exception:  # e.g. a NaN put in afterwards: not what was committed
        return False
