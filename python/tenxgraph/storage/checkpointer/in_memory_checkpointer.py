"""InMemoryCheckpointer: process-local, same versioning and ledger rules as the durable stores."""

from __future__ import annotations

from typing import Any, TypeVar

from tenxgraph import _core
from tenxgraph.storage.checkpointer._local_returns import LocalReturns
from tenxgraph.storage.checkpointer.native_checkpointer import NativeCheckpointer

__all__ = ["InMemoryCheckpointer"]


StateT = TypeVar("StateT")


class InMemoryCheckpointer(LocalReturns, NativeCheckpointer[StateT]):
    """Keeps everything in this process: for tests and development. Nothing survives a restart."""

    def __init__(self, enforce_user_isolation: bool = False) -> None:
        super().__init__()
        self.enforce_user_isolation = enforce_user_isolation
        self._native = _core.NativeStore.memory(enforce_user_isolation)

    # -- return values as 10xGraph's InMemoryCheckpointer gives them (and LocalReturns') ----

    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """False for a thread that does not exist. (Another user's thread, under isolation,
        raises STORAGE_FORBIDDEN_001 as on every backend.)"""
        thread_id = config.get("thread_id") if isinstance(config, dict) else None
        if thread_id not in (None, "") and await self._native.thread_owner(str(thread_id), None) is None:
            return False
        return await super().aclean_thread(config)
