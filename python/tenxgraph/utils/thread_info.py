"""ThreadInfo: the descriptive row a checkpointer keeps per conversation thread."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ThreadInfo"]


class ThreadInfo(BaseModel):
    thread_id: str | int
    thread_name: str | None = None
    user_id: str | int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    run_id: str | None = None
    updated_at: datetime | None = None
    created_at: datetime | None = None
