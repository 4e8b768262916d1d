"""Handoff tools: a tool call named ``transfer_to_<agent>`` sends the run to node ``<agent>``.

As in 10xGraph, a call is a handoff by its name, registered as a tool or not (except a tool of
that name you registered yourself that is not a handoff tool: it runs as itself). Unlike
10xGraph (which routed away without answering the call, leaving the assistant message with an
unanswered tool call that providers reject on the next model turn), the call goes through the
tool node like any other: it is answered with a tool result ("Handoff to <agent>"), recorded in
the ledger, and the node then routes to ``<agent>`` (``Command(goto=<agent>)``). Other calls of
the same message run too. With several handoffs in one message, the first one wins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import TextBlock, ToolResultBlock

__all__ = ["HANDOFF_PREFIX", "create_handoff_tool", "handoff_call_target", "handoff_message", "handoff_target",
           "is_handoff_tool"]

_log = logging.getLogger("tenxgraph.prebuilt")
HANDOFF_PREFIX = "transfer_to_"


def handoff_message(agent_name: str, tool_call_id: str) -> Message:
    """The tool result that answers a handoff call."""
    return Message.tool_message(
        [ToolResultBlock(call_id=tool_call_id, output=f"Handoff to {agent_name}", status="completed")],
        meta={"function_name": f"{HANDOFF_PREFIX}{agent_name}", "tool_call_id": tool_call_id, "handoff": agent_name},
    )


def create_handoff_tool(agent_name: str, description: str | None = None) -> Callable[..., Message]:
    """A tool named ``transfer_to_<agent_name>`` that hands the conversation to that node.

    Raises ``ValueError`` for an empty name and ``TypeError`` for a name that is not a str."""
    if not isinstance(agent_name, str):
        raise TypeError(f"agent_name must be str, got {type(agent_name)}")
    if not agent_name:
        raise ValueError("agent_name cannot be empty")
    if "_" in agent_name:
        _log.warning("agent_name '%s' contains underscores which may complicate pattern matching. "
                     "Consider using a simple name.", agent_name)
    tool_name = f"{HANDOFF_PREFIX}{agent_name}"

    def handoff_tool() -> Message:
        # Called directly (outside a graph), as 10xGraph's: a tool message naming the target. In
        # a graph the tool node answers the call itself (handoff_message) and routes.
        return Message.tool_message(content=[TextBlock(text=f"Handoff to {agent_name}")])

    handoff_tool.__name__ = tool_name
    handoff_tool.__qualname__ = tool_name
    handoff_tool.__doc__ = description or f"Transfer control to {agent_name} agent"
    handoff_tool.__handoff_tool__ = True  # type: ignore[attr-defined]
    handoff_tool.__target_agent__ = agent_name  # type: ignore[attr-defined]
    return handoff_tool


def is_handoff_tool(tool_name: str) -> tuple[bool, str | None]:
    """``(True, agent)`` for ``"transfer_to_<agent>"``, else ``(False, None)``."""
    if isinstance(tool_name, str) and tool_name.startswith(HANDOFF_PREFIX):
        target = tool_name[len(HANDOFF_PREFIX):]
        if target:
            return True, target
    return False, None


def handoff_call_target(tool_node: Any, name: str) -> str | None:
    """The agent a call of ``name`` hands off to on ``tool_node``, or None. A handoff by name,
    as in 10xGraph, unless the ToolNode has a tool of that name that is not a handoff tool:
    a tool you registered yourself as ``transfer_to_account`` runs as itself."""
    is_handoff, target = is_handoff_tool(name)
    if not is_handoff:
        return None
    fn = tool_node.get_tool(name)
    if fn is not None and not getattr(fn, "__handoff_tool__", False):
        return None
    # A SwarmAgent names its tools in lower case (10xGraph's names) for members whose node
    # names are upper case; the tool carries the node it goes to.
    return getattr(fn, "__target_node__", None) or target


def handoff_target(step: Any) -> str | None:
    """The agent the first handoff call of a tool step names, if any (a ``ToolStep``)."""
    for call in step.calls:
        target = handoff_call_target(step.tool_node, call.name)
        if target is not None:
            return target
    return None
