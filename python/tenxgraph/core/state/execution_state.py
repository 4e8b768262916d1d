"""ExecutionState: where a thread is in its graph, and whether it is paused, done or failed."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from tenxgraph.utils.constants import START

__all__ = ["ExecutionState", "ExecutionStatus", "StopRequestStatus"]


class ExecutionStatus(StrEnum):
    """Where a thread's run stands; stored as its string value, 10xGraph's names and values."""
    RUNNING = "running"
    INTERRUPTED_BEFORE = "interrupted_before"
    INTERRUPTED_AFTER = "interrupted_after"
    COMPLETED = "completed"
    ERROR = "error"


class StopRequestStatus(StrEnum):
    """A thread's stop request: none, requested (pending: the run has not honoured it yet), stopped."""
    NONE = "none"
    STOP_REQUESTED = "stop_requested"
    STOPPED = "stopped"


_INTERRUPTED = frozenset({ExecutionStatus.INTERRUPTED_BEFORE, ExecutionStatus.INTERRUPTED_AFTER})


class ExecutionState(BaseModel):
    """Per-thread run bookkeeping, persisted inside the state as ``execution_meta``.

    ``internal_data`` is runtime scratch space: ``"error"`` (last failure message) and
    ``"interrupt_resume"`` (resume answers keyed by interrupt key) are used by the core.
    """

    current_node: str
    step: int = 0
    status: ExecutionStatus = ExecutionStatus.RUNNING
    interrupted_node: str | None = None
    interrupt_reason: str | None = None
    interrupt_data: dict[str, Any] | None = None
    # int accepted too: checkpointers take int thread ids (Postgres coerces them).
    thread_id: str | int | None = None
    stop_current_execution: StopRequestStatus = StopRequestStatus.NONE
    internal_data: dict[str, Any] = Field(default_factory=dict)

    def set_interrupt(
        self,
        node: str,
        reason: str,
        status: ExecutionStatus | str,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Records a pause at ``node`` with ``reason``, ``status`` (INTERRUPTED_BEFORE or _AFTER) and
        ``data``. Raises ValueError when ``status`` is not an ``ExecutionStatus`` value, and then
        sets nothing."""
        checked = ExecutionStatus(status)
        self.interrupted_node = node
        self.interrupt_reason = reason
        self.status = checked
        self.interrupt_data = data

    def clear_interrupt(self) -> None:
        """Forgets the pause (node, reason, data) and sets the status to RUNNING."""
        self.interrupted_node = None
        self.interrupt_reason = None
        self.interrupt_data = None
        self.status = ExecutionStatus.RUNNING

    def is_running(self) -> bool:
        """True only while RUNNING: an interrupted, completed or failed thread is not."""
        return self.status == ExecutionStatus.RUNNING

    def is_interrupted(self) -> bool:
        """True while INTERRUPTED_BEFORE or INTERRUPTED_AFTER."""
        return self.status in _INTERRUPTED

    def advance_step(self) -> None:
        """Adds one to ``step``."""
        self.step += 1

    def set_current_node(self, node: str) -> None:
        """Sets ``current_node``."""
        self.current_node = node

    def complete(self) -> None:
        """Sets the status to COMPLETED."""
        self.status = ExecutionStatus.COMPLETED

    def error(self, error_msg: str) -> None:
        """Sets the status to ERROR and keeps ``error_msg`` under ``internal_data["error"]``."""
        self.status = ExecutionStatus.ERROR
        self.internal_data["error"] = error_msg

    def is_stopped_requested(self) -> bool:
        """True while a stop is pending; once honoured the flag reads STOPPED instead."""
        return self.stop_current_execution == StopRequestStatus.STOP_REQUESTED

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutionState:
        """Build from a dict in either the current dump shape or the legacy one, whose
        scratch space is named ``_internal_data``."""
        internal = data.get("internal_data")
        if internal is None:
            internal = data.get("_internal_data")
        return cls.model_validate(
            {
                "current_node": data.get("current_node", START),
                "step": data.get("step", 0),
                "status": data.get("status", ExecutionStatus.RUNNING),
                "interrupted_node": data.get("interrupted_node"),
                "interrupt_reason": data.get("interrupt_reason"),
                "interrupt_data": data.get("interrupt_data"),
                "thread_id": data.get("thread_id"),
                "stop_current_execution": data.get(
                    "stop_current_execution", StopRequestStatus.NONE
                ),
                "internal_data": dict(internal or {}),
            }
        )
