"""Return values 10xGraph 0.10's in-memory and SQLite checkpointers give (its Postgres one gives
others: ``pg_checkpointer``), written once for both of ours."""

from __future__ import annotations

from typing import Any

from tenxgraph.core.state.message import Message
from tenxgraph.storage.checkpointer.native_checkpointer import NativeCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo

__all__ = ["LocalReturns"]


class LocalReturns(NativeCheckpointer[Any]):
    async def asetup(self) -> None:
        await super().asetup()  # opens it: a SQLite file is created and migrated on first use
        return None

    async def aput_messages(self, config: dict[str, Any], messages: list[Message],
                            metadata: dict[str, Any] | None = None) -> bool:
        await super().aput_messages(config, messages, metadata)
        return True

    async def aput_thread(self, config: dict[str, Any], thread_info: ThreadInfo) -> bool:
        await super().aput_thread(config, thread_info)
        return True

    async def aclear_cache_value(self, namespace: str, key: str) -> Any:
        """The value removed, or None when there was none. (10xGraph's in-memory checkpointer
        returns its internal ``(value, expires_at)`` pair; the value alone is what a caller can
        use.)"""
        value = await self.aget_cache_value(namespace, key)
        await super().aclear_cache_value(namespace, key)
        return value
