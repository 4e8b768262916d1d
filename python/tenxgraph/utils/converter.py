"""``convert_messages``: a thread's messages as OpenAI-style chat dicts, with 10xGraph 0.10's rules.

System prompts come first, with ``{field}`` placeholders filled from the state; then the context
summary (as an assistant message), the context and any extra messages. Tool messages carry their
``tool_call_id``; assistant messages with tool calls carry ``tool_calls``; a message holding a
remote (client-side) tool call is left out; text-only content is a string, content with media
is a list of parts.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import (
    AudioBlock,
    DocumentBlock,
    ImageBlock,
    MediaRef,
    RemoteToolCallBlock,
    TextBlock,
    ToolResultBlock,
    VideoBlock,
)

if TYPE_CHECKING:
    from tenxgraph.core.state.agent_state import AgentState

__all__ = ["convert_messages", "strip_media_blocks"]

logger = logging.getLogger("tenxgraph.utils")

_MEDIA_BLOCKS = (ImageBlock, AudioBlock, VideoBlock, DocumentBlock)
_MEDIA_TYPES = frozenset({"image", "audio", "video", "document"})


def convert_messages(
    system_prompts: list[dict[str, Any]],
    state: AgentState | None = None,
    extra_messages: list[Message] | None = None,
) -> list[dict[str, Any]]:
    """The payload for a chat model. ``system_prompts`` None raises ValueError."""
    if system_prompts is None:
        raise ValueError("System prompts cannot be None")
    out: list[dict[str, Any]] = _fill_prompts(system_prompts, state)
    if state is not None and state.context_summary:
        out.append({"role": "assistant", "content": state.context_summary})
    for messages in ((state.context if state is not None else None), extra_messages):
        for msg in messages or ():
            converted = _to_dict(msg)
            if converted is not None:
                out.append(converted)
    return out


def strip_media_blocks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Converted messages with their media parts removed, for a text-only model: a list left
    with one text part becomes that string, with none an empty string."""
    out = []
    for msg in messages:
        content = msg.get("content")
        if not isinstance(content, list):
            out.append(msg)
            continue
        texts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if not texts:
            out.append({**msg, "content": ""})
        elif len(texts) == 1:
            out.append({**msg, "content": texts[0].get("text", "")})
        else:
            out.append({**msg, "content": texts})
    return out


def _fill_prompts(prompts: list[dict[str, Any]], state: AgentState | None) -> list[dict[str, Any]]:
    if state is None:
        return list(prompts)
    fields = state.model_dump()
    out = []
    for prompt in prompts:
        content = prompt.get("content")
        if not isinstance(content, str):
            out.append(prompt)
            continue
        try:
            out.append({**prompt, "content": content.format(**fields)})
        except (KeyError, ValueError, IndexError) as exc:
            # A placeholder the state cannot fill keeps the prompt as written (10xGraph's rule).
            logger.warning("system prompt left as written: its placeholders could not be filled (%r)", exc)
            out.append(prompt)
    return out


def _blocks(message: Message) -> list[Any]:
    content = getattr(message, "content", None)
    if content is None:
        return []
    return content if isinstance(content, list) else [content]


def _kind(block: Any) -> str | None:
    return block.get("type") if isinstance(block, dict) else getattr(block, "type", None)


def _to_dict(message: Message) -> dict[str, Any] | None:
    blocks = _blocks(message)
    if any(isinstance(b, RemoteToolCallBlock) or _kind(b) == "remote_tool_call" for b in blocks):
        return None  # its result comes from the client; the model must not see a placeholder
    if message.role == "tool":
        call_id = ""
        for b in blocks:
            if isinstance(b, ToolResultBlock):
                call_id = b.call_id
                break
            if isinstance(b, dict) and b.get("type") == "tool_result":
                call_id = str(b.get("call_id", ""))
                break
        return {"role": "tool", "content": message.text(), "tool_call_id": call_id}
    if message.role == "assistant" and message.tools_calls:
        return {"role": "assistant", "content": message.text(), "tool_calls": message.tools_calls}
    return {"role": message.role, "content": _content(blocks)}


def _content(blocks: list[Any]) -> str | list[dict[str, Any]]:
    if not any(isinstance(b, _MEDIA_BLOCKS) or (isinstance(b, dict) and b.get("type") in _MEDIA_TYPES) for b in blocks):
        return "".join(_text_of(b) for b in blocks)
    parts: list[dict[str, Any]] = []
    for b in blocks:
        parts.extend(_parts_of(b))
    return parts


def _text_of(block: Any) -> str:
    if isinstance(block, TextBlock):
        return block.text or ""
    if isinstance(block, ToolResultBlock):
        return block.output if isinstance(block.output, str) else json.dumps(block.output, default=str)
    if isinstance(block, dict) and block.get("type") == "text":
        return str(block.get("text") or "")
    return ""


def _parts_of(block: Any) -> list[dict[str, Any]]:
    if isinstance(block, TextBlock):
        return [{"type": "text", "text": block.text}] if block.text else []
    if isinstance(block, dict):
        text = str(block.get("text") or "") if block.get("type") == "text" else ""
        return [{"type": "text", "text": text}] if text else []
    if isinstance(block, ImageBlock):
        return [{"type": "image_url", "image_url": {"url": _image_url(block.media)}}]
    if isinstance(block, AudioBlock):
        m = block.media
        if m.kind == "data" and m.data_base64:
            fmt = m.mime_type.split("/")[-1] if m.mime_type else "wav"
            return [{"type": "input_audio", "input_audio": {"data": m.data_base64, "format": fmt}}]
        return [{"type": "text", "text": f"[Audio: {m.url or m.file_id or 'unknown'}]"}]
    if isinstance(block, DocumentBlock):
        return [_document_part(block)]
    if isinstance(block, VideoBlock):
        m = block.media
        mime = m.mime_type or "video/mp4"
        if m.kind == "data" and m.data_base64:
            return [{"type": "video", "video": {"data": m.data_base64, "mime_type": mime, "url": None}}]
        if m.kind == "url" and m.url:
            return [{"type": "video", "video": {"url": m.url, "mime_type": mime, "data": None}}]
        return [{"type": "text", "text": f"[Video: {m.url or m.file_id or 'unknown'}]"}]
    return []  # tool results, reasoning and the rest carry no content part


def _image_url(m: MediaRef) -> str:
    if m.kind == "data" and m.data_base64:
        return f"data:{m.mime_type or 'image/png'};base64,{m.data_base64}"
    if m.kind == "url" and m.url:
        return m.url
    if m.kind == "file_id" and m.file_id:
        return m.file_id
    return m.url or m.file_id or ""


def _document_part(block: DocumentBlock) -> dict[str, Any]:
    if block.excerpt:
        return {"type": "text", "text": block.excerpt}
    m = block.media
    mime = m.mime_type or "application/pdf"
    if m.kind == "data" and m.data_base64:
        return {"type": "document", "document": {"data": m.data_base64, "mime_type": mime, "url": None, "text": None}}
    if m.kind == "url" and m.url:
        return {"type": "document", "document": {"url": m.url, "mime_type": mime, "data": None, "text": None}}
    if m.kind == "file_id" and m.file_id:
        return {"type": "text", "text": f"[Document file_id: {m.file_id}]"}
    return {"type": "text", "text": "[Document: unsupported reference]"}
