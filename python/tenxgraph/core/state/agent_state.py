"""AgentState: the base pydantic state every graph runs on."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from tenxgraph.core.state.execution_state import ExecutionState, ExecutionStatus
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.reducers import add_messages
from tenxgraph.utils.constants import START

__all__ = ["AgentState"]


def _initial_execution_meta() -> ExecutionState:
    return ExecutionState(current_node=START)


class AgentState(BaseModel):
    """Base graph state. Subclass it to add fields; nodes mutate it in place.

    Deliberately neither frozen nor validated on assignment: in-place mutation is the
    normal node style and must stay cheap.
    """

    context: Annotated[list[Message], add_messages] = Field(default_factory=list)
    context_summary: str | None = None
    execution_meta: ExecutionState = Field(default_factory=_initial_execution_meta)

    def set_interrupt(
        self,
        node: str,
        reason: str,
        status: ExecutionStatus | str,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Marks the thread paused at ``node`` (``ExecutionState.set_interrupt`` on ``execution_meta``).
        Raises ValueError when ``status`` is not an ``ExecutionStatus`` value."""
        self.execution_meta.set_interrupt(node, reason, status, data)

    def clear_interrupt(self) -> None:
        """Clears the pause and sets the status back to RUNNING (``ExecutionState.clear_interrupt``)."""
        self.execution_meta.clear_interrupt()

    def is_running(self) -> bool:
        """True only while ``execution_meta.status`` is RUNNING."""
        return self.execution_meta.is_running()

    def is_interrupted(self) -> bool:
        """True while paused before or after a node (INTERRUPTED_BEFORE / INTERRUPTED_AFTER)."""
        return self.execution_meta.is_interrupted()

    def advance_step(self) -> None:
        """Adds one to ``execution_meta.step``. Inside a run the loop counts steps itself and
        rewrites ``execution_meta`` before each commit, so a node's call is not stored."""
        self.execution_meta.advance_step()

    def set_current_node(self, node: str) -> None:
        """Sets ``execution_meta.current_node``. Inside a run the loop owns ``execution_meta`` and
        rewrites it before each commit, so a node's call is not stored."""
        self.execution_meta.set_current_node(node)

    def complete(self) -> None:
        """Sets the status to COMPLETED. Inside a run the loop owns ``execution_meta`` and rewrites
        it before each commit, so a node's call is not stored."""
        self.execution_meta.complete()

    def error(self, error_msg: str) -> None:
        """Sets the status to ERROR and keeps ``error_msg`` in ``execution_meta.internal_data["error"]``."""
        self.execution_meta.error(error_msg)

    def is_stopped_requested(self) -> bool:
        """True while a stop request is pending (``ExecutionState.is_stopped_requested``)."""
        return self.execution_meta.is_stopped_requested()
