"""BaseAgent: what a model-calling node implements (10xGraph's interface)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tenxgraph.core.graph.tool_node import ToolNode
    from tenxgraph.core.state.agent_state import AgentState
    from tenxgraph.core.state.message import Message

__all__ = ["BaseAgent"]


class BaseAgent(ABC):
    """A node that calls a model. ``await agent(state, config)`` runs :meth:`execute`."""

    def __init__(
        self,
        model: str,
        provider: str | None = None,
        system_prompt: list[dict[str, Any]] | None = None,
        tool_node: str | ToolNode | None = None,
        extra_messages: list[Message] | None = None,
        client: Any = None,
        base_url: str | None = None,
        trim_context: bool = False,
        tools_tags: set[str] | None = None,
        **llm_kwargs: Any,
    ) -> None:
        self.model = model
        self.system_prompt = system_prompt or []
        self.tool_node = tool_node
        self.llm_kwargs = llm_kwargs

    @abstractmethod
    async def execute(self, state: AgentState, config: dict[str, Any]) -> Any:
        """One model turn on ``state``."""

    @abstractmethod
    async def _call_llm(self, messages: list[dict[str, Any]], tools: list | None = None, **kwargs: Any) -> Any:
        """The provider request (what a test agent replaces)."""

    def get_tool_node(self) -> ToolNode | None:
        """The agent's ``ToolNode``, if it has one; None here."""
        return None

    async def __call__(self, state: AgentState, config: dict[str, Any]) -> Any:
        return await self.execute(state, config)
