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
        self.execution_meta.set_interrupt(node, reason, status, data)

    def clear_interrupt(self) -> None:
        self.execution_meta.clear_interrupt()

    def is_running(self) -> bool:
        return self.execution_meta.is_running()

    def is_interrupted(self) -> bool:
        return self.execution_meta.is_interrupted()

    def advance_step(self) -> None:
        self.execution_meta.advance_step()

    def set_current_node(self, node: str) -> None:
        self.execution_meta.set_current_node(node)

    def complete(self) -> None:
        self.execution_meta.complete()

    def error(self, error_msg: str) -> None:
        self.execution_meta.error(error_msg)

    def is_stopped_requested(self) -> bool:
        return self.execution_meta.is_stopped_requested()
