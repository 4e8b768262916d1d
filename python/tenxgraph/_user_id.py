"""Which user a config names: one rule for runs and every checkpointer call."""

from __future__ import annotations

from typing import Any

from tenxgraph.utils.constants import DEFAULT_ANONYMOUS_USER_ID

__all__ = ["user_id_of"]


def user_id_of(config: dict[str, Any] | None) -> Any:
    """``config["user_id"]`` as given, or the anonymous user when it is missing, None or "".
    ``0`` and ``False`` are ids (their text is what is stored): reading them as anonymous, as
    ``config.get("user_id") or ...`` did, hid a thread from the config its own run wrote it with."""
    user_id = (config or {}).get("user_id")
    return DEFAULT_ANONYMOUS_USER_ID if user_id is None or user_id == "" else user_id
