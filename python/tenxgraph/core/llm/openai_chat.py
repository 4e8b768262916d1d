"""OpenAI chat completions: one request, and its reply (plain or streamed) as a ``Message``.

The reply's ``tools_calls`` are OpenAI-shaped dicts, which is what ``ToolNode`` runs; token usage
goes to ``Message.usages`` (``TokenUsages``) as 10xGraph records it. A streamed reply hands each
text delta to ``on_delta`` as a ``Message(delta=True)`` and returns the whole message at the end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from tenxgraph.core.llm.errors import UnreadableReplyError
from tenxgraph.core.llm.unreadable import reads_reply
from tenxgraph.core.state.message import Message, TokenUsages, generate_id
from tenxgraph.core.state.message_block import ReasoningBlock, TextBlock, ToolCallBlock
from tenxgraph.logs import run_logger

__all__ = ["call_chat", "completion_to_message"]

_log = run_logger("tenxgraph.agent")
_THINK = re.compile(r"<(think|thought)>(.*?)</\1>", re.DOTALL)

DeltaSink = Callable[[Message], None]


def _split_reasoning(content: str, reasoning: str) -> tuple[str, str]:
    """Reasoning some servers inline as ``<think>...</think>`` moves to ``reasoning``."""
    if reasoning or not content:
        return content, reasoning
    found = _THINK.search(content)
    if not found:
        return content, reasoning
    return (content[: found.start()] + content[found.end() :]).strip(), found.group(2).strip()


def _usage(usage: Any) -> TokenUsages | None:
    if usage is None:
        return None
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    completion_details = getattr(usage, "completion_tokens_details", None)
    return TokenUsages(
        completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
        prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        total_tokens=getattr(usage, "total_tokens", 0) or 0,
        reasoning_tokens=getattr(completion_details, "reasoning_tokens", 0) or 0,
        cache_read_input_tokens=getattr(prompt_details, "cached_tokens", 0) or 0,
    )


def _tool_call_block(call_id: str, name: str, arguments: str) -> ToolCallBlock:
    try:
        args = json.loads(arguments) if arguments else {}
    except ValueError:
        # Kept in tools_calls as sent: the ToolNode answers the model with a tool error it can read.
        _log.warning("the model sent tool call %s (%s) with arguments that are not JSON", call_id, name)
        args = {}
    return ToolCallBlock(id=call_id, name=name, args=args if isinstance(args, dict) else {})


def _build(*, message_id: Any, content: str, reasoning: str, calls: list[dict[str, Any]], parsed: Any,
           created: Any, metadata: dict[str, Any], usage: TokenUsages | None, raw: dict[str, Any] | None) -> Message:
    content, reasoning = _split_reasoning(content, reasoning)
    blocks: list[Any] = []
    if reasoning:
        blocks.append(ReasoningBlock(summary=reasoning))
    if content:
        blocks.append(TextBlock(text=content))
    for c in calls:
        blocks.append(_tool_call_block(c["id"], c["function"]["name"], c["function"]["arguments"]))
    return Message(
        message_id=generate_id(message_id),
        role="assistant",
        content=blocks,
        reasoning=reasoning,
        parsed_content=parsed,
        timestamp=created if created is not None else datetime.now().timestamp(),
        metadata=metadata,
        usages=usage,
        raw=raw,
        tools_calls=calls or None,
    )


def _text_of(value: Any) -> str:
    """A reply's text field as text. Some OpenAI-compatible servers send ``arguments`` as a JSON
    object, or ``content`` as a list of parts, where OpenAI sends a string."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "".join(str(p.get("text") or "") for p in value)
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _calls_of(message: Any) -> list[dict[str, Any]]:
    out = []
    for tc in getattr(message, "tool_calls", None) or []:
        fn = getattr(tc, "function", None)
        if fn is None:  # a custom (non-function) tool call: nothing a ToolNode can run
            continue
        call_id = "" if tc.id is None else str(tc.id)
        out.append({"id": call_id, "type": "function",
                    "function": {"name": _text_of(fn.name), "arguments": _text_of(fn.arguments)}})
    return out


@reads_reply("the chat completion")
def completion_to_message(response: Any, parsed: Any = None) -> Message:
    """A ``ChatCompletion`` as the assistant ``Message`` 10xGraph builds from it."""
    if getattr(response, "choices", None) is None:
        # No choices field at all (an empty list is an OpenAI reply: kept, with a warning).
        raise UnreadableReplyError(f"the chat completions endpoint answered with something that is not a "
                                   f"completion: {str(response)[:200]!r}")
    usage = _usage(getattr(response, "usage", None))
    choice = response.choices[0] if response.choices else None
    meta: dict[str, Any] = {"provider": "openai", "model": response.model}
    raw = response.model_dump(mode="json", warnings=False) if hasattr(response, "model_dump") else None
    if choice is None:
        _log.warning("the OpenAI reply %s has no choices", response.id)
        meta["finish_reason"] = "UNKNOWN"
        return _build(message_id=response.id, content="", reasoning="", calls=[], parsed=None,
                      created=getattr(response, "created", None), metadata=meta, usage=usage, raw=raw)
    message = choice.message
    meta.update(finish_reason=choice.finish_reason or "UNKNOWN",
                system_fingerprint=getattr(response, "system_fingerprint", None),
                service_tier=getattr(response, "service_tier", None))
    reasoning = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None) or ""
    if parsed is None:
        parsed = getattr(message, "parsed", None)
    return _build(message_id=response.id, content=_text_of(message.content), reasoning=str(reasoning),
                  calls=_calls_of(message), parsed=parsed, created=getattr(response, "created", None),
                  metadata=meta, usage=usage, raw=raw)


class _StreamedCalls:
    """Tool calls put together from a stream's deltas: an id and a name, then the arguments in
    pieces, each delta naming its call by ``index``. Some OpenAI-compatible servers send no
    index: such a delta names its call by its id, and one with neither continues the last call
    (before, two such calls were merged into one, and an indexed call beside one without an index
    ended the turn in a bare TypeError). Calls keep the order they started in."""

    def __init__(self) -> None:
        self.slots: list[dict[str, Any]] = []
        self._by_index: dict[int, dict[str, Any]] = {}
        self._by_id: dict[str, dict[str, Any]] = {}

    def slot(self, index: Any, call_id: Any) -> dict[str, Any]:
        index = index if isinstance(index, int) and not isinstance(index, bool) else None
        call_id = str(call_id) if call_id not in (None, "") else None
        found = self._by_index.get(index) if index is not None else None
        if found is None and call_id is not None:
            found = self._by_id.get(call_id)
        if found is None and index is None and call_id is None and self.slots:
            found = self.slots[-1]
        if found is None:
            found = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            self.slots.append(found)
        if index is not None:
            self._by_index.setdefault(index, found)
        if call_id is not None:
            found["id"] = call_id
            self._by_id[call_id] = found
        return found


@reads_reply("the chat completions stream")
async def _consume_stream(stream: Any, on_delta: DeltaSink | None, model: str) -> Message:
    text: list[str] = []
    reasoning: list[str] = []
    calls = _StreamedCalls()
    response_id = None
    created = None
    finish = None
    usage = None
    served_model = model
    async for chunk in stream:
        response_id = response_id or chunk.id
        created = created or getattr(chunk, "created", None)
        served_model = getattr(chunk, "model", None) or served_model
        if getattr(chunk, "usage", None) is not None:
            usage = _usage(chunk.usage)
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        delta = choice.delta
        if delta is None:
            continue
        piece = delta.content or ""
        thought = getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None) or ""
        for tc in getattr(delta, "tool_calls", None) or []:
            slot = calls.slot(getattr(tc, "index", None), getattr(tc, "id", None))
            fn = getattr(tc, "function", None)
            if fn is not None:
                if fn.name:
                    slot["function"]["name"] += _text_of(fn.name)
                if fn.arguments:
                    slot["function"]["arguments"] += _text_of(fn.arguments)
        text.append(piece)
        reasoning.append(str(thought))
        if on_delta is not None and (piece or thought):
            blocks: list[Any] = []
            if piece:
                blocks.append(TextBlock(text=piece))
            if thought:
                blocks.append(ReasoningBlock(summary=str(thought)))
            on_delta(Message(message_id=generate_id(chunk.id), role="assistant", content=blocks,
                             reasoning="".join(reasoning), delta=True))
    if finish is None and response_id is None:
        # Not one completion chunk: the endpoint does not speak this API (a proxy, a wrong URL).
        raise UnreadableReplyError("the chat completions stream ended without a single completion chunk")
    if finish is None:
        # No chunk said the reply was finished: the connection dropped mid-reply. A failed
        # request (retried per retry_config), never a partial turn committed as the answer.
        raise ConnectionError("the chat completions stream ended before its finish_reason")
    meta = {"provider": "openai", "model": served_model, "finish_reason": finish or "UNKNOWN"}
    return _build(message_id=response_id, content="".join(text), reasoning="".join(reasoning), calls=calls.slots,
                  parsed=None, created=created, metadata=meta, usage=usage, raw=None)


def _schema_format(schema: Any) -> Any:
    """``response_format`` for a schema when tools are offered too (the SDK's ``parse`` accepts
    only strict tools): the model's JSON schema, not strict."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return {"type": "json_schema",
                "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema(), "strict": False}}
    return schema


def _parse_content(schema: Any, message: Message) -> Any:
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)) or message.tools_calls:
        return None
    text = message.text()
    try:
        return schema.model_validate_json(text) if text else None
    except ValueError as exc:
        _log.warning("the model's reply does not match output_schema %s: %s", schema.__name__, exc)
        return None


async def _parse_or_keep(completions: Any, schema: Any, **request: Any) -> Message:
    """``parse`` (a strict schema, so the server holds the model to it), but a reply that does
    not validate is kept as text with no ``parsed_content``, as with tools or other providers:
    the SDK raised, so a reply StructuredOutputAgent exists to repair failed the node instead."""
    raw_calls = getattr(completions, "with_raw_response", None)
    if raw_calls is None or not hasattr(raw_calls, "parse"):  # a client without raw responses
        return completion_to_message(await completions.parse(response_format=schema, **request))
    raw = await raw_calls.parse(response_format=schema, **request)
    try:
        response = raw.parse()
    except ValidationError as exc:  # the content is not JSON, or fails the schema's constraints
        _log.warning("the model's reply does not match output_schema %s: %s", getattr(schema, "__name__", schema), exc)
        response = _unparsed_completion(raw)
    return completion_to_message(response)


@reads_reply("the chat completion")
def _unparsed_completion(raw: Any) -> Any:
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(raw.http_response.json())


async def call_chat(client: Any, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    stream: bool, call_kwargs: dict[str, Any], output_schema: Any = None,
                    on_delta: DeltaSink | None = None) -> Message:
    """One request to ``chat.completions`` and its reply as a Message."""
    kwargs = dict(call_kwargs)
    if tools:
        kwargs["tools"] = tools
    if output_schema is not None:
        if not tools:
            # ``parse`` left the beta namespace in later SDKs; the extra allows either.
            completions = client.chat.completions
            if not hasattr(completions, "parse"):
                completions = client.beta.chat.completions
            return await _parse_or_keep(completions, output_schema, model=model, messages=messages, **kwargs)
        response = await client.chat.completions.create(model=model, messages=messages,
                                                        response_format=_schema_format(output_schema), **kwargs)
        message = completion_to_message(response)
        message.parsed_content = _parse_content(output_schema, message)
        return message
    if stream:
        kwargs.setdefault("stream_options", {"include_usage": True})
        response = await client.chat.completions.create(model=model, messages=messages, stream=True, **kwargs)
        try:
            return await _consume_stream(response, on_delta, model)
        finally:
            close = getattr(response, "close", None)
            if close is not None:
                await close()
    response = await client.chat.completions.create(model=model, messages=messages, stream=False, **kwargs)
    return completion_to_message(response)
