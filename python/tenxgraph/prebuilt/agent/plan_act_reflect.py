"""PlanActReflectAgent: PLAN (an Agent with the tools) -> ACT (a ToolNode) -> REFLECT (an Agent
without tools) -> END when the reflector says ``[DONE]`` or ``max_iterations`` is reached, else
INCREMENT_ITERATIONS -> PLAN. 10xGraph's constructor, node names and routing.

The iteration count lives in ``state.execution_meta.internal_data["par_iterations"]`` and is
bumped by its own node, so it is committed with that node's step: a crash never counts an
iteration twice or loses one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from tenxgraph.core.graph.agent import Agent
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.prebuilt.agent._base import PrebuiltGraph, build_tool_node, this_turns, wants_tools
from tenxgraph.utils.constants import END

__all__ = ["DEFAULT_PLAN_SYSTEM_PROMPT", "DEFAULT_REFLECT_SYSTEM_PROMPT", "PlanActReflectAgent", "reflector_view"]

_log = logging.getLogger("tenxgraph.prebuilt.plan_act_reflect")
StateT = TypeVar("StateT", bound=AgentState)

ITERATIONS_KEY = "par_iterations"
TURN_KEY = "par_turn"  # the user message the count belongs to (see this_turns)
INCREMENT_NODE = "INCREMENT_ITERATIONS"
DONE_TOKEN = "[done]"

DEFAULT_PLAN_SYSTEM_PROMPT: list[dict[str, str]] = [{
    "role": "system",
    "content": ("You plan and make progress on the user's task. Split it into concrete steps. Call a tool "
                "when a step needs outside information or an action; otherwise answer directly. Keep each "
                "reply short and make it move the task forward."),
}]

DEFAULT_REFLECT_SYSTEM_PROMPT: list[dict[str, str]] = [{
    "role": "system",
    "content": ("You review the work so far (plan, actions, results) and judge whether the user's task is "
                "done. If it is, give a short final summary and end your reply with the token [DONE]. If "
                "it is not, say what is missing and what the next step should be, without [DONE]."),
}]


def reflector_view(context: list[Message]) -> list[Message]:
    """The messages REFLECT's model sees: no tool results (they can be long), and the tool
    calls that asked for them taken off the assistant messages (an assistant message whose
    calls go unanswered is refused by providers; 10xGraph sends it as is). An assistant
    message that was only tool calls is left out. The thread keeps every message."""
    view: list[Message] = []
    for m in context:
        if m.role == "tool":
            continue
        if m.role == "assistant" and m.tools_calls:
            if not m.text().strip():
                continue
            m = m.model_copy(update={"tools_calls": None})
        view.append(m)
    return view


def _reflect_node(agent: Agent) -> Callable[..., Any]:
    async def reflect(state: AgentState, config: dict[str, Any]) -> Message:
        this_turns(state, (ITERATIONS_KEY,), TURN_KEY)  # before the route reads the count
        full = state.context
        state.context = reflector_view(list(full or []))
        try:
            return await agent.execute(state, config)
        finally:
            state.context = full

    return reflect


async def _increment(state: AgentState) -> list[Message]:
    data = state.execution_meta.internal_data
    data[ITERATIONS_KEY] = data.get(ITERATIONS_KEY, 0) + 1
    return []


def _plan_route(has_tools: bool) -> Callable[[AgentState], str]:
    def route(state: AgentState) -> str:
        return "ACT" if has_tools and wants_tools(state) else "REFLECT"

    return route


def _reflect_route(max_iterations: int) -> Callable[[AgentState], str]:
    def route(state: AgentState) -> str:
        if state.execution_meta.internal_data.get(ITERATIONS_KEY, 0) >= max_iterations:
            _log.warning("PlanActReflect reached max_iterations=%d; ending", max_iterations)
            return END
        if not state.context or DONE_TOKEN in state.context[-1].text().lower():
            return END
        return INCREMENT_NODE

    return route


class PlanActReflectAgent(PrebuiltGraph, Generic[StateT]):
    """Plan -> act -> reflect, looped until the reflector ends its reply with ``[DONE]``
    (case-insensitive) or ``max_iterations`` loops have run; then the run ends with the last
    reply. Nodes: ``PLAN``, ``ACT`` (only with tools or an MCP ``client``), ``REFLECT``,
    ``INCREMENT_ITERATIONS``. ``plan_model`` / ``reflect_model`` and the per-phase
    ``*_reasoning_config`` override ``model`` / ``reasoning_config``; other keyword arguments go
    to both inner :class:`Agent` instances. ``ACT`` runs through the replay-safe tool handler."""

    def __init__(  # noqa: PLR0913 - 10xGraph's signature
        self,
        model: str,
        tools: Iterable[Callable[..., Any]] | None = None,
        plan_system_prompt: list[dict[str, Any]] | None = None,
        reflect_system_prompt: list[dict[str, Any]] | None = None,
        max_iterations: int = 3,
        state: StateT | None = None,
        context_manager: Any = None,
        publisher: Any = None,
        id_generator: Any = None,
        container: Any = None,
        *,
        plan_model: str | None = None,
        reflect_model: str | None = None,
        plan_reasoning_config: dict[str, Any] | bool | None = None,
        reflect_reasoning_config: dict[str, Any] | bool | None = None,
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
        **agent_kwargs: Any,
    ) -> None:
        self._max_iterations = max_iterations
        self._tool_node = build_tool_node(list(tools or []), client, pass_user_info_to_mcp)
        common = dict(extra_messages=extra_messages, trim_context=trim_context, skills=skills, memory=memory,
                      retry_config=retry_config, fallback_models=fallback_models,
                      multimodal_config=multimodal_config, **agent_kwargs)
        # Built here, not at compile(), so a missing key or a bad option fails at construction.
        self._plan_agent = Agent(
            model=plan_model or model, system_prompt=plan_system_prompt or DEFAULT_PLAN_SYSTEM_PROMPT,
            tool_node=self._tool_node, tools_tags=tools_tags,
            reasoning_config=plan_reasoning_config if plan_reasoning_config is not None else reasoning_config,
            **common)
        self._reflect_agent = Agent(
            model=reflect_model or model, system_prompt=reflect_system_prompt or DEFAULT_REFLECT_SYSTEM_PROMPT,
            tool_node=None,
            reasoning_config=reflect_reasoning_config if reflect_reasoning_config is not None else reasoning_config,
            **common)
        self._init_graph(state, context_manager, publisher, id_generator, container)

    def _configure_graph(self) -> None:
        g = self._graph = self._new_graph()
        has_tools = self._tool_node is not None
        g.add_node("PLAN", self._plan_agent)
        if has_tools:
            g.add_node("ACT", self._tool_node)
            g.add_edge("ACT", "REFLECT")
        g.add_node("REFLECT", _reflect_node(self._reflect_agent))
        g.add_conditional_edges("PLAN", _plan_route(has_tools),
                                {"REFLECT": "REFLECT", **({"ACT": "ACT"} if has_tools else {})})
        g.add_node(INCREMENT_NODE, _increment)
        g.add_edge(INCREMENT_NODE, "PLAN")
        g.add_conditional_edges("REFLECT", _reflect_route(self._max_iterations),
                                {INCREMENT_NODE: INCREMENT_NODE, END: END})
        g.set_entry_point("PLAN")
