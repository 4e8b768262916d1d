"""A turn's per-run remote tools (``config["remote_tools"]``), kept with the thread.

They were known only from the config of the call that brought them: a run resumed without them
(``arecover()`` after a crash, ``recover_on_start``, the CLI, a plain ``ainvoke({})``) took the
client's call for a server tool it did not have and answered the model "Tool ... not found",
and the turn went on without the client ever being asked (red-team, session 36).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["REMOTE_TOOLS_KEY", "carry_remote_tools"]

# Under the state's ``execution_meta.internal_data``.
REMOTE_TOOLS_KEY = "remote_tools"


def carry_remote_tools(state: Any, config: dict[str, Any], new_turn: bool) -> None:
    """Keeps the run's remote tools with the thread's state, or, for a run that continues the
    thread's turn without naming them, puts the kept ones in its ``config``. A new turn without
    them drops what an earlier turn kept."""
    kept = state.execution_meta.internal_data
    sent = config.get("remote_tools")
    if sent:
        try:
            json.dumps(sent)
        except (TypeError, ValueError):
            return  # not storable: known to this call only, as before
        kept[REMOTE_TOOLS_KEY] = list(sent)
    elif new_turn:
        kept.pop(REMOTE_TOOLS_KEY, None)
    elif isinstance(kept.get(REMOTE_TOOLS_KEY), list) and kept[REMOTE_TOOLS_KEY]:
        config["remote_tools"] = list(kept[REMOTE_TOOLS_KEY])
