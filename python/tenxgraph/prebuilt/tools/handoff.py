"""Handoff tools: a tool call named ``transfer_to_<agent>`` sends the run to node ``<agent>``.

As in 10xGraph, a call is a handoff by its name, registered as a tool or not (except a tool of
that name you registered yourself that is not a handoff tool: it runs as itself). Unlike
10xGraph (which routed away without answering the call, leaving the assistant message with an
unanswered tool call that providers reject on the next model turn), the call goes through the
tool node like any other: it is answered with a tool result ("Handoff to <agent>"), recorded in
the ledger, and the node then routes to ``<agent>`` (``Command(goto=<agent>)``). Other calls of
the same message run too. With several handoffs in one message, the first one wins.

A call is a handoff only to an agent node of the graph (session 31): to a node that does not
exist, a tool node, or END, or (on a ToolNode that has handoff tools of its own, a SwarmAgent
member's) past those tools, it is an unknown tool like any other, answered "Tool '...' not
found." for the model to read. Before, a model's made-up ``transfer_to_savings`` on a plain
ReactAgent was answered "Handoff to savings" and the run then failed routing to it
(``GRAPH_ROUTING_002``), and a member could hand off to an agent its ``can_handoff_to`` left out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import TextBlock, ToolResultBlock

__all__ = ["HANDOFF_PREFIX", "create_handoff_tool", "first_handoff", "handoff_call_target", "handoff_message",
           "handoff_target", "is_handoff_tool"]

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


def handoff_call_target(tool_node: Any, name: str, agents: Any = None) -> str | None:
    """The agent a call of ``name`` hands off to on ``tool_node``, or None. A handoff by name,
    as in 10xGraph, unless the ToolNode has a tool of that name that is not a handoff tool:
    a tool you registered yourself as ``transfer_to_account`` runs as itself. With ``agents``
    (the graph's agent nodes), only to one of them, and on a ToolNode with handoff tools only
    through those (see the module notes)."""
    is_handoff, target = is_handoff_tool(name)
    if not is_handoff:
        return None
    fn = tool_node.get_tool(name)
    if fn is not None and not getattr(fn, "__handoff_tool__", False):
        return None
    if fn is None and agents is not None and any(
            getattr(tool_node.get_tool(t), "__handoff_tool__", False) for t in tool_node.tool_names):
        return None  # the node's own handoff tools are the agents it may hand off to
    # A SwarmAgent names its tools in lower case (10xGraph's names) for members whose node
    # names are upper case; the tool carries the node it goes to.
    target = getattr(fn, "__target_node__", None) or target
    if agents is not None and target not in agents:
        return None
    return target


def first_handoff(step: Any) -> tuple[int, str] | None:
    """The first handoff call of a tool step (a ``ToolStep``): its index and its agent. It wins:
    the run goes there, and any later handoff of the message is told so."""
    for index, call in enumerate(step.calls):
        target = handoff_call_target(step.tool_node, call.name, step.agents)
        if target is not None:
            return index, target
    return None


def handoff_target(step: Any) -> str | None:
    """The agent the first handoff call of a tool step names, if any (a ``ToolStep``)."""
    first = first_handoff(step)
    return first[1] if first is not None else None
