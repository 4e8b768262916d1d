"""Dynamic human-in-the-loop pauses: ``interrupt()`` inside a node or a tool.

The first call raises ``GraphInterrupt``; the run pauses and returns normally, and
``pending_interrupt(result["state"])`` tells what was asked. Resuming the thread with
``ainvoke({"resume": value}, config)`` runs the node again from its start; this time the same
``interrupt()`` call returns ``value``. Code before ``interrupt()`` therefore runs twice: put side
effects after it. In a tool node, sibling tools that finished before the pause are answered from
the ledger and do not run again.

Several calls in one node (or one tool) are answered in order: each has its own key,
``node:<name>:<n>`` or ``tool:<tool_call_id>:<n>``.
"""

from __future__ import annotations

import contextvars
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

__all__ = ["GraphInterrupt", "Interrupt", "interrupt", "pending_interrupt", "RESUME_ANSWERS_KEY"]

RESUME_ANSWERS_KEY = "interrupt_resume"


class Interrupt(BaseModel):
    id: str = Field(default_factory=lambda: "int_" + uuid.uuid4().hex)
    key: str
    node: str
    value: Any = None
    message: str | None = None
    reason: str = "input_required"
    response_schema: dict[str, Any] | None = None
    tool_call_id: str | None = None


class GraphInterrupt(BaseException):  # noqa: N818 - 10xGraph's name
    """Control flow, not an error: a BaseException so ``except Exception`` in user code lets it
    through to the runtime."""

    def __init__(self, interrupt: Interrupt) -> None:
        super().__init__(interrupt.message or interrupt.key)
        self.interrupt = interrupt


@dataclass
class _Scope:
    node: str
    answers: dict[str, Any]
    counters: dict[str, int] = field(default_factory=dict)
    tool_call_id: str | None = None


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("tenxgraph_interrupt_scope", default=None)


def activate(node: str, answers: dict[str, Any], tool_call_id: str | None = None) -> contextvars.Token[_Scope | None]:
    """Opens the scope for one node (or one tool call) in the current context."""
    return _SCOPE.set(_Scope(node, answers, tool_call_id=tool_call_id))


def deactivate(token: contextvars.Token[_Scope | None]) -> None:
    _SCOPE.reset(token)


def interrupt(
    value: Any = None,
    *,
    message: str | None = None,
    reason: str = "input_required",
    response_schema: dict[str, Any] | None = None,
) -> Any:
    """Pauses the run for a human answer; returns the answer once the thread is resumed."""
    scope = _SCOPE.get()
    if scope is None:
        raise RuntimeError("interrupt() can only be called while a graph node or tool is running")
    prefix = f"tool:{scope.tool_call_id}" if scope.tool_call_id else f"node:{scope.node}"
    index = scope.counters.get(prefix, 0)
    scope.counters[prefix] = index + 1
    key = f"{prefix}:{index}"
    if key in scope.answers:
        return scope.answers[key]
    raise GraphInterrupt(
        Interrupt(
            key=key,
            node=scope.node,
            value=value,
            message=message,
            reason=reason,
            response_schema=response_schema,
            tool_call_id=scope.tool_call_id,
        )
    )


def pending_interrupt(state: Any) -> Interrupt | None:
    """The question a paused thread is waiting on, or None."""
    meta = getattr(state, "execution_meta", None)
    if meta is None or meta.interrupt_reason != "interrupt" or not meta.is_interrupted():
        return None
    data = (meta.interrupt_data or {}).get("interrupt")
    return Interrupt.model_validate(data) if data else None
