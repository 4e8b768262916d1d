"""The conversation as a provider sees it: system prompts (with ``{field}`` filled from the
state), the context summary, the thread's messages and the agent's extra messages, in OpenAI's
chat form. Text only: image, audio and document blocks are not sent (multimodal is not supported
yet)."""

from __future__ import annotations

from typing import Any

from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import RemoteToolCallBlock, ToolResultBlock
from tenxgraph.logs import run_logger

__all__ = ["interpolate_system_prompts", "to_provider_messages"]

_log = run_logger("tenxgraph.agent")


def interpolate_system_prompts(prompts: list[dict[str, Any]], state: AgentState | None) -> list[dict[str, Any]]:
    """``str.format`` with the state's fields; a prompt that cannot be filled (a missing field,
    a stray brace) is sent as written, with a warning, as 10xGraph does."""
    if state is None:
        return [dict(p) for p in prompts]
    fields = state.model_dump()
    out = []
    for prompt in prompts:
        content = prompt.get("content")
        if not isinstance(content, str):
            out.append(dict(prompt))
            continue
        try:
            out.append({**prompt, "content": content.format(**fields)})
        except (KeyError, ValueError, IndexError, AttributeError) as exc:
            _log.warning("system prompt left as written: it could not be filled from the state (%r)", exc)
            out.append(dict(prompt))
    return out


def _message_dict(message: Message) -> dict[str, Any] | None:
    blocks = message.content
    if any(isinstance(b, RemoteToolCallBlock) or (isinstance(b, dict) and b.get("type") == "remote_tool_call")
           for b in blocks):
        return None  # answered on the client; not part of the provider's conversation
    if message.role == "tool":
        call_id = next((b.call_id for b in blocks if isinstance(b, ToolResultBlock)), None)
        if call_id is None:
            call_id = message.metadata.get("tool_call_id", "")
        return {"role": "tool", "content": message.text(), "tool_call_id": str(call_id)}
    if message.role == "assistant" and message.tools_calls:
        return {"role": "assistant", "content": message.text(), "tool_calls": message.tools_calls}
    return {"role": message.role, "content": message.text()}


def to_provider_messages(system_prompts: list[dict[str, Any]], state: AgentState | None,
                         extra_messages: list[Message] | None = None) -> list[dict[str, Any]]:
    """The chat-completions ``messages`` of a turn: the system prompts (interpolated with the
    state), the context summary as an assistant message, then the context and ``extra_messages``
    as role/content dicts (tool calls and tool-call ids kept). Messages holding a remote tool
    call are left out: the client answered those."""
    out = interpolate_system_prompts(system_prompts, state)
    if state is not None and state.context_summary:
        out.append({"role": "assistant", "content": state.context_summary})
    for m in [*(state.context if state is not None else []), *(extra_messages or [])]:
        d = _message_dict(m)
        if d is not None:
            out.append(d)
    return out
