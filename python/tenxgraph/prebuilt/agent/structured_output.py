"""StructuredOutputAgent: GENERATE (an Agent with ``output_schema``) -> END when its reply
validates against the schema; else REPAIR (a correction message, or a repair Agent) ->
GENERATE, at most ``max_attempts`` times; tool calls go GENERATE -> TOOL -> GENERATE first.
10xGraph's constructor, node names and routing.

The attempt count lives in ``state.execution_meta.internal_data["soa_attempts"]``, bumped by
the REPAIR node and committed with its step. It counts one turn's attempts (``soa_turn`` names
the user message it belongs to): 10xGraph kept it across turns, so once a thread had used
``max_attempts`` in all, no later reply was ever repaired.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import pydantic

from tenxgraph.core.graph.agent import Agent
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.prebuilt.agent._base import (
    OWN_USER_MESSAGE,
    PrebuiltGraph,
    build_tool_node,
    current_turn,
    this_turns,
    wants_tools,
)
from tenxgraph.utils.constants import END

__all__ = ["StructuredOutputAgent", "validate_structured_reply"]

_log = logging.getLogger("tenxgraph.prebuilt.structured_output")
StateT = TypeVar("StateT", bound=AgentState)
ATTEMPTS_KEY = "soa_attempts"
TURN_KEY = "soa_turn"  # the user message the attempts belong to (see this_turns)


def _schema_hint(adapter: pydantic.TypeAdapter[Any], schema: Any) -> str:
    try:
        return json.dumps(adapter.json_schema(), indent=2)
    except Exception:  # a schema pydantic can validate but not describe
        return getattr(schema, "__name__", str(schema))


def _strip_fence(text: str) -> str:
    if not text.startswith("```"):
        return text
    lines = text.splitlines()
    end = len(lines) - 1 if len(lines) > 1 and lines[-1].strip() == "```" else len(lines)
    return "\n".join(lines[1:end])


def validate_structured_reply(message: Message, adapter: pydantic.TypeAdapter[Any]) -> tuple[bool, str]:
    """``(True, "")`` when the reply (its ``parsed_content``, else its text as JSON, a
    Markdown code fence allowed) validates against ``adapter``; else ``(False, why)``."""
    parsed = message.parsed_content
    if parsed is not None:
        raw = parsed.model_dump() if isinstance(parsed, pydantic.BaseModel) else parsed
        try:
            adapter.validate_python(raw)
            return True, ""
        except Exception:  # noqa: BLE001 - the text may still hold a valid object
            pass
    text = message.text().strip()
    if not text:
        return False, "LLM returned an empty response."
    try:
        adapter.validate_python(json.loads(_strip_fence(text)))
        return True, ""
    except json.JSONDecodeError as exc:
        return False, f"Response is not valid JSON: {exc}"
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError and the rest
        return False, str(exc)


def _attempts(state: AgentState) -> int:
    # A route reads, it does not write: a count from an earlier turn reads as none.
    data = state.execution_meta.internal_data
    return int(data.get(ATTEMPTS_KEY, 0)) if data.get(TURN_KEY) == current_turn(state) else 0


def _count_attempt(state: AgentState) -> None:
    data = this_turns(state, (ATTEMPTS_KEY,), TURN_KEY)
    data[ATTEMPTS_KEY] = data.get(ATTEMPTS_KEY, 0) + 1


def _route(adapter: pydantic.TypeAdapter[Any], max_attempts: int, has_tools: bool) -> Callable[[AgentState], str]:
    def route(state: AgentState) -> str:
        if not state.context:
            return END
        if has_tools and wants_tools(state):
            return "TOOL"
        valid, _ = validate_structured_reply(state.context[-1], adapter)
        if valid:
            return END
        if _attempts(state) >= max_attempts:
            _log.warning("structured output still invalid after %d repair attempt(s); ending", max_attempts)
            return END
        return "REPAIR"

    return route


def _repair_message(adapter: pydantic.TypeAdapter[Any], schema: Any) -> Callable[..., Any]:
    hint = _schema_hint(adapter, schema)

    async def repair(state: AgentState, config: dict[str, Any]) -> list[Message]:
        _count_attempt(state)
        last = state.context[-1] if state.context else None
        _, error = validate_structured_reply(last, adapter) if last is not None else (False, "No response was generated.")
        text = ("Your previous response did not conform to the required output schema.\n"
                f"Validation error:\n{error}\n\nTarget JSON Schema:\n{hint}\n\n"
                "Please produce a response that is **valid JSON** and strictly matches the schema above. "
                "Output only the JSON object — no extra text or code fences.")
        note = Message.text_message(text, role="user")
        note.metadata[OWN_USER_MESSAGE] = "structured_output_repair"  # not a new turn
        return [note]

    return repair


def _repair_agent_node(agent: Agent) -> Callable[..., Any]:
    # A repair Agent counts as an attempt too, or a schema it cannot meet would loop forever.
    async def repair(state: AgentState, config: dict[str, Any]) -> Message:
        _count_attempt(state)
        return await agent.execute(state, config)

    return repair


class StructuredOutputAgent(PrebuiltGraph, Generic[StateT]):
    """A reply that validates against ``output_schema`` (a pydantic model or a TypedDict), with
    up to ``max_attempts`` repair rounds; after them the run ends with the last reply as is.
    Nodes: ``GENERATE``, ``TOOL`` (with tools or an MCP ``client``), ``REPAIR`` (a correction
    message; a model call when ``repair_system_prompt`` is given). Other keyword arguments go to
    the inner :class:`Agent`."""

    def __init__(  # noqa: PLR0913 - 10xGraph's signature
        self,
        model: str,
        output_schema: type,
        tools: Iterable[Callable[..., Any]] | None = None,
        system_prompt: list[dict[str, Any]] | None = None,
        max_attempts: int = 2,
        repair_system_prompt: list[dict[str, Any]] | None = None,
        state: StateT | None = None,
        context_manager: Any = None,
        publisher: Any = None,
        id_generator: Any = None,
        container: Any = None,
        *,
        output_type: str = "text",
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
        self._output_schema = output_schema
        self._adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(output_schema)
        self._max_attempts = max_attempts
        self._tool_node = build_tool_node(list(tools or []), client, pass_user_info_to_mcp)
        self._generate_agent = Agent(
            model=model, output_type=output_type, system_prompt=system_prompt, tool_node=self._tool_node,
            extra_messages=extra_messages, trim_context=trim_context, tools_tags=tools_tags,
            reasoning_config=reasoning_config, skills=skills, memory=memory, retry_config=retry_config,
            fallback_models=fallback_models, multimodal_config=multimodal_config, output_schema=output_schema,
            **agent_kwargs)
        self._repair_agent = None if repair_system_prompt is None else Agent(
            model=model, output_type=output_type, system_prompt=repair_system_prompt, tool_node=None,
            extra_messages=extra_messages, trim_context=trim_context, reasoning_config=reasoning_config,
            memory=memory, retry_config=retry_config, fallback_models=fallback_models,
            output_schema=output_schema, **agent_kwargs)
        self._init_graph(state, context_manager, publisher, id_generator, container)

    def _configure_graph(self) -> None:
        g = self._graph = self._new_graph()
        has_tools = self._tool_node is not None
        g.add_node("GENERATE", self._generate_agent)
        if has_tools:
            g.add_node("TOOL", self._tool_node)
            g.add_edge("TOOL", "GENERATE")
        repair = (_repair_message(self._adapter, self._output_schema) if self._repair_agent is None
                  else _repair_agent_node(self._repair_agent))
        g.add_node("REPAIR", repair)
        g.add_edge("REPAIR", "GENERATE")
        g.add_conditional_edges("GENERATE", _route(self._adapter, self._max_attempts, has_tools),
                                {"REPAIR": "REPAIR", END: END, **({"TOOL": "TOOL"} if has_tools else {})})
        g.set_entry_point("GENERATE")
