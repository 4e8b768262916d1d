"""A turn's per-run remote tools (``config["remote_tools"]``), kept with the thread.

They were known only from the config of the call that brought them: a run resumed without them
(``arecover()`` after a crash, ``recover_on_start``, the CLI, a plain ``ainvoke({})``) took the
client's call for a server tool it did not have and answered the model "Tool ... not found",
and the turn went on without the client ever being asked (red-team, session 36).
"""

from __future__ import annotations

import json
from typing import Any

from tenxgraph._state_codec import STORED_DEPTH, core_refuses

__all__ = ["REMOTE_TOOLS_KEY", "carry_remote_tools"]

# Under the state's ``execution_meta.internal_data``.
REMOTE_TOOLS_KEY = "remote_tools"
# Where the tools are kept: state > execution_meta > internal_data > remote_tools.
_KEPT_AT_DEPTH = 3


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


def carry_remote_tools(state: Any, config: dict[str, Any], sent: Any, new_turn: bool) -> None:
    """Keeps the remote tools the caller ``sent`` (its ``config["remote_tools"]``, None when it
    named none) with the thread's state; for a run that continues the thread's turn without
    naming them, puts the kept ones in its ``config``. A new turn without them drops what an
    earlier turn kept.

    ``config`` is set from ``sent`` first: the run may prepare twice (a start refused on a kept
    copy prepares again from a read), and what the first preparation put there is not the
    caller's (the previous turn's tools were offered to a new turn: second red-team)."""
    kept = state.execution_meta.internal_data
    if sent is None:
        config.pop("remote_tools", None)
    else:
        config["remote_tools"] = sent
    if sent:
        if _storable(sent):
            kept[REMOTE_TOOLS_KEY] = list(sent)
        else:  # known to this call only, as before; an earlier turn's are not this turn's
            kept.pop(REMOTE_TOOLS_KEY, None)
    elif new_turn:
        kept.pop(REMOTE_TOOLS_KEY, None)
    elif isinstance(kept.get(REMOTE_TOOLS_KEY), list) and kept[REMOTE_TOOLS_KEY]:
        config["remote_tools"] = list(kept[REMOTE_TOOLS_KEY])
