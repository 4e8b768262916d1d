"""ReactAgent: the tool-calling loop, MAIN (an Agent) -> TOOL (a ToolNode) -> MAIN ... -> END.

10xGraph's constructor and graph shape. The tool node goes through the runtime's replay-safe
handler: a tool that returned is answered from the ledger when a crashed or resumed run replays
the node, and ``interrupt()`` inside a tool pauses the thread until ``{"resume": ...}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from tenxgraph.core.graph.agent import Agent
from tenxgraph.core.graph.state_graph import StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.utils.constants import END

__all__ = ["ReactAgent"]

StateT = TypeVar("StateT", bound=AgentState)


def _route_to(tool_node_name: str) -> Callable[[AgentState], str]:
    def route(state: AgentState) -> str:
        last = state.context[-1] if state.context else None
        if last is not None and last.role == "assistant" and last.tools_calls:
            return tool_node_name
        return END

    return route


class ReactAgent(Generic[StateT]):
    """``ReactAgent(model=..., system_prompt=[...], tools=[...]).compile(checkpointer=...)``.

    Keyword arguments not named here go to the :class:`Agent` (``base_url``, ``api_key``,
    ``temperature``, ...). ``client``: a ``fastmcp.Client`` whose server's tools join ``tools`` in the
    ToolNode (``pass_user_info_to_mcp`` as for ToolNode; see docs/mcp.md)."""

    def __init__(  # noqa: PLR0913 - 10xGraph's signature
        self,
        model: str,
        state: StateT | None = None,
        context_manager: Any = None,
        publisher: Any = None,
        id_generator: Any = None,
        container: Any = None,
        *,
        output_type: str = "text",
        system_prompt: list[dict[str, Any]] | None = None,
        tools: Iterable[Callable[..., Any]] | None = None,
        client: Any = None,
        pass_user_info_to_mcp: bool = False,
        extra_messages: list[Message] | None = None,
        trim_context: bool = False,
        tools_tags: set[str] | None = None,
        reasoning_config: dict[str, Any] | bool | None = True,
        skills: Any = None,
        memory: Any = None,
        retry_config: Any = True,
        fallback_models: list[str | tuple[str, str]] | None = None,
        multimodal_config: Any = None,
        output_schema: Any | None = None,
        main_node_name: str = "MAIN",
        tool_node_name: str = "TOOL",
        **agent_kwargs: Any,
    ) -> None:
        self._state = state
        self._context_manager = context_manager
        self._publisher = publisher
        self._id_generator = id_generator
        self._container = container
        self._main_node_name = main_node_name
        self._tool_node_name = tool_node_name
        tools = list(tools or [])
        self._tool_node = (ToolNode(tools, client=client, pass_user_info_to_mcp=pass_user_info_to_mcp)
                           if tools or client is not None else None)
        self._agent = Agent(
            model=model,
            output_type=output_type,
            system_prompt=system_prompt,
            tool_node=self._tool_node,
            extra_messages=extra_messages,
            trim_context=trim_context,
            tools_tags=tools_tags,
            reasoning_config=reasoning_config,
            skills=skills,
            memory=memory,
            retry_config=retry_config,
            fallback_models=fallback_models,
            multimodal_config=multimodal_config,
            output_schema=output_schema,
            **agent_kwargs,
        )
        self._graph = self._create_graph()

    def _create_graph(self) -> StateGraph[StateT]:
        return StateGraph(state=self._state, context_manager=self._context_manager, publisher=self._publisher,
                          id_generator=self._id_generator, container=self._container)

    def _configure_graph(self) -> None:
        graph = self._graph = self._create_graph()
        graph.add_node(self._main_node_name, self._agent)
        graph.set_entry_point(self._main_node_name)
        if self._tool_node is None:
            graph.add_edge(self._main_node_name, END)
            return
        graph.add_node(self._tool_node_name, self._tool_node)
        graph.add_conditional_edges(self._main_node_name, _route_to(self._tool_node_name),
                                    {self._tool_node_name: self._tool_node_name, END: END})
        graph.add_edge(self._tool_node_name, self._main_node_name)

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
        """The compiled graph. ``options``: tenxgraph's own compile options (``live_states``,
        ``recover_on_start``)."""
        self._configure_graph()
        return self._graph.compile(checkpointer=checkpointer, store=store, interrupt_before=interrupt_before,
                                   interrupt_after=interrupt_after, callback_manager=callback_manager,
                                   media_store=media_store, shutdown_timeout=shutdown_timeout, **options)
