"""``SummaryContextManager``: old messages replaced by a model-written summary, as 10xGraph 0.10 does it.

When the context holds more than ``max_messages`` messages, or its estimated size (characters of
text and tool calls / 4) exceeds ``token_budget``, every non-system message but the last
``keep_recent`` is summarised by one model call (:func:`tenxgraph.core.llm.call_llm`, so any
model string of the provider layer works) and removed; the summary goes to
``state.context_summary``, appended after any summary already there (a blank line between), and
the prompt builder puts it before the kept messages as an assistant message. System messages
are always kept. With ``remove_tool_msgs`` completed tool exchanges are collapsed first. The cut
never leaves a tool result without the assistant message that asked for it: it moves back to
that message (10xGraph cuts by count, and a provider refuses the orphaned result on every later
turn of the thread).

If the summary call fails (or returns no text) the error is logged and the state is returned
unchanged: the run goes on with the full context, as in 10xGraph.

Where it runs: ``Agent(trim_context=True)`` of a graph built with
``StateGraph(context_manager=SummaryContextManager(...))`` trims the state its prompt is built from
(a copy: the thread's stored messages are kept). Summaries are remembered per process by a digest
of the messages they cover (each one's id, role and text: ids alone are not unique across threads, so
a thread numbering its messages 1, 2, 3 was given another thread's summary), so a later turn
summarises only the messages that left the window since, instead of everything again; after a
restart the first turn over the threshold summarises afresh.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from typing import Any, Literal, TypeVar

from tenxgraph.core.llm.caller import call_llm
from tenxgraph.core.llm.errors import ModelConfigError
from tenxgraph.core.llm.providers import detect_provider
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.context_manager import BaseContextManager
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.reducers import remove_tool_messages

__all__ = ["DEFAULT_SUMMARY_PROMPT", "SummaryContextManager"]

S = TypeVar("S", bound=AgentState)
_log = logging.getLogger("tenxgraph.state.summary")
_CACHE_SIZE = 256

DEFAULT_SUMMARY_PROMPT = (
    "You summarise conversations. Summarise the conversation below concisely, keeping every fact, "
    "decision, tool result and piece of context needed to continue it. Write in the third person, "
    "past tense; be factual and specific; add no commentary about the summary."
)


def _block_texts(message: Message) -> list[str]:
    return [t for t in (getattr(b, "text", None) for b in message.content) if t]


def estimate_tokens(messages: list[Message]) -> int:
    """The size estimate the ``token_budget`` is compared with: characters of the messages' text
    blocks and tool calls, divided by 4 (at least 1)."""
    chars = 0
    for m in messages:
        chars += sum(len(t) for t in _block_texts(m))
        if m.tools_calls:
            chars += len(str(m.tools_calls))
    return max(1, chars // 4)


def _transcript(messages: list[Message]) -> str:
    lines = []
    for m in messages:
        parts = [t.strip() for t in _block_texts(m)]
        if m.tools_calls:
            parts.append(f"[Tool calls: {m.tools_calls}]")
        if parts:
            lines.append(f"{m.role.upper()}: {' '.join(parts)}")
    return "\n".join(lines)


def _digest(message: Message) -> bytes:
    """What a remembered summary is keyed by, per message: its id and what the summary is made
    of (its transcript line), not its timestamps, which a load may round."""
    key = f"{message.message_id!r}\0{_transcript([message])}"
    return hashlib.blake2b(key.encode(errors="surrogatepass"), digest_size=16).digest()


class SummaryContextManager(BaseContextManager[S]):
    """Summarises the oldest messages once the context passes ``max_messages`` (default 30;
    None: no count trigger) or ``token_budget`` (estimated tokens; None, the default: no budget),
    keeping the last ``keep_recent`` (8) non-system messages verbatim; see the module docstring.
    ``model`` is any model string of the provider layer; ``max_summary_tokens`` (600) bounds the
    summary; ``api_style`` picks OpenAI's Responses (default) or Chat API. Invalid settings are a
    ``ModelConfigError`` ``LLM_CONFIG_003`` (a ``ValueError``) at construction."""

    def __init__(self, model: str, *, max_messages: int | None = 30, token_budget: int | None = None,
                 keep_recent: int = 8, remove_tool_msgs: bool = False, summary_system_prompt: str | None = None,
                 max_summary_tokens: int = 600, api_style: Literal["responses", "chat"] = "responses") -> None:
        def bad(option: str, why: str) -> ModelConfigError:
            return ModelConfigError(f"SummaryContextManager {option}: {why}", "LLM_CONFIG_003", {"option": option})

        if not isinstance(model, str) or not model.strip():
            raise bad("model", f"a model name is required, got {model!r}")
        for name, value, allow_none in (("max_messages", max_messages, True), ("token_budget", token_budget, True),
                                        ("keep_recent", keep_recent, False),
                                        ("max_summary_tokens", max_summary_tokens, False)):
            if value is None and allow_none:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "max_summary_tokens" else 0):
                raise bad(name, f"must be a {'positive' if name == 'max_summary_tokens' else 'non-negative'} "
                                f"integer{' or None' if allow_none else ''}, got {value!r}")
        if api_style not in ("responses", "chat"):
            raise bad("api_style", f"must be 'responses' or 'chat', got {api_style!r}")
        self.model = model
        self.max_messages = max_messages
        self.token_budget = token_budget
        self.keep_recent = keep_recent
        self.remove_tool_msgs = remove_tool_msgs
        self.summary_system_prompt = summary_system_prompt or DEFAULT_SUMMARY_PROMPT
        self.max_summary_tokens = max_summary_tokens
        self.api_style = api_style
        self.provider = detect_provider(model)
        self._summaries: OrderedDict[tuple[Any, ...], str] = OrderedDict()

    def should_summarize(self, messages: list[Message]) -> bool:
        """True when ``messages`` pass either threshold (more than ``max_messages``, or more than
        ``token_budget`` estimated tokens)."""
        if self.max_messages is not None and len(messages) > self.max_messages:
            return True
        return self.token_budget is not None and estimate_tokens(messages) > self.token_budget

    async def _summarize(self, messages: list[Message]) -> str:
        text = _transcript(messages)
        if not text.strip():
            return ""
        summary, *_ = await call_llm(self.model, f"Conversation to summarize:\n\n{text}",
                                     system_prompt=self.summary_system_prompt, max_tokens=self.max_summary_tokens,
                                     api_style=self.api_style)
        return summary

    async def _summary_of(self, messages: list[Message]) -> str:
        """The summary of ``messages``, reusing the longest remembered summary of a prefix of them."""
        ids = tuple(_digest(m) for m in messages)
        for n in range(len(ids), 0, -1):
            known = self._summaries.get(ids[:n])
            if known is not None:
                self._summaries.move_to_end(ids[:n])
                break
        else:
            n, known = 0, ""
        if n < len(ids):
            new = await self._summarize(messages[n:])
            if not new:
                # No text for these messages: nothing may be remembered as covering them, or the
                # next turn's prompt left them out of both the summary and the context (red-team,
                # session 35). "" leaves the context as it was.
                return ""
            known = f"{known}\n\n{new}" if known else new
            self._summaries[ids] = known
            while len(self._summaries) > _CACHE_SIZE:
                self._summaries.popitem(last=False)
        return known

    async def atrim_context(self, state: S) -> S:
        """The state with its oldest messages summarised into ``context_summary`` when a threshold
        is passed (see the class docstring); unchanged when not, or when the summary call fails."""
        messages = list(state.context)
        if not messages:
            return state
        if self.remove_tool_msgs:
            messages = remove_tool_messages(messages)
        if not self.should_summarize(messages):
            if self.remove_tool_msgs:
                state.context = messages
            return state
        system = [m for m in messages if m.role == "system"]
        others = [m for m in messages if m.role != "system"]
        if len(others) <= self.keep_recent:
            return state
        cut = len(others) - self.keep_recent
        # keep_recent=0 summarises all of them (cut == len(others): no result to keep).
        while 0 < cut < len(others) and others[cut].role == "tool":
            cut -= 1  # the result stays with the assistant message that asked for it
        if cut == 0:
            return state
        old, recent = others[:cut], others[cut:]
        try:
            summary = await self._summary_of(old)
        except Exception:
            _log.exception("the summary call to %s failed; the context is left as it was", self.model)
            return state
        if not summary:
            return state
        state.context_summary = f"{state.context_summary}\n\n{summary}" if state.context_summary else summary
        state.context = system + recent
        return state
