"""Google GenAI (Gemini API): the chat-shaped conversation as ``contents`` and a
``GenerateContentConfig``, one request (``generate_content`` or ``generate_content_stream``), and
its reply as the ``Message`` 10xGraph builds.

The request, as 10xGraph shapes it: system prompts join (newline) into ``system_instruction``;
assistant turns are ``model`` contents, an assistant's tool calls ``function_call`` parts (the
first carrying the call's ``thought_signature``, or the documented bypass value); consecutive
tool results merge into one user content of ``function_response`` parts (``{"result": text}``,
named after the call they answer); tools are ``FunctionDeclaration`` s with
``parameters_json_schema``; ``temperature`` and ``max_tokens`` go into the config;
``reasoning_config`` becomes a ``ThinkingConfig`` (``include_thoughts``, a budget by effort:
low 512, medium 8192, high 24576); ``output_schema`` becomes ``response_mime_type`` JSON and
``response_schema``, and may not be combined with tools (a ``ModelConfigError``, as 10xGraph
refuses it).

The reply: ``function_call`` parts become OpenAI-shaped ``tools_calls`` with fresh ids (Gemini
gives none), ``thought`` parts the reasoning, ``usage_metadata`` the ``TokenUsages``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from tenxgraph.core.llm.errors import ModelConfigError, UnreadableReplyError
from tenxgraph.core.llm.unreadable import reads_reply
from tenxgraph.core.state.message import Message, TokenUsages, generate_id
from tenxgraph.core.state.message_block import ReasoningBlock, TextBlock, ToolCallBlock
from tenxgraph.logs import run_logger

__all__ = ["THINKING_BUDGET_BY_EFFORT", "build_request", "call_google", "response_to_message"]

_log = run_logger("tenxgraph.agent")

DeltaSink = Callable[[Message], None]

THINKING_BUDGET_BY_EFFORT = {"low": 512, "medium": 8192, "high": 24576}
# Gemini 2.5/3 thinking models want a signature on a replayed function call; this is Google's
# documented value for a call whose signature is not known.
_BYPASS_SIGNATURE = b"skip_thought_signature_validator"


def _contents(messages: list[dict[str, Any]]) -> tuple[str | None, list[Any]]:
    from google.genai import types

    names = {c.get("id", ""): c.get("function", {}).get("name", "")
             for m in messages for c in m.get("tool_calls") or [] if c.get("id")}
    system: str | None = None
    contents: list[Any] = []
    results: list[Any] = []
    for m in messages:
        role, content = m.get("role", "user"), m.get("content", "")
        if role == "tool":
            name = names.get(m.get("tool_call_id", "")) or m.get("name") or m.get("tool_call_id") or "unknown_function"
            results.append(types.Part.from_function_response(name=name, response={"result": str(content or "")}))
            continue
        if results:
            # Gemini wants as many function responses in one user turn as the model turn had calls.
            contents.append(types.Content(role="user", parts=results))
            results = []
        if role == "system":
            system = str(content) if system is None else f"{system}\n{content}"
        elif role == "assistant" and m.get("tool_calls"):
            parts = [types.Part(text=str(content))] if content else []
            for i, call in enumerate(m["tool_calls"]):
                fn = call.get("function", {})
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except (TypeError, ValueError):
                    args = {}
                part = types.Part(function_call=types.FunctionCall(name=fn.get("name", ""),
                                                                   args=args if isinstance(args, dict) else {}))
                if i == 0:
                    sig = call.get("thought_signature")
                    part.thought_signature = base64.b64decode(sig) if sig else _BYPASS_SIGNATURE
                parts.append(part)
            contents.append(types.Content(role="model", parts=parts))
        elif str(content or "").strip():
            contents.append(types.Content(role="model" if role == "assistant" else "user",
                                          parts=[types.Part(text=str(content))]))
        # else: an empty turn (a reply with no parts), which Gemini refuses on every later
        # request of the thread ("empty text parameter")
    if results:
        contents.append(types.Content(role="user", parts=results))
    return system, contents


def build_request(*, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: dict[str, Any],
                  reasoning: dict[str, Any] | None, output_schema: Any) -> tuple[list[Any], Any]:
    """``(contents, config)`` for one turn (see the module's docstring)."""
    from google.genai import types

    if tools and output_schema is not None:
        raise ModelConfigError(
            "Google GenAI does not support tool calls together with structured output (output_schema): "
            "run the tools with plain text output, or extract the structure in a separate node",
            "LLM_CONFIG_003", {"option": "output_schema"})
    system, contents = _contents(messages)
    config: dict[str, Any] = {}
    if "temperature" in options:
        config["temperature"] = options["temperature"]
    if "max_tokens" in options or "max_output_tokens" in options:
        config["max_output_tokens"] = options.get("max_tokens", options.get("max_output_tokens"))
    cached = options.get("cached_content")
    if cached:
        config["cached_content"] = cached
        if system:
            # The cache holds the static system prompt; what the state filled in still goes first.
            contents = [types.Content(role="user", parts=[types.Part(text=system)]), *contents]
    elif system:
        config["system_instruction"] = system
    if tools and output_schema is None:
        declarations = []
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict):
                kw: dict[str, Any] = {"name": fn["name"], "description": fn.get("description", "")}
                if "parameters" in fn:
                    kw["parameters_json_schema"] = fn["parameters"]
                declarations.append(types.FunctionDeclaration(**kw))
        if declarations:
            config["tools"] = [types.Tool(function_declarations=declarations)]
    if reasoning and output_schema is None:
        thinking: dict[str, Any] = {"include_thoughts": True}
        if reasoning.get("thinking_level") is not None:
            thinking["thinking_level"] = reasoning["thinking_level"]
        elif reasoning.get("thinking_budget") is not None:
            thinking["thinking_budget"] = int(reasoning["thinking_budget"])
        elif reasoning.get("effort") in THINKING_BUDGET_BY_EFFORT:
            thinking["thinking_budget"] = THINKING_BUDGET_BY_EFFORT[reasoning["effort"]]
        config["thinking_config"] = types.ThinkingConfig(**thinking)
    if output_schema is not None:
        config["response_mime_type"] = "application/json"
        config["response_schema"] = output_schema
    return contents, (types.GenerateContentConfig(**config) if config else None)


def _usage(meta: Any) -> TokenUsages:
    return TokenUsages(
        completion_tokens=getattr(meta, "candidates_token_count", 0) or 0,
        prompt_tokens=getattr(meta, "prompt_token_count", 0) or 0,
        total_tokens=getattr(meta, "total_token_count", 0) or 0,
        cache_creation_input_tokens=0,
        cache_read_input_tokens=getattr(meta, "cached_content_token_count", 0) or 0,
        reasoning_tokens=getattr(meta, "thoughts_token_count", 0) or 0,
    )


def _parts(parts: list[Any]) -> tuple[list[Any], list[dict[str, Any]], str, str]:
    """(blocks, tool calls, text, reasoning) of a candidate's parts."""
    blocks: list[Any] = []
    calls: list[dict[str, Any]] = []
    text, reasoning = "", ""
    for part in parts:
        if getattr(part, "thought", None):
            if part.text:
                reasoning += part.text
                blocks.append(ReasoningBlock(summary=part.text))
            continue
        if part.text:
            text += part.text
            blocks.append(TextBlock(text=part.text))
        fc = getattr(part, "function_call", None)
        if fc:
            call_id = str(generate_id(None))
            args = dict(fc.args) if fc.args else {}
            blocks.append(ToolCallBlock(id=call_id, name=fc.name, args=args))
            call: dict[str, Any] = {"id": call_id, "type": "function",
                                    "function": {"name": fc.name, "arguments": json.dumps(args)}}
            if getattr(part, "thought_signature", None):
                # Kept so the next request can replay it verbatim (Gemini 3 requires it).
                call["thought_signature"] = base64.b64encode(part.thought_signature).decode()
            calls.append(call)
    return blocks, calls, text, reasoning


def _parsed(schema: Any, text: str) -> Any:
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)) or not text:
        return None
    try:
        return schema.model_validate_json(text)
    except ValueError as exc:
        _log.warning("the model's reply does not match output_schema %s: %s", schema.__name__, exc)
        return None


@reads_reply("the Gemini response")
def response_to_message(response: Any, output_schema: Any = None) -> Message:
    """A ``GenerateContentResponse`` as 10xGraph's assistant ``Message``."""
    candidates = response.candidates or []
    if not candidates and getattr(response, "prompt_feedback", None) is None and \
            getattr(response, "usage_metadata", None) is None:
        # A blocked prompt has no candidates but says why (prompt_feedback) and counts its
        # tokens; a reply with none of the three is not Gemini's.
        raise UnreadableReplyError(f"the Google GenAI endpoint answered with something that is not a "
                                   f"generate_content reply: {str(response)[:200]!r}")
    if not candidates:
        _log.warning("the Google GenAI reply has no candidates")
        return Message(message_id=generate_id(None), role="assistant", content=[],
                       timestamp=datetime.now().timestamp(), metadata={"provider": "google_genai", "model": ""},
                       usages=_usage(response.usage_metadata))
    candidate = candidates[0]
    parts = (candidate.content.parts or []) if candidate.content else []
    blocks, calls, text, reasoning = _parts(parts)
    created = response.create_time.timestamp() if getattr(response, "create_time", None) else None
    parsed = getattr(response, "parsed", None)
    if parsed is None and output_schema is not None and not calls:
        parsed = _parsed(output_schema, text)
    return Message(
        message_id=generate_id(getattr(response, "response_id", None)),
        role="assistant",
        content=blocks,
        reasoning=reasoning,
        timestamp=created or datetime.now().timestamp(),
        metadata={"provider": "google_genai", "model": response.model_version or "",
                  "finish_reason": str(candidate.finish_reason)},
        usages=_usage(response.usage_metadata),
        raw=None,
        tools_calls=calls or None,
        parsed_content=parsed if isinstance(parsed, (dict, BaseModel)) else None,
    )


@reads_reply("the Gemini response stream")
async def _consume(stream: Any, on_delta: DeltaSink | None, output_schema: Any) -> Message:
    text, reasoning = "", ""
    calls: list[dict[str, Any]] = []
    usage_meta: Any = None
    model = ""
    response_id = None
    finish = None
    candidates_seen = False
    async for chunk in stream:
        usage_meta = chunk.usage_metadata or usage_meta
        model = chunk.model_version or model
        response_id = response_id or getattr(chunk, "response_id", None)
        if not chunk.candidates:
            continue
        candidates_seen = True
        candidate = chunk.candidates[0]
        finish = candidate.finish_reason or finish
        parts = (candidate.content.parts or []) if candidate.content else []
        blocks, new_calls, piece, thought = _parts(parts)
        text += piece
        reasoning += thought
        calls.extend(new_calls)
        if on_delta is not None and (piece or thought or new_calls):
            on_delta(Message(message_id=generate_id(None), role="assistant", content=blocks, reasoning=reasoning,
                             tools_calls=list(calls) or None, delta=True))
    if finish is None and not candidates_seen and response_id is None and usage_meta is None:
        # Not one chunk of the API: the endpoint does not speak it (a proxy, a wrong URL, garbage).
        raise UnreadableReplyError("the Google GenAI stream ended without a single candidate")
    if finish is None:
        # A stream cut short is a failed request (retried), never a partial turn committed.
        raise ConnectionError("the Google GenAI stream ended without a finish reason")
    final: list[Any] = []
    if text:
        final.append(TextBlock(text=text))
    if reasoning:
        final.append(ReasoningBlock(summary=reasoning))
    for call in calls:
        final.append(ToolCallBlock(id=call["id"], name=call["function"]["name"],
                                   args=json.loads(call["function"]["arguments"])))
    parsed = _parsed(output_schema, text) if output_schema is not None and not calls else None
    return Message(message_id=generate_id(response_id), role="assistant", content=final, delta=False,
                   reasoning=reasoning, timestamp=datetime.now().timestamp(),
                   metadata={"provider": "google_genai", "model": model, "finish_reason": str(finish)},
                   usages=_usage(usage_meta) if usage_meta is not None else None,
                   tools_calls=calls or None, parsed_content=parsed)


async def call_google(client: Any, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                      stream: bool, options: dict[str, Any], reasoning: dict[str, Any] | None,
                      output_schema: Any = None, on_delta: DeltaSink | None = None) -> Message:
    """One ``generate_content`` (or ``generate_content_stream``) request and its reply as a Message."""
    contents, config = build_request(messages=messages, tools=tools, options=options, reasoning=reasoning,
                                     output_schema=output_schema)
    models = client.aio.models
    if not stream:
        response = await models.generate_content(model=model, contents=contents, config=config)
        return response_to_message(response, output_schema)
    response = await models.generate_content_stream(model=model, contents=contents, config=config)
    try:
        return await _consume(response, on_delta, output_schema)
    finally:
        close = getattr(response, "aclose", None)
        if close is not None:
            await close()
