"""A turn's per-run remote tools (``config["remote_tools"]``), kept with the thread.

They were known only from the config of the call that brought them: a run resumed without them
(``arecover()`` after a crash, ``recover_on_start``, the CLI, a plain ``ainvoke({})``) took the
client's call for a server tool it did not have and answered the model "Tool ... not found",
and the turn went on without the client ever being asked (red-team, session 36).

They are kept with the turn they came with (the id of its last user message, as each commit of
the turn sees it): a writer that does not know them (a process of the previous release during a
rolling deploy, 10xGraph, ``aput_state``) starts a new turn without dropping them, and the next
turn's recovery was offered the previous turn's client tools (red-team, session 37).
"""

from __future__ import annotations

import json
from typing import Any

from tenxgraph._state_codec import STORED_DEPTH, core_refuses

__all__ = ["REMOTE_TOOLS_KEY", "keep_remote_tools", "mark_remote_turn", "use_remote_tools"]

# Under the state's ``execution_meta.internal_data``: {"turn": <user message id>, "tools": [...]}.
REMOTE_TOOLS_KEY = "remote_tools"
# Where the tools are kept: state > execution_meta > internal_data > remote_tools > tools.
_KEPT_AT_DEPTH = 4


def _storable(tools: Any) -> bool:
    """Whether the state's commit can hold ``tools``: a list that JSON writes without NaN or an
    infinity, that the core reads back (no int past 64 bits, no lone surrogate), not nested too
    deep. Anything else failed the whole turn with STORAGE_SERIALIZATION_001, naming a field the
    user never set (second red-team, session 36)."""
    if not isinstance(tools, (list, tuple)):
        return False
    try:
        json.dumps(tools, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return core_refuses(tools, room=STORED_DEPTH - _KEPT_AT_DEPTH) is None


def _turn(state: Any) -> Any:
    """The thread's current turn: the id of its last user message."""
    return next((m.message_id for m in reversed(state.context) if m.role == "user"), None)


def use_remote_tools(state: Any, config: dict[str, Any], sent: Any, new_turn: bool) -> None:
    """Puts in the run's ``config`` the remote tools the caller ``sent`` (its
    ``config["remote_tools"]``, None when it named none), or, for a run that continues the
    thread's turn without naming them, those kept with that turn. Before the input is merged.

    ``config`` is set from ``sent`` first: the run may prepare twice (a start refused on a kept
    copy prepares again from a read), and what the first preparation put there is not the
    caller's (the previous turn's tools were offered to a new turn: second red-team)."""
    if sent is None:
        config.pop("remote_tools", None)
    else:
        config["remote_tools"] = sent
    if sent or new_turn:
        return
    kept = state.execution_meta.internal_data.get(REMOTE_TOOLS_KEY)
    if isinstance(kept, dict) and isinstance(kept.get("tools"), list) and kept["tools"] \
            and kept.get("turn") == _turn(state):  # still the turn its last commit saw (mark_remote_turn)
        config["remote_tools"] = list(kept["tools"])


def keep_remote_tools(state: Any, sent: Any, new_turn: bool) -> None:
    """Keeps the tools the caller sent with the thread's turn, once the input is merged; a new
    turn without them drops what an earlier turn kept. Tools the state cannot store serve this
    call only."""
    kept = state.execution_meta.internal_data
    if sent:
        if _storable(sent):
            kept[REMOTE_TOOLS_KEY] = {"turn": _turn(state), "tools": list(sent)}
        else:  # known to this call only, as before; an earlier turn's are not this turn's
            kept.pop(REMOTE_TOOLS_KEY, None)
    elif new_turn:
        kept.pop(REMOTE_TOOLS_KEY, None)


def mark_remote_turn(state: Any) -> None:
    """At each commit of a run, the kept tools name the thread's last user message as it is
    committed: a node of the turn that trimmed the turn's question out of the context (a window
    of the last messages) leaves an earlier user message last, or none, and the tools were then
    taken for an earlier turn's (second red-team pass, session 37). Another writer's later turn
    adds a user message no commit of this turn named."""
    kept = state.execution_meta.internal_data.get(REMOTE_TOOLS_KEY)
    if isinstance(kept, dict):
        kept["turn"] = _turn(state)
