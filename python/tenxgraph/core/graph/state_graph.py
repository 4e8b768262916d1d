"""StateGraph: the 10xGraph 0.10 builder. Compiling hands the topology to the Rust engine."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tenxgraph.core.exceptions import GraphError
from tenxgraph.core.graph.edge import Edge
from tenxgraph.core.graph.node import Node
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.graph.injection import activate_container, bind_graph_services
from tenxgraph.core.state.message import set_id_generator
from tenxgraph.utils.constants import END, START

__all__ = ["StateGraph"]

StateT = TypeVar("StateT", bound=AgentState)
_log = logging.getLogger("tenxgraph.graph")


def _is_tool_node(func: Any) -> bool:
    from tenxgraph.core.graph.tool_node import ToolNode

    return isinstance(func, ToolNode)


def _as_publisher(publisher: Any) -> Any:
    """10xGraph's rule: a list becomes a CompositePublisher, an empty one none at all. Anything
    without an async ``publish`` is refused here, not at the first event."""
    if publisher is None:
        return None
    if isinstance(publisher, (list, tuple)):
        if not publisher:
            return None
        for p in publisher:
            _check_publisher(p)
        from tenxgraph.runtime.publisher.composite_publisher import CompositePublisher

        return CompositePublisher(list(publisher))
    _check_publisher(publisher)
    return publisher


def _check_publisher(p: Any) -> None:
    if not callable(getattr(p, "publish", None)):
        raise TypeError(f"publisher must be a BasePublisher (with an async publish(event)), got {type(p).__name__}")


def _identity(state: Any, config: Any = None, **_: Any) -> Any:
    return state


class StateGraph(Generic[StateT]):
    """Build a graph of nodes over a pydantic state, then ``compile()`` it.

    ``state`` is an AgentState instance or subclass; it is the prototype each new thread starts
    from (deep-copied). ``publisher`` (a BasePublisher or a list of them) receives the run's
    events (tenxgraph.runtime.publisher). ``container`` and ``context_manager`` are accepted for
    compatibility with 10xGraph and are not used by the core loop.
    """

    def __init__(
        self,
        state: StateT | type[StateT] | None = None,
        context_manager: Any = None,
        publisher: Any = None,
        id_generator: Any = None,
        container: Any = None,
    ) -> None:
        if state is None:
            state = AgentState()  # type: ignore[assignment]
        elif isinstance(state, type):
            if not issubclass(state, AgentState):
                raise TypeError(f"state must be an AgentState subclass, got {state.__name__}")
            state = state()
        elif not isinstance(state, AgentState):
            raise TypeError(f"state must be an AgentState instance or subclass, got {type(state).__name__}")
        self._state: StateT = state  # type: ignore[assignment]
        self.context_manager = context_manager
        self.publisher = _as_publisher(publisher)
        self.container = container
        self._id_generator = id_generator
        activate_container(container)
        # 10xGraph binds a graph's generator process-wide, its DefaultIDGenerator (random ids)
        # when none is given: a graph built without one undoes an earlier graph's (it kept it).
        set_id_generator(id_generator.generate if id_generator is not None else None)
        self.nodes: dict[str, Node] = {START: Node(START, _identity), END: Node(END, _identity)}
        self.edges: list[Edge] = []
        self.entry_point: str | None = None
        self.compiled = False

    def add_node(self, name_or_func: str | Callable[..., Any], func: Any = None) -> StateGraph[StateT]:
        """Adds a node: ``add_node(func)`` (named ``func.__name__``) or ``add_node(name, func)`` with
        a callable or a ``ToolNode``; a second node of the same name replaces the first. Raises
        ValueError for other arguments and for the reserved ``START``/``END`` names. Returns self."""
        if callable(name_or_func) and func is None:
            name = getattr(name_or_func, "__name__", None)
            if not name:
                raise ValueError("Invalid arguments for add_node")
            func = name_or_func
        elif isinstance(name_or_func, str) and func is not None and (callable(func) or _is_tool_node(func)):
            name = name_or_func
        else:
            raise ValueError("Invalid arguments for add_node")
        if name in (START, END):
            raise ValueError(f"'{name}' is reserved")
        self.nodes[name] = Node(name, func)
        return self

    def add_edge(self, from_node: str, to_node: str) -> StateGraph[StateT]:
        """Adds a fixed edge (from ``START`` it also sets the entry point). Names are checked by
        ``compile()`` (``GraphError`` GRAPH_004). Returns self."""
        self.edges.append(Edge(from_node, to_node))
        if from_node == START:
            self.entry_point = to_node
        return self

    def add_conditional_edges(
        self,
        from_node: str,
        condition: Callable[..., Any],
        path_map: dict[str, str] | None = None,
    ) -> StateGraph[StateT]:
        """Routes from ``from_node`` by ``condition(state)``: its result is looked up in ``path_map``
        when given, else taken as the next node's name (``END`` allowed). An unknown result raises
        ``GraphError`` GRAPH_ROUTING_002 at run time; TypeError here when ``condition`` is not callable.
        Returns self."""
        if not callable(condition):
            raise TypeError("condition must be callable")
        if path_map:
            for key, target in path_map.items():
                edge = Edge(from_node, target, condition)
                edge.condition_result = key
                self.edges.append(edge)
        else:
            self.edges.append(Edge(from_node, "", condition))
        return self

    def set_entry_point(self, node_name: str) -> StateGraph[StateT]:
        """Makes ``node_name`` the first node (the same as ``add_edge(START, node_name)``). Returns self."""
        self.entry_point = node_name
        self.add_edge(START, node_name)
        return self

    def override_node(self, name: str, func: Callable[..., Any]) -> StateGraph[StateT]:
        """Replaces the body of an existing node, keeping its edges; KeyError when there is no such
        node. Returns self."""
        if name not in self.nodes:
            raise KeyError(f"Node '{name}' does not exist")
        self.nodes[name] = Node(name, func)
        return self

    def compile(
        self,
        checkpointer: Any = None,
        store: Any = None,
        media_store: Any = None,
        interrupt_before: list[str] | None = None,
        interrupt_after: list[str] | None = None,
        callback_manager: Any = None,
        shutdown_timeout: float = 30.0,
        *,
        live_states: int | None = None,
        recover_on_start: bool | dict[str, Any] = False,
    ) -> Any:
        """``live_states`` (tenxgraph): how many threads' live states to keep between runs in this
        process, so a thread's next turn here skips loading its history (``tenxgraph._live_states``).
        Default ``TENXGRAPH_LIVE_STATES`` or 256; 0 keeps none.

        ``recover_on_start`` (tenxgraph): ``async with app:`` starts a recovery pass in the
        background (``app.recovery``, see ``CompiledGraph.arecover``); True for the defaults, or a
        dict of ``arecover`` options (``concurrency``, ``limit``, ``config``)."""
        from tenxgraph._live_states import resolve_limit
        from tenxgraph.core.graph.compiled_graph import CompiledGraph

        live_limit = resolve_limit(live_states)
        from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer

        if self.entry_point is None:
            raise GraphError("No entry point set. Use set_entry_point() or add_edge(START, node).", "GRAPH_002")
        if checkpointer is None:
            checkpointer = InMemoryCheckpointer()
        elif not isinstance(checkpointer, BaseCheckpointer):
            raise TypeError(
                f"checkpointer must be a tenxgraph checkpointer, got {type(checkpointer).__name__}"
            )
        from tenxgraph.utils.callbacks import CallbackManager

        if callback_manager is None:
            # A manager per graph: 10xGraph's default is one CallbackManager() shared by every
            # compile() that passes none, so callbacks registered on it leaked across graphs.
            callback_manager = CallbackManager()
        elif not isinstance(callback_manager, CallbackManager):
            raise TypeError(
                f"callback_manager must be a tenxgraph.utils.CallbackManager, got {type(callback_manager).__name__}"
            )
        if not hasattr(checkpointer, "_native"):
            # A checkpointer written in Python: the Rust loop drives it through a PythonStore
            # (refused, GRAPH_CHECKPOINTER_001, when it keeps no tool ledger).
            from tenxgraph.storage.checkpointer.python_store import attach_python_store

            attach_python_store(checkpointer)
        checkpointer.bind_state_type(type(self._state))
        graph = CompiledGraph(
            self,
            checkpointer=checkpointer,
            store=store,
            interrupt_before=list(interrupt_before or []),
            interrupt_after=list(interrupt_after or []),
            shutdown_timeout=shutdown_timeout,
            live_states=live_limit,
            recover_on_start=recover_on_start,
            callback_manager=callback_manager,
        )
        bind_graph_services(self.container, checkpointer=checkpointer, graph=self, app=graph,
                            id_generator=self._id_generator, publisher=self.publisher,
                            callback_manager=callback_manager, context_manager=self.context_manager)
        self.compiled = True
        return graph
