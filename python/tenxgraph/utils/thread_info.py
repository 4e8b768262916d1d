"""ThreadInfo: the descriptive row a checkpointer keeps per conversation thread."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ThreadInfo"]


class ThreadInfo(BaseModel):
    """A thread's row as 10xGraph's checkpointers give it: id, name, owner, metadata (None when
    there is none), the id of the run that last wrote it, and its times (``updated_at`` defaults to
    now)."""
    thread_id: str | int
    thread_name: str | None = None
    user_id: str | int | None = None
    # As 10xGraph's: no metadata is None (not {}), and a new ThreadInfo is stamped now.
    metadata: dict[str, Any] | None = None
    run_id: str | None = None
    updated_at: datetime | None = Field(default_factory=datetime.now)
    created_at: datetime | None = None
