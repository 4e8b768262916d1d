"""Anthropic's Messages API: the chat-shaped conversation as a Messages request, one request,
and its reply (plain or streamed) as the ``Message`` 10xGraph builds.

The request, as 10xGraph shapes it: system prompts go to the top-level ``system`` (one text
block each); an assistant's tool calls become ``tool_use`` blocks; consecutive tool results are
merged into one user turn of ``tool_result`` blocks; a trailing assistant turn (a prefill,
which current models refuse) is dropped, or made a user turn when it is the only one; tools go
flat (``name``, ``description``, ``input_schema``); ``max_tokens`` defaults to 16000 (64000
streamed); ``reasoning_config`` becomes ``thinking={"type": "adaptive"}`` and
``output_config.effort``; ``output_schema`` becomes ``output_config.format``.

The reply: ``tool_use`` blocks become OpenAI-shaped ``tools_calls`` (what the ToolNode runs and
the next request reads back), ``thinking`` blocks the reasoning, and usage ``TokenUsages`` with
``total_tokens = input + output`` and the cache counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from tenxgraph.core.llm.errors import UnreadableReplyError
from tenxgraph.core.llm.unreadable import reads_reply
from tenxgraph.core.state.message import Message, TokenUsages, generate_id
from tenxgraph.core.state.message_block import ReasoningBlock, TextBlock, ToolCallBlock
from tenxgraph.logs import run_logger

__all__ = ["EXCLUDED_KWARGS", "build_request", "call_anthropic", "response_to_message"]

_log = run_logger("tenxgraph.agent")

DeltaSink = Callable[[Message], None]

DEFAULT_MAX_TOKENS = 16000
DEFAULT_MAX_TOKENS_STREAMING = 64000
# Agent options that configure the client or the agent, never sent with a request.
EXCLUDED_KWARGS = frozenset({"organization", "project", "timeout", "max_retries", "default_headers",
                             "default_query", "http_client", "api_key", "base_url", "anthropic_backend",
                             "anthropic_cache", "reasoning_effort", "auth_token", "middleware"})
# Models that answer HTTP 400 to temperature/top_p/top_k (10xGraph's list).
_NO_SAMPLING = frozenset({"claude-fable-5", "claude-mythos-5", "claude-opus-5", "claude-opus-4-8",
                          "claude-opus-4-7", "claude-sonnet-5"})


def _system(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    blocks = [{"type": "text", "text": str(m.get("content", ""))} for m in messages
              if m.get("role") == "system" and m.get("content")]
    return (blocks or None), [m for m in messages if m.get("role") != "system"]


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _has_text(m: dict[str, Any]) -> bool:
    return bool(str(m.get("content") or "").strip())


def _turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "tool":
            # Anthropic wants every result of one assistant turn in a single user turn.
            results.append({"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""),
                            "content": str(m.get("content", ""))})
            continue
        if results:
            out.append({"role": "user", "content": results})
            results = []
        if m.get("role") == "assistant" and m.get("tool_calls"):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m["content"]}] if _has_text(m) else []
            for call in m["tool_calls"]:
                fn = call.get("function", {})
                blocks.append({"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""),
                               "input": _arguments(fn.get("arguments"))})
            out.append({"role": "assistant", "content": blocks})
        elif _has_text(m):
            out.append({"role": m.get("role", "user"), "content": m.get("content", "")})
        # else: an empty turn (a reply that had no content blocks), which Anthropic refuses on
        # every later request of the thread ("all messages must have non-empty content")
    if results:
        out.append({"role": "user", "content": results})
    if out and out[-1]["role"] == "assistant":
        out = out[:-1] if len(out) > 1 else [{**out[0], "role": "user"}]
    return out


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(fn, dict)):
            out.append(tool)  # already Anthropic-shaped (a server tool): sent as given
            continue
        entry = {"name": fn.get("name", ""), "description": fn.get("description", ""),
                 "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}}
        if fn.get("strict") is not None:
            entry["strict"] = fn["strict"]
        out.append(entry)
    return out


def _schema_format(schema: Any) -> dict[str, Any]:
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return {"type": "json_schema", "schema": schema.model_json_schema(), "name": schema.__name__}
    return {"type": "json_schema", "schema": {}}


def build_request(*, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, stream: bool,
                  options: dict[str, Any], reasoning: dict[str, Any] | None, output_schema: Any
                  ) -> dict[str, Any]:
    """The keyword arguments of ``messages.create`` for one turn (see the module's docstring)."""
    kwargs = {k: v for k, v in options.items() if k not in EXCLUDED_KWARGS}
    system, rest = _system(messages)
    kwargs.setdefault("max_tokens", DEFAULT_MAX_TOKENS_STREAMING if stream else DEFAULT_MAX_TOKENS)
    base_model = model.removeprefix("anthropic.")
    if base_model in _NO_SAMPLING:
        dropped = [k for k in ("temperature", "top_p", "top_k") if kwargs.pop(k, None) is not None]
        if dropped:
            _log.warning("model %s rejects sampling parameters; dropped %s", model, ", ".join(dropped))
    if reasoning:
        kwargs.setdefault("thinking", {"type": "adaptive"})
        if reasoning.get("effort"):
            kwargs["output_config"] = {"effort": reasoning["effort"], **(kwargs.get("output_config") or {})}
    converted = _tools(tools)
    cache = options.get("anthropic_cache")
    if cache and "cache_control" not in kwargs:
        # The breakpoint goes at the end of the stable prefix: the last tool, the last system block.
        control = cache if isinstance(cache, dict) else {"type": "ephemeral"}
        if converted:
            converted[-1] = {**converted[-1], "cache_control": control}
        if system:
            system[-1] = {**system[-1], "cache_control": control}
    if converted:
        kwargs["tools"] = converted
    if system:
        kwargs["system"] = system
    if output_schema is not None:
        kwargs["output_config"] = {**(kwargs.get("output_config") or {}), "format": _schema_format(output_schema)}
    return {"model": model, "messages": _turns(rest), **kwargs}


def _usage(usage: Any, prompt_fallback: int = 0) -> TokenUsages:
    prompt = getattr(usage, "input_tokens", None)
    prompt = prompt_fallback if prompt is None else prompt
    completion = getattr(usage, "output_tokens", 0) or 0
    return TokenUsages(
        prompt_tokens=prompt or 0,
        completion_tokens=completion,
        total_tokens=(prompt or 0) + completion,
        reasoning_tokens=0,
        cache_creation_input_tokens=getattr(usage, "cache_creation_input_tokens", 0) or 0,
        cache_read_input_tokens=getattr(usage, "cache_read_input_tokens", 0) or 0,
    )


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _parsed(schema: Any, text: str, has_calls: bool) -> Any:
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)) or has_calls or not text:
        return None
    try:
        return schema.model_validate_json(text)
    except ValueError as exc:
        _log.warning("the model's reply does not match output_schema %s: %s", schema.__name__, exc)
        return None


@reads_reply("the Anthropic message")
def response_to_message(response: Any, output_schema: Any = None) -> Message:
    """An Anthropic ``Message`` reply as 10xGraph's assistant ``Message``. A refusal
    (``stop_reason`` ``refusal``) becomes a text message saying so, with ``metadata["refusal"]``."""
    if getattr(response, "type", None) != "message":
        raise UnreadableReplyError(f"the Anthropic Messages endpoint answered with something that is not a "
                                   f"message: {str(response)[:200]!r}")
    stop = getattr(response, "stop_reason", None)
    meta: dict[str, Any] = {"provider": "anthropic", "model": getattr(response, "model", ""),
                            "finish_reason": stop or "UNKNOWN"}
    raw = response.model_dump(mode="json", warnings=False) if hasattr(response, "model_dump") else {}
    usage = _usage(getattr(response, "usage", None))
    if stop == "refusal":
        details = getattr(response, "stop_details", None)
        explanation = getattr(details, "explanation", None)
        meta.update(refusal=True, refusal_category=getattr(details, "category", None),
                    refusal_explanation=explanation)
        _log.warning("Anthropic refused the request: %s", explanation)
        return Message(message_id=generate_id(getattr(response, "id", None)), role="assistant",
                       content=[TextBlock(text=explanation or "The model declined to respond to this request.")],
                       timestamp=datetime.now().timestamp(), metadata=meta, usages=usage, raw=raw)
    blocks: list[Any] = []
    calls: list[dict[str, Any]] = []
    reasoning = ""
    for block in getattr(response, "content", None) or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            blocks.append(TextBlock(text=getattr(block, "text", "")))
        elif kind == "thinking" and getattr(block, "thinking", ""):
            reasoning += block.thinking
            blocks.append(ReasoningBlock(summary=block.thinking))
        elif kind == "tool_use":
            args = getattr(block, "input", None)
            args = args if isinstance(args, dict) else {}
            blocks.append(ToolCallBlock(id=block.id, name=block.name, args=args))
            calls.append(_call(block.id, block.name, args))
        elif kind == "server_tool_use":
            # Run by Anthropic itself: a record, never a call for the ToolNode.
            args = getattr(block, "input", None)
            blocks.append(ToolCallBlock(id=block.id, name=block.name, args=args if isinstance(args, dict) else {},
                                        tool_type="server_tool"))
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    return Message(message_id=generate_id(getattr(response, "id", None)), role="assistant", content=blocks,
                   reasoning=reasoning or None, timestamp=datetime.now().timestamp(), metadata=meta,
                   usages=usage, raw=raw, tools_calls=calls or None,
                   parsed_content=_parsed(output_schema, text, bool(calls)))


@reads_reply("the Anthropic message stream")
async def _consume(stream: Any, on_delta: DeltaSink | None, output_schema: Any) -> Message:
    text, reasoning = "", ""
    open_calls: dict[int, dict[str, Any]] = {}
    calls: list[dict[str, Any]] = []
    stop = None
    model = ""
    message_id = None
    start_usage: Any = None
    final_usage: Any = None
    stopped = False
    async for event in stream:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message_id = event.message.id
            model = event.message.model or ""
            start_usage = event.message.usage
        elif kind == "content_block_start":
            block = event.content_block
            if getattr(block, "type", None) == "tool_use":
                open_calls[event.index] = {"id": block.id, "name": block.name, "json": ""}
        elif kind == "content_block_delta":
            delta = event.delta
            piece = ""
            if delta.type == "text_delta":
                piece = delta.text or ""
                text += piece
                out: Any = TextBlock(text=piece)
            elif delta.type == "thinking_delta":
                piece = delta.thinking or ""
                reasoning += piece
                out = ReasoningBlock(summary=piece)
            elif delta.type == "input_json_delta" and event.index in open_calls:
                # A fragment is not JSON yet: the call is complete at its content_block_stop.
                open_calls[event.index]["json"] += delta.partial_json or ""
            if piece and on_delta is not None:
                on_delta(Message(message_id=generate_id(message_id), role="assistant", content=[out], delta=True,
                                 metadata={"provider": "anthropic"}))
        elif kind == "content_block_stop":
            entry = open_calls.pop(event.index, None)
            if entry is not None:
                try:
                    args = json.loads(entry["json"] or "{}")
                except ValueError:
                    _log.warning("the streamed input of tool call %s (%s) is not JSON; using {}", entry["id"],
                                 entry["name"])
                    args = {}
                calls.append(_call(entry["id"], entry["name"], args if isinstance(args, dict) else {}))
        elif kind == "message_delta":
            stop = getattr(event.delta, "stop_reason", None) or stop
            final_usage = getattr(event, "usage", None) or final_usage
        elif kind == "message_stop":
            stopped = True
    if not stopped and message_id is None:
        # Not one event of the API: the endpoint does not speak it (a proxy, a wrong URL, garbage).
        raise UnreadableReplyError("the Anthropic stream ended without a single message_start event")
    if not stopped:
        # A stream cut short is a failed request (retried), never a partial turn committed.
        raise ConnectionError("the Anthropic stream ended before its message_stop event")
    blocks: list[Any] = []
    if text:
        blocks.append(TextBlock(text=text))
    if reasoning:
        blocks.append(ReasoningBlock(summary=reasoning))
    for call in calls:
        blocks.append(ToolCallBlock(id=call["id"], name=call["function"]["name"],
                                    args=json.loads(call["function"]["arguments"])))
    start_prompt = getattr(start_usage, "input_tokens", 0) or 0
    usage = _usage(final_usage, start_prompt) if final_usage is not None else _usage(start_usage)
    return Message(message_id=generate_id(message_id), role="assistant", content=blocks, delta=False,
                   reasoning=reasoning or None, timestamp=datetime.now().timestamp(),
                   metadata={"provider": "anthropic", "model": model, "finish_reason": stop or "UNKNOWN"},
                   usages=usage, tools_calls=calls or None, parsed_content=_parsed(output_schema, text, bool(calls)))


async def call_anthropic(client: Any, *, model: str, messages: list[dict[str, Any]],
                         tools: list[dict[str, Any]] | None, stream: bool, options: dict[str, Any],
                         reasoning: dict[str, Any] | None, output_schema: Any = None,
                         on_delta: DeltaSink | None = None) -> Message:
    """One ``messages.create`` request (streamed when ``stream``) and its reply as a Message."""
    request = build_request(model=model, messages=messages, tools=tools, stream=stream, options=options,
                            reasoning=reasoning, output_schema=output_schema)
    if not stream:
        return response_to_message(await client.messages.create(**request), output_schema)
    response = await client.messages.create(stream=True, **request)
    try:
        return await _consume(response, on_delta, output_schema)
    finally:
        close = getattr(response, "close", None)
        if close is not None:
            await close()
