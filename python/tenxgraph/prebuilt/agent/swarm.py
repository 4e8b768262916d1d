"""SwarmAgent: members (Agents) that pass the conversation to each other with
``transfer_to_<member>`` handoff tools, generated for each member and added to its ToolNode.
10xGraph's constructor, node names and routing, with one difference: a handoff call is answered.

10xGraph routes a handoff straight to the target member and leaves the call unanswered (the next
model request then carries an assistant tool call with no tool result, which providers reject).
Here a member that can hand off always has its ``<NAME>_TOOL`` node (10xGraph has one only for
members with their own tools): the handoff goes through it, is answered ("Handoff to <member>")
and recorded in the ledger like any call, and the tool node then routes to the target. So a
crash after a handoff resumes in the target member, and a tool a member called before handing
off is never run again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.prebuilt.agent._base import PrebuiltGraph, check_agent_names, wants_tools
from tenxgraph.prebuilt.errors import PrebuiltConfigError
from tenxgraph.prebuilt.tools.handoff import create_handoff_tool
from tenxgraph.utils.constants import END

__all__ = ["SwarmAgent", "SwarmMemberConfig"]

_log = logging.getLogger("tenxgraph.prebuilt.swarm")
StateT = TypeVar("StateT", bound=AgentState)


@dataclass
class SwarmMemberConfig:
    """One member: a ready :class:`Agent` (without handoff tools: they are added), the members
    it may hand off to (``None``: all others) and the ``description`` other members' handoff
    tools show for it."""

    agent: Any
    can_handoff_to: list[str] | None = None
    description: str = ""


def _member_route(tool_node_name: str | None) -> Callable[[AgentState], str]:
    def route(state: AgentState) -> str:
        if tool_node_name is not None and wants_tools(state):
            return tool_node_name
        return END

    return route


class SwarmAgent(PrebuiltGraph, Generic[StateT]):
    """Peer-to-peer handoffs between ``members`` (node name -> :class:`SwarmMemberConfig`),
    starting at ``entry``. A member's reply without tool calls ends the run. No members, or an
    ``entry`` that is not a member, raises :class:`PrebuiltConfigError`. Note: the members'
    Agents are changed in place (their ToolNode gets the handoff tools), as in 10xGraph."""

    def __init__(
        self,
        members: dict[str, SwarmMemberConfig],
        entry: str,
        state: StateT | None = None,
        context_manager: Any = None,
        publisher: Any = None,
        id_generator: Any = None,
        container: Any = None,
    ) -> None:
        if not members:
            raise PrebuiltConfigError("SwarmAgent requires at least one member.")
        check_agent_names("SwarmAgent", "member", members)
        for name, cfg in members.items():
            allowed = cfg.can_handoff_to
            if allowed is not None and (not isinstance(allowed, (list, tuple))
                                        or not all(isinstance(t, str) and t for t in allowed)):
                raise PrebuiltConfigError(f"member {name!r} can_handoff_to must be a list of member names, "
                                          f"got {allowed!r}", context={"member": name})
        if entry not in members:
            raise PrebuiltConfigError(f"entry={entry!r} is not in members. Available: {list(members)}",
                                      context={"entry": entry})
        self._members = dict(members)
        self._entry = entry
        self._injected: set[str] = set()
        self._init_graph(state, context_manager, publisher, id_generator, container)

    def _targets(self, name: str) -> list[str]:
        cfg = self._members[name]
        if cfg.can_handoff_to is None:
            return [n for n in self._members if n != name]
        targets = [t.upper() for t in cfg.can_handoff_to]
        unknown = [t for t in targets if t not in self._members]
        if unknown:
            raise PrebuiltConfigError(f"member {name!r} can_handoff_to names no member: {unknown}",
                                      context={"member": name, "unknown": unknown})
        return targets

    def _handoff_tools(self, name: str) -> list[Callable[..., Any]]:
        tools = []
        for target in self._targets(name):
            cfg = self._members[target]
            fn = create_handoff_tool(agent_name=target.lower(),
                                     description=cfg.description or f"Transfer control to {target}.")
            fn.__target_node__ = target  # type: ignore[attr-defined]
            tools.append(fn)
        return tools

    def _inject(self, name: str) -> None:
        # Once per member: compile() may run again, and the ToolNode refuses duplicate names.
        if name in self._injected:
            return
        self._injected.add(name)
        tools = self._handoff_tools(name)
        if not tools:
            return
        agent = self._members[name].agent
        node = agent.get_tool_node()
        if node is None and getattr(agent, "tool_node", None) is not None:
            _log.warning("member %r names its ToolNode by string; handoff tools cannot be added to it", name)
            return
        if node is None:
            node = ToolNode(tools)
            agent.tool_node = node
            agent._tool_node = node  # noqa: SLF001 - the Agent reads its ToolNode here
            return
        for fn in tools:
            node.add_tool(fn)

    def _configure_graph(self) -> None:
        g = self._graph = self._new_graph()
        for name, cfg in self._members.items():
            self._inject(name)
            g.add_node(name, cfg.agent)
        for name, cfg in self._members.items():
            targets = self._targets(name)
            tool_node = cfg.agent.get_tool_node()
            tool_node_name = f"{name}_TOOL" if tool_node is not None else None
            if tool_node_name is not None:
                g.add_node(tool_node_name, tool_node)
                g.add_edge(tool_node_name, name)
            if not targets and tool_node_name is None:
                _log.warning("SwarmAgent member %r has no handoff targets and no tools; it always ends the run",
                             name)
                g.add_edge(name, END)
                continue
            path_map = {END: END, **{t: t for t in targets}}
            if tool_node_name is not None:
                path_map[tool_node_name] = tool_node_name
            g.add_conditional_edges(name, _member_route(tool_node_name), path_map)
        g.set_entry_point(self._entry)
