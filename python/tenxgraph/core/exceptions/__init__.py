"""Structured exceptions of the tenxgraph runtime.

Every structured error carries a stable ``error_code`` (callers and the HTTP layer branch
on it, never on the message text) and a ``context`` dict. Constructing one logs it through
the ``tenxgraph.exceptions`` logger, as 10xGraph does, so failures are visible even when a
caller swallows the exception.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from tenxgraph.logs import run_logger

logger = run_logger("tenxgraph.exceptions")

__all__ = [
    "FailpointError",
    "ForkedProcessError",
    "GraphError",
    "GraphRecursionError",
    "GraphStopRequested",
    "InvalidConfigError",
    "MessageNotFoundError",
    "MetricsError",
    "NodeError",
    "NodeTimeoutError",
    "ResourceNotFoundError",
    "SchemaVersionError",
    "SerializationError",
    "StaleStateError",
    "StorageError",
    "ThreadBusyError",
    "LeaseLostError",
    "TransientStorageError",
]


def _restore(cls: type[BaseException], message: str) -> BaseException:
    # Unpickling must not run __init__ again: that would log a second time in the
    # receiving process. Attributes come back through the pickled __dict__.
    obj = cls.__new__(cls)
    BaseException.__init__(obj, message)
    return obj


class _StructuredError(Exception):
    """Shared behaviour of the coded errors; not part of the public API."""

    default_code: ClassVar[str] = ""
    log_level: ClassVar[int] = logging.ERROR

    def __init__(
        self,
        message: str,
        error_code: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message: str = message
        self.error_code: str = error_code or self.default_code
        # A dict, never None, so callers can read err.context["node_name"] without a guard.
        self.context: dict[str, Any] = context if context is not None else {}
        logger.log(
            self.log_level,
            "%s raised: %s (code: %s)",
            type(self).__name__,
            message,
            self.error_code,
            extra={"error_code": self.error_code, "error_context": self.context},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "error_type": type(self).__name__,
            "error_code": self.error_code,
            "message": self.message,
            "context": self.context,
        }

    def __str__(self) -> str:
        return f"[{self.error_code}] {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, "
            f"error_code={self.error_code!r}, context={self.context!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.message), self.__dict__)


class GraphError(_StructuredError):
    """A graph was built or run wrongly: GRAPH_002-004 (entry point, unreachable or unknown
    nodes), GRAPH_CHECKPOINTER_001 (a Python checkpointer without a tool ledger), GRAPH_ROUTING_001/002
    (a condition raised or named an unknown node). Base of the node, recursion, LLM and failpoint
    errors; see docs/error-codes.md. Picklable without logging again."""
    default_code = "GRAPH_000"

    def __init__(
        self, message: str, error_code: str = "GRAPH_000", context: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, error_code, context)


class NodeError(GraphError):
    """A node failed: NODE_001 (it raised, or returned what a node may not; the original is the
    ``__cause__``), NODE_002/003 (a ToolNode with no tool calls to run)."""
    default_code = "NODE_000"

    def __init__(
        self, message: str, error_code: str = "NODE_000", context: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, error_code, context)


class GraphRecursionError(GraphError):
    """RECURSION_001: the run reached ``recursion_limit`` node executions. What the run had
    committed stays; the next run gets a fresh budget."""
    default_code = "RECURSION_000"

    def __init__(
        self,
        message: str,
        error_code: str = "RECURSION_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class NodeTimeoutError(NodeError):
    """NODE_TIMEOUT_001: a node exceeded ``node_timeout`` and was cancelled; its step was not
    committed, so ``ainvoke({}, config)`` resumes it."""
    default_code = "NODE_TIMEOUT_000"

    def __init__(
        self,
        message: str,
        error_code: str = "NODE_TIMEOUT_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class FailpointError(GraphError):
    """A failpoint armed with ``raise`` fired (crash-replay tests; see tenxgraph.testing)."""

    default_code = "FAILPOINT_000"

    def __init__(
        self,
        message: str,
        error_code: str = "FAILPOINT_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class ForkedProcessError(GraphError, RuntimeError):
    """RUNTIME_FORKED_001: this process was forked from one where tenxgraph's runtime had
    started (gunicorn ``--preload`` after a run in the master, ``multiprocessing`` with the fork
    start method). The runtime's threads did not survive ``fork()``, so nothing of it can run
    here; raised at once instead of waiting for ever. A ``RuntimeError`` too, as it was before
    it had a code."""

    default_code = "RUNTIME_FORKED_001"

    def __init__(
        self,
        message: str,
        error_code: str = "RUNTIME_FORKED_001",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class StorageError(_StructuredError):
    """A store refused or failed an operation: STORAGE_001 (the step was not written),
    STORAGE_FORBIDDEN_001/002 (another user's thread; a message id used in another thread). Base
    of the other storage errors."""
    default_code = "STORAGE_000"

    def __init__(
        self, message: str, error_code: str = "STORAGE_000", context: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, error_code, context)


class TransientStorageError(StorageError):
    """A storage failure worth retrying (connection drop, timeout, pool exhausted)."""

    default_code = "STORAGE_TRANSIENT_000"

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_TRANSIENT_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class SerializationError(StorageError):
    """Kept for 10xGraph compatibility; the runtime does not raise it (STORAGE_SERIALIZATION_000)."""
    default_code = "STORAGE_SERIALIZATION_000"

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_SERIALIZATION_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class SchemaVersionError(StorageError):
    """STORAGE_SCHEMA_001: a schema migration failed (the message says why); ``tenxgraph migrate``
    retries it."""
    default_code = "STORAGE_SCHEMA_000"

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_SCHEMA_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class StaleStateError(StorageError):
    """Another execution committed a newer version first; the write changed nothing."""

    default_code = "STORAGE_CONFLICT_000"
    # An expected outcome of optimistic concurrency, not a fault.
    log_level = logging.WARNING

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_CONFLICT_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class ThreadBusyError(StorageError):
    """Another execution currently holds the thread."""

    default_code = "STORAGE_BUSY_000"
    # A concurrency conflict like StaleStateError, so the same level.
    log_level = logging.WARNING

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_BUSY_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class LeaseLostError(StorageError):
    """This run's lease on the thread was taken over by another execution (it was paused or cut
    off past its lease), could not be renewed, or the thread was deleted under the run: the write
    was refused and the run stopped; nothing more of it reaches the database. STORAGE_FENCED_001."""

    default_code = "STORAGE_FENCED_000"
    log_level = logging.WARNING

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_FENCED_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class ResourceNotFoundError(StorageError):
    """Kept for 10xGraph compatibility; the runtime does not raise it (STORAGE_NOT_FOUND_000)."""
    default_code = "STORAGE_NOT_FOUND_000"

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_NOT_FOUND_000",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class MessageNotFoundError(ResourceNotFoundError, IndexError, ValueError):
    """``aget_message`` / ``adelete_message`` of a message the thread does not hold
    (STORAGE_NOT_FOUND_001). An ``IndexError`` and a ``ValueError`` too: 10xGraph 0.10's
    in-memory and SQLite checkpointers raised ``IndexError`` there, its PgCheckpointer
    ``ValueError("Message not found: ...")``, so code written for either still catches it."""
    default_code = "STORAGE_NOT_FOUND_001"

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_NOT_FOUND_001",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class InvalidConfigError(StorageError, ValueError, TypeError):
    """A checkpointer call's ``config`` cannot name a thread: not a dict, or without a
    ``thread_id`` (STORAGE_CONFIG_001). Raised before anything is read or written. A
    ``ValueError`` and a ``TypeError`` too, the two 10xGraph 0.10 raised for these cases."""
    default_code = "STORAGE_CONFIG_001"

    def __init__(
        self,
        message: str,
        error_code: str = "STORAGE_CONFIG_001",
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_code, context)


class MetricsError(_StructuredError):
    """Kept for 10xGraph compatibility; the runtime does not raise it (METRICS_000)."""
    default_code = "METRICS_000"

    def __init__(
        self, message: str, error_code: str = "METRICS_000", context: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, error_code, context)


class GraphStopRequested(Exception):  # noqa: N818 - public name kept from 10xGraph
    """Control flow: a stop was requested for the running thread; the loop catches it."""

    def __init__(self, node_name: str | None = None) -> None:
        super().__init__(node_name)
        self.node_name: str | None = node_name

    def __str__(self) -> str:
        if self.node_name:
            return f"Stop requested during node '{self.node_name}'"
        return "Stop requested"

    def __repr__(self) -> str:
        return f"GraphStopRequested(node_name={self.node_name!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.node_name,))
