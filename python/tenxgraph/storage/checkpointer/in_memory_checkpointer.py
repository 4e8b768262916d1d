"""InMemoryCheckpointer: process-local, same versioning and ledger rules as the durable stores."""

from __future__ import annotations

from typing import Any

from tenxgraph import _core
from tenxgraph.storage.checkpointer.base_checkpointer import BaseCheckpointer

__all__ = ["InMemoryCheckpointer"]


class InMemoryCheckpointer(BaseCheckpointer[Any]):
    """Keeps everything in this process: for tests and development. Nothing survives a restart."""

    def __init__(self, enforce_user_isolation: bool = False) -> None:
        super().__init__()
        self.enforce_user_isolation = enforce_user_isolation
        self._native = _core.NativeStore.memory(enforce_user_isolation)
