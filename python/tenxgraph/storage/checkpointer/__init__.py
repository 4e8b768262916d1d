"""Checkpointers: where threads, state versions, messages and the tool ledger live."""

from tenxgraph.storage.checkpointer.base_checkpointer import (
    STATE_FORMAT_VERSION,
    STATE_META_KEY,
    STOP_REQUEST_NAMESPACE,
    STOP_REQUEST_TTL_SECONDS,
    BaseCheckpointer,
)
from tenxgraph.storage.checkpointer.in_memory_checkpointer import InMemoryCheckpointer
from tenxgraph.storage.checkpointer.pg_checkpointer import PgCheckpointer
from tenxgraph.storage.checkpointer.sqlite_checkpointer import SqliteCheckpointer

__all__ = [
    "BaseCheckpointer",
    "InMemoryCheckpointer",
    "PgCheckpointer",
    "STATE_FORMAT_VERSION",
    "STATE_META_KEY",
    "STOP_REQUEST_NAMESPACE",
    "STOP_REQUEST_TTL_SECONDS",
    "SqliteCheckpointer",
]
