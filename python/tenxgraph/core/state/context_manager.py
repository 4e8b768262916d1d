"""Context managers: trim a state's message context before it is checkpointed."""

from __future__ import annotations

from tenxgraph._sync import run_sync
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.reducers import remove_tool_messages

__all__ = ["BaseContextManager", "MessageContextManager"]

S = TypeVar("S", bound=AgentState)


class BaseContextManager(ABC, Generic[S]):
    """The runtime calls ``atrim_context`` at terminal checkpoints (``sync_data(trim=True)``)."""

    @abstractmethod
    async def atrim_context(self, state: S) -> S:
        """Return the state with its context trimmed (in place or as a new object)."""

    def trim_context(self, state: S) -> S:
        """Blocking twin of ``atrim_context``; inside a running event loop it runs on a private loop
        in a worker thread (as every sync twin here does) instead of failing."""
        return run_sync(self.atrim_context(state))


class MessageContextManager(BaseContextManager[S]):
    """Keeps system messages plus the last ``max_messages`` other messages.

    With ``remove_tool_msgs``, completed tool exchanges are collapsed to their final
    reply first, so old tool traffic does not crowd out conversation turns.
    """

    def __init__(self, max_messages: int = 10, remove_tool_msgs: bool = False) -> None:
        if max_messages < 0:
            raise ValueError("max_messages must be >= 0")
        self.max_messages = max_messages
        self.remove_tool_msgs = remove_tool_msgs

    async def atrim_context(self, state: S) -> S:
        messages = list(state.context)
        if self.remove_tool_msgs:
            messages = remove_tool_messages(messages)
        system = [m for m in messages if m.role == "system"]
        others = [m for m in messages if m.role != "system"]
        recent = others[-self.max_messages :] if self.max_messages else []
        # A tool result whose call was cut off is rejected by providers; drop the orphans.
        while recent and recent[0].role == "tool":
            recent.pop(0)
        state.context = system + recent
        return state
