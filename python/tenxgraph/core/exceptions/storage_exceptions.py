"""The storage errors (10xGraph 0.10's module path; the classes live in :mod:`tenxgraph.core.exceptions`)."""

from tenxgraph.core.exceptions import (
    InvalidConfigError,
    LeaseLostError,
    MessageNotFoundError,
    MetricsError,
    ResourceNotFoundError,
    SchemaVersionError,
    SerializationError,
    StaleStateError,
    StorageError,
    ThreadBusyError,
    TransientStorageError,
)

__all__ = [
    "InvalidConfigError", "LeaseLostError", "MessageNotFoundError", "MetricsError", "ResourceNotFoundError",
    "SchemaVersionError", "SerializationError", "StaleStateError", "StorageError", "ThreadBusyError",
    "TransientStorageError",
]
