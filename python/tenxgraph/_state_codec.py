"""The stored form of a state: its JSON dump plus a class header under ``STATE_META_KEY``.

Both the run (which writes steps) and the checkpointers (which read and write whole states) use
it, so it lives below both: a checkpointer must not import the run to learn its own format.
"""

from __future__ import annotations

from typing import Any

from tenxgraph import _core
from tenxgraph.core.state.agent_state import AgentState

__all__ = ["STATE_META_KEY", "encode_state", "encode_state_meta"]

# The stores read it (the write mark lives in it), so the key is theirs.
STATE_META_KEY: str = _core.STATE_META_KEY


def encode_state_meta(state: AgentState) -> dict[str, Any]:
    """The header a stored state carries: the format version and the state's class name."""
    return {"format": 1, "class": type(state).__name__}


def encode_state(state: AgentState, *, with_context: bool) -> dict[str, Any]:
    """The stored form of a state: its JSON dump plus the class header. Steps store the context
    as message rows, so they leave it out."""
    data = state.model_dump(mode="json", exclude=None if with_context else {"context"})
    data[STATE_META_KEY] = encode_state_meta(state)
    return data
