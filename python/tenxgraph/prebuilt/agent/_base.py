"""What every prebuilt agent shares: the StateGraph it builds into, its ToolNode and its
``compile()``. A prebuilt agent is only a way to wire ordinary nodes (Agent, ToolNode, plain
functions), so the runtime's guarantees (ledger, per-step commits, timeouts, stop, interrupts)
hold in it exactly as in a graph written by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenxgraph.core.graph.state_graph import StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message


def build_tool_node(tools: list[Callable[..., Any]], client: Any, pass_user_info_to_mcp: bool) -> ToolNode | None:
    if not tools and client is None:
        return None
    return ToolNode(tools, client=client, pass_user_info_to_mcp=pass_user_info_to_mcp)


def wants_tools(state: AgentState) -> bool:
    last = state.context[-1] if state.context else None
    return last is not None and last.role == "assistant" and bool(last.tools_calls)


def last_user_text(state: AgentState) -> str:
    for msg in reversed(state.context or []):
        if msg.role == "user":
            return msg.text()
    return ""


def check_agent_names(owner: str, what: str, agents: dict[Any, Any], reserved: tuple[str, ...] = ()) -> None:
    """A team's or swarm's agents by name: each a non-empty str naming an ``Agent`` config,
    none a reserved word, and none the ``<NAME>_TOOL`` node another one's tools get (that name
    replaced the other's tool node, whose calls then went to the wrong agent).
    ``PrebuiltConfigError`` ``PREBUILT_001`` otherwise, at construction."""
    from tenxgraph.prebuilt.errors import PrebuiltConfigError

    for name, cfg in agents.items():
        if not isinstance(name, str) or not name.strip():
            raise PrebuiltConfigError(f"{owner} {what} names must be non-empty strings, got {name!r}",
                                      context={what: repr(name)})
        if name in reserved:
            raise PrebuiltConfigError(f"{owner} {what} name {name!r} is reserved", context={what: name})
        if getattr(cfg, "agent", None) is None:
            raise PrebuiltConfigError(f"{owner} {what} {name!r} must be given as a config holding an Agent "
                                      f"(its .agent), got {type(cfg).__name__}", context={what: name})
        if name.endswith("_TOOL") and name[: -len("_TOOL")] in agents:
            raise PrebuiltConfigError(f"{owner} {what} name {name!r} is the tool node of {what} "
                                      f"{name[: -len('_TOOL')]!r}", context={what: name})


# Metadata on a user message a prebuilt agent wrote itself (StructuredOutputAgent's correction):
# such a message does not start a turn.
OWN_USER_MESSAGE = "tenxgraph_prebuilt_note"


def current_turn(state: AgentState) -> str | None:
    """The id of the thread's latest user message that a caller sent (not one a prebuilt agent
    added itself): the turn a per-turn count belongs to."""
    return next((str(m.message_id) for m in reversed(state.context or [])
                 if m.role == "user" and not (m.metadata or {}).get(OWN_USER_MESSAGE)), None)


def this_turns(state: AgentState, keys: tuple[str, ...], turn_key: str) -> dict[str, Any]:
    """``internal_data`` with ``keys`` (a prebuilt agent's counters) dropped when the thread's
    latest user message is not the one they were counted under: a limit such as
    ``max_rounds`` is per turn. 10xGraph counted across turns, so once a thread had used up its
    limit it never answered again (red-team, session 31). Kept in the state, so a resume after
    a crash goes on counting the same turn."""
    data = state.execution_meta.internal_data
    turn = current_turn(state)
    if data.get(turn_key) != turn:
        for key in keys:
            data.pop(key, None)
        data[turn_key] = turn
    return data


def text_of(reply: Any) -> str:
    return reply.text() if isinstance(reply, Message) else str(reply or "")


class PrebuiltGraph:
    """Holds the graph-wide arguments and compiles a fresh StateGraph each time."""

    _state: Any
    _context_manager: Any
    _publisher: Any
    _id_generator: Any
    _container: Any
    _graph: StateGraph[Any]

    def _init_graph(self, state: Any, context_manager: Any, publisher: Any, id_generator: Any,
                    container: Any) -> None:
        self._state = state
        self._context_manager = context_manager
        self._publisher = publisher
        self._id_generator = id_generator
        self._container = container
        self._graph = self._new_graph()

    def _new_graph(self) -> StateGraph[Any]:
        return StateGraph(state=self._state, context_manager=self._context_manager, publisher=self._publisher,
                          id_generator=self._id_generator, container=self._container)

    def _configure_graph(self) -> None:
        raise NotImplementedError

    def compile(
        self,
        checkpointer: Any = None,
        store: Any = None,
        interrupt_before: list[str] | None = None,
        interrupt_after: list[str] | None = None,
        callback_manager: Any = None,
        media_store: Any = None,
        shutdown_timeout: float = 30.0,
        **options: Any,
    ) -> Any:
        """Wires the graph anew and compiles it (10xGraph's ``compile`` arguments).
        ``options``: tenxgraph's own compile options (``live_states``, ``recover_on_start``)."""
        self._configure_graph()
        return self._graph.compile(checkpointer=checkpointer, store=store, interrupt_before=interrupt_before,
                                   interrupt_after=interrupt_after, callback_manager=callback_manager,
                                   media_store=media_store, shutdown_timeout=shutdown_timeout, **options)
