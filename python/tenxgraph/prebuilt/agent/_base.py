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
