"""One executed tool call as the node handler gets it (``ToolOutcome``), made from whatever the
tool returned or raised: a ``ToolResult`` (its state update kept), a ``Message`` of its own, any
other value (shaped by ``tool_output``), or an exception (an error result the model can read)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenxgraph import _core
from tenxgraph.core.graph.tool_output import _normalise_output, shape_plain_result
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import ErrorBlock, ToolResultBlock
from tenxgraph.core.state.tool_result import ToolResult
from tenxgraph.logs import run_logger

__all__ = ["ToolOutcome", "failure", "map_result", "returned"]

_log = run_logger("tenxgraph.graph.tool_node")


@dataclass
class ToolOutcome:
    """One executed call: the tool message, the ToolResult state update (if any), and
    whether the node handler may record it in the tool ledger."""

    message: Message
    state_update: dict[str, Any] | None = None
    recordable: bool = True


def failure(name: str, tool_call_id: str, meta: dict[str, Any], exc: Exception) -> ToolOutcome:
    """A call that raised: an error result the model reads, recorded like any other."""
    _log.warning("tool '%s' (call %s) failed: %r", name, tool_call_id, exc, extra={"tool": name})
    error = Message.tool_message(
        [
            ToolResultBlock(
                call_id=tool_call_id,
                output=f"Internal execution error: {exc}",
                status="failed",
                is_error=True,
            ),
            # 10xGraph's text; the exception's class name is ours, added as its code.
            ErrorBlock(message=f"Internal execution error: {exc}", code=type(exc).__name__),
        ],
        meta=meta,
    )
    return ToolOutcome(error)


def map_result(
    result: Any, tool_call_id: str, meta: dict[str, Any]
) -> tuple[ToolOutcome, bool]:
    """A call that returned ``result``, and whether it was a ``ToolResult`` (``ToolNode.invoke``
    then answers in 10xGraph's ``{"state", "messages"}`` shape)."""
    if isinstance(result, ToolResult):
        block = ToolResultBlock(
            call_id=tool_call_id,
            output=_normalise_output(result.message),
            status="failed" if result.is_error else "completed",
            is_error=result.is_error,
        )
        return ToolOutcome(Message.tool_message([block], meta=meta), result.state), True
    if isinstance(result, Message):
        # Its result blocks follow the rule for plain results: the stored JSON must hold them.
        # The message answers this call: a role other than "tool", or another call's id in its
        # metadata or result blocks, left this call unanswered (10xGraph the same), which every
        # provider refuses on each later request of the thread.
        if result.role != "tool" or result.metadata.get("tool_call_id", tool_call_id) != tool_call_id or any(
                isinstance(b, ToolResultBlock) and b.call_id != tool_call_id for b in result.content):
            _log.warning("tool %s returned a %s message naming another call; it is stored as the answer to "
                         "call %s", meta.get("function_name"), result.role, tool_call_id,
                         extra={"event": "tool_message_rebound"})
        content = [
            b.model_copy(update={"output": _normalise_output(b.output), "call_id": tool_call_id})
            if isinstance(b, ToolResultBlock) else b
            for b in result.content
        ]
        merged = result.model_copy(update={"metadata": {**meta, **result.metadata, "tool_call_id": tool_call_id},
                                           "content": content,
                                           "role": "tool"})
        found, _ = _core.dump_walk(merged)
        if found is not None:
            # Its other fields are the tool's to set: a NaN there has no stored form, and
            # pydantic would write it as null. The tool ran, so the model gets an error
            # result it can read (recorded like any other) instead of a silent null.
            block = ToolResultBlock(
                call_id=tool_call_id, is_error=True, status="failed",
                output=f"the tool's result message cannot be stored: {found[0]} is {found[1]}, "
                       "which JSON cannot hold",
            )
            return ToolOutcome(Message.tool_message([block], meta=meta)), False
        return ToolOutcome(merged), False
    output, failed = shape_plain_result(result)
    block = ToolResultBlock(
        call_id=tool_call_id, output=output, status="failed" if failed else "completed", is_error=failed
    )
    return ToolOutcome(Message.tool_message([block], meta=meta)), False


def returned(on_return: Callable[[Callable[[], ToolOutcome]], None] | None, raw: Any,
              tool_call_id: str, meta: dict[str, Any]) -> None:
    """Tells the node handler the tool returned, before any callback runs after it: a run cut off
    from here on records the call as the tool returned it (built only if it is needed)."""
    if on_return is not None:
        on_return(lambda: map_result(raw, tool_call_id, meta)[0])
