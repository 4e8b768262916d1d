"""The OpenAI Responses API (``Agent(api_style="responses")``): the chat-shaped conversation as
Responses input items, one request, and its reply (plain or streamed) as the same ``Message`` the
chat path builds (``tools_calls`` in OpenAI's chat shape, so the ToolNode and the next request
read them the same way)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tenxgraph.core.llm.errors import UnreadableReplyError
from tenxgraph.core.llm.openai_chat import DeltaSink, _tool_call_block
from tenxgraph.core.llm.unreadable import reads_reply
from tenxgraph.core.state.message import Message, TokenUsages, generate_id
from tenxgraph.core.state.message_block import ReasoningBlock, TextBlock

__all__ = ["call_responses", "response_to_message", "to_responses_request"]

# What 10xGraph shows for a reasoning item that has no summary.
_NO_SUMMARY = "(reasoning performed - enable summary to see details)"


def to_responses_request(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                         ) -> tuple[str | None, list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(instructions, input items, tools) as 10xGraph maps them: system prompts become the
    instructions, tool results ``function_call_output`` items, an assistant's tool calls
    ``function_call`` items, and chat tool schemas flat ``{"type": "function", "name", ...}``."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role", "")
        if role == "system":
            instructions.append(str(m.get("content", "")))
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id", ""),
                          "output": str(m.get("content", ""))})
        elif role == "assistant" and m.get("tool_calls"):
            if m.get("content"):
                items.append({"role": "assistant", "content": m["content"]})
            for call in m["tool_calls"]:
                fn = call.get("function", {})
                items.append({"type": "function_call", "name": fn.get("name", ""),
                              "arguments": fn.get("arguments", "{}"), "call_id": call.get("id", "")})
        else:
            items.append({"role": role, "content": m.get("content", "")})
    flat: list[dict[str, Any]] | None = None
    if tools:
        flat = []
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(fn, dict):
                flat.append(tool)
                continue
            entry = {"type": "function", "name": fn.get("name", ""), "description": fn.get("description", "")}
            for key in ("parameters", "strict"):
                if key in fn:
                    entry[key] = fn[key]
            flat.append(entry)
    return ("\n".join(instructions) if instructions else None), items, flat


def _usage(usage: Any) -> TokenUsages:
    if usage is None:
        return TokenUsages(prompt_tokens=0, completion_tokens=0, total_tokens=0)
    return TokenUsages(
        prompt_tokens=getattr(usage, "input_tokens", 0) or 0,
        completion_tokens=getattr(usage, "output_tokens", 0) or 0,
        total_tokens=getattr(usage, "total_tokens", 0) or 0,
        reasoning_tokens=getattr(getattr(usage, "output_tokens_details", None), "reasoning_tokens", 0) or 0,
        cache_read_input_tokens=getattr(getattr(usage, "input_tokens_details", None), "cached_tokens", 0) or 0,
    )


def _summary(item: Any) -> str:
    return "\n".join(getattr(s, "text", "") or "" for s in getattr(item, "summary", None) or [])


def _text(item: Any) -> str:
    return "\n".join(getattr(c, "text", "") or "" for c in getattr(item, "content", None) or []
                     if getattr(c, "type", None) == "output_text")


def _call(item: Any) -> dict[str, Any]:
    return {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": item.arguments or "{}"}}


@reads_reply("the Responses API response")
def response_to_message(response: Any, *, streamed: bool = False) -> Message:
    """A ``Response`` as 10xGraph's assistant ``Message``."""
    blocks: list[Any] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in getattr(response, "output", None) or []:
        kind = getattr(item, "type", None)
        if kind == "reasoning":
            summary = _summary(item) or _NO_SUMMARY
            blocks.append(ReasoningBlock(summary=summary))
            reasoning.append(summary)
        elif kind == "message":
            text = _text(item)
            if text:
                blocks.append(TextBlock(text=text))
        elif kind == "function_call":
            call = _call(item)
            calls.append(call)
            blocks.append(_tool_call_block(call["id"], call["function"]["name"], call["function"]["arguments"]))
    created = getattr(response, "created_at", None) or datetime.now().timestamp()
    return Message(
        message_id=generate_id(response.id),
        role="assistant",
        content=blocks,
        reasoning="\n".join(reasoning),
        timestamp=created,
        metadata={"provider": "openai", "model": getattr(response, "model", "unknown"),
                  "finish_reason": getattr(response, "status", "completed")},
        usages=_usage(getattr(response, "usage", None)),
        raw=None if streamed else response.model_dump(mode="json", warnings=False),
        tools_calls=calls or None,
    )


@reads_reply("the Responses API stream")
async def _consume(stream: Any, on_delta: DeltaSink | None) -> Message:
    final = None
    spoke = False  # any event of the API at all
    async for event in stream:
        kind = getattr(event, "type", "")
        spoke = spoke or (isinstance(kind, str) and kind.startswith("response."))
        if kind == "response.output_text.delta" and on_delta is not None and event.delta:
            on_delta(Message(message_id=generate_id(getattr(event, "item_id", None)), role="assistant",
                             content=[TextBlock(text=event.delta)], delta=True))
        elif kind == "response.reasoning_summary_text.delta" and on_delta is not None and event.delta:
            on_delta(Message(message_id=generate_id(getattr(event, "item_id", None)), role="assistant",
                             content=[ReasoningBlock(summary=event.delta)], delta=True))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            final = event.response
    if final is None and not spoke:
        # As the other providers' streams: the endpoint does not speak this API.
        raise UnreadableReplyError("the Responses stream ended without a single event of the API")
    if final is None:
        raise ConnectionError("the Responses stream ended without its response.completed event")
    # The completed event carries the whole response: the same message as without streaming.
    return response_to_message(final, streamed=True)


async def call_responses(client: Any, *, model: str, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None, stream: bool, call_kwargs: dict[str, Any],
                         reasoning: dict[str, Any] | None, on_delta: DeltaSink | None = None) -> Message:
    """One request to the OpenAI Responses API, built from chat-completions ``messages`` and
    ``tools``, answered as one assistant ``Message``. Streamed when ``stream``: each text and
    reasoning-summary delta goes to ``on_delta`` as a partial message, and the stream is closed
    however it ends. Raises what the SDK raises."""
    kwargs = dict(call_kwargs)
    kwargs.pop("reasoning_effort", None)  # a chat option; the Responses API takes ``reasoning``
    instructions, items, flat = to_responses_request(messages, tools)
    if instructions:
        kwargs["instructions"] = instructions
    if flat:
        kwargs["tools"] = flat
    if reasoning:
        kwargs["reasoning"] = reasoning
    response = await client.responses.create(model=model, input=items, stream=stream, **kwargs)
    if not stream:
        return response_to_message(response)
    try:
        return await _consume(response, on_delta)
    finally:
        close = getattr(response, "close", None)
        if close is not None:
            await close()
