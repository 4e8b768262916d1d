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
    """Keeps the system messages plus everything from the ``max_messages``-th most recent user
    message on (10xGraph 0.10's rule: it counts user turns, not messages, so a turn is never cut
    in half); a context with at most ``max_messages`` user messages is left as it is.

    With ``remove_tool_msgs``, completed tool exchanges are collapsed to their final reply first,
    so old tool traffic does not crowd out conversation turns.
    """

    def __init__(self, max_messages: int = 10, remove_tool_msgs: bool = False) -> None:
        from tenxgraph.core.llm.errors import ModelConfigError

        # 10xGraph took any value and failed on a later turn (a float in a slice, a string in a
        # comparison): refused here, as SummaryContextManager refuses its settings.
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 0:
            raise ModelConfigError(f"MessageContextManager max_messages: must be a non-negative integer, got "
                                   f"{max_messages!r}", "LLM_CONFIG_003", {"option": "max_messages"})
        self.max_messages = max_messages
        self.remove_tool_msgs = remove_tool_msgs

    async def atrim_context(self, state: S) -> S:
        messages = list(state.context)
        if not messages:
            return state
        if self.remove_tool_msgs:
            messages = remove_tool_messages(messages)
        others = [m for m in messages if m.role != "system"]
        users = [i for i, m in enumerate(others) if m.role == "user"]
        if len(users) <= self.max_messages:
            if self.remove_tool_msgs:
                state.context = messages
            return state
        start = users[-self.max_messages] if self.max_messages else len(others)
        state.context = [m for m in messages if m.role == "system"] + others[start:]
        return state
