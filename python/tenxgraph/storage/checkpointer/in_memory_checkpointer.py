"""InMemoryCheckpointer: process-local, same versioning and ledger rules as the durable stores."""

from __future__ import annotations

from typing import Any, TypeVar

from tenxgraph import _core
from tenxgraph.core.state.message import Message
from tenxgraph.storage.checkpointer.native_checkpointer import NativeCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo

__all__ = ["InMemoryCheckpointer"]


StateT = TypeVar("StateT")


class InMemoryCheckpointer(NativeCheckpointer[StateT]):
    """Keeps everything in this process: for tests and development. Nothing survives a restart."""

    def __init__(self, enforce_user_isolation: bool = False) -> None:
        super().__init__()
        self.enforce_user_isolation = enforce_user_isolation
        self._native = _core.NativeStore.memory(enforce_user_isolation)

    # -- return values as 10xGraph's InMemoryCheckpointer gives them ------------------------

    async def asetup(self) -> None:
        return None

    async def aput_messages(self, config: dict[str, Any], messages: list[Message],
                            metadata: dict[str, Any] | None = None) -> bool:
        await super().aput_messages(config, messages, metadata)
        return True

    async def aput_thread(self, config: dict[str, Any], thread_info: ThreadInfo) -> bool:
        await super().aput_thread(config, thread_info)
        return True

    async def aclear_cache_value(self, namespace: str, key: str) -> Any:
        """The value removed, or None when there was none. (10xGraph returns its internal
        ``(value, expires_at)`` pair; the value alone is what a caller can use.)"""
        value = await self.aget_cache_value(namespace, key)
        await super().aclear_cache_value(namespace, key)
        return value

    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """False for a thread that does not exist. (Another user's thread, under isolation,
        raises STORAGE_FORBIDDEN_001 as on every backend.)"""
        thread_id = config.get("thread_id") if isinstance(config, dict) else None
        if thread_id not in (None, "") and await self._native.thread_owner(str(thread_id), None) is None:
            return False
        return await super().aclean_thread(config)
