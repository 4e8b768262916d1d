"""Message: one turn of the conversation, and the id generator hook it draws ids from."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal
import os

from pydantic import (
    BaseModel,
    Field,
    SerializationInfo,
    field_serializer,
    field_validator,
)

from tenxgraph.core.state.message_block import ContentBlock, TextBlock, ToolResultBlock

__all__ = [
    "IdGenerator",
    "Message",
    "TokenUsages",
    "generate_id",
    "get_id_generator",
    "set_id_generator",
]

MessageId = str | int
IdGenerator = Callable[[], MessageId | Awaitable[MessageId | None] | None]

# Stands in for 10xGraph's DI-bound "generated_id" factory: StateGraph(id_generator=...)
# installs one here. A generator that returns "" or None defers to the explicit/default id.
_id_generator: IdGenerator | None = None

# The generator of the graph whose run this context belongs to. 10xGraph's container is
# process-wide, so a second graph's generator named the first graph's messages too; a run's
# nodes and tools start from a copy of the context its graph set this in, so each graph's runs
# get its own generator (random ids for a graph built without one), and code outside any run
# still gets the process-wide one.
_OUTSIDE_RUNS: Any = object()
_run_id_generator: contextvars.ContextVar[IdGenerator | None] = contextvars.ContextVar(
    "tenxgraph_run_id_generator", default=_OUTSIDE_RUNS)


def set_id_generator(fn: IdGenerator | None) -> None:
    """Install (or with None, remove) the process-wide message id generator: the one
    ``generate_id`` uses outside the runs of a graph that has its own."""
    global _id_generator
    _id_generator = fn


def get_id_generator() -> IdGenerator | None:
    """The message id generator ``generate_id`` uses here: inside a run of a graph built with
    ``id_generator=``, that graph's (None for a graph built without one); outside runs the
    process-wide one, or None."""
    run = _run_id_generator.get()
    return _id_generator if run is _OUTSIDE_RUNS else run


def _use_run_id_generator(fn: IdGenerator | None) -> contextvars.Token[IdGenerator | None]:
    return _run_id_generator.set(fn)


def _reset_run_id_generator(token: contextvars.Token[IdGenerator | None]) -> None:
    _run_id_generator.reset(token)


def _resolve_awaitable(awaitable: Awaitable[Any]) -> Any:
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    # asyncio.run refuses to nest inside a running loop, so resolve on a private loop in a
    # worker thread. The awaitable must not be bound to the caller's loop.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def generate_id(default_id: MessageId | None = None) -> MessageId:
    """Pick a message id.

    A truthy value from the installed generator wins, even over an explicit ``default_id``
    (10xGraph's precedence, pinned by its tests). Otherwise ``default_id`` is kept unless it
    is None or "", and failing that a fresh ``str(uuid4())`` is returned.
    """
    generator = get_id_generator()
    if generator is not None:
        value = generator()
        if inspect.isawaitable(value):
            value = _resolve_awaitable(value)
        if value:
            return value if isinstance(value, int) else str(value)
    if default_id is not None and default_id != "":
        return default_id
    return _uuid4_text()


_VARIANT = "89ab89ab89ab89ab"  # the RFC 4122 variant's hex digit for each random one


def _uuid4_text() -> str:
    """``str(uuid4())`` without building a ``UUID`` or an int (a third of the time; every new
    message makes one): 16 random bytes as hex, the version digit set to 4 and the variant's
    two top bits to 10."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16)]}{h[17:20]}-{h[20:]}"


class TokenUsages(BaseModel):
    """Token counts a provider reported for one model reply (10xGraph's field names)."""
    completion_tokens: int
    prompt_tokens: int
    total_tokens: int
    reasoning_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0


def _now_timestamp() -> float:
    # The epoch time to the microsecond, as 10xGraph's ``datetime.now().timestamp()`` gives it,
    # read without building a local datetime (which, in the repeated hour of a DST change, also
    # gave a time an hour off). Integer nanoseconds rounded to the microsecond, then one
    # correctly rounded division: the float nearest that microsecond, as round(time.time(), 6)
    # gives it, at a fifth of round's cost (round goes through a decimal string).
    return (time.time_ns() + 500) // 1000 / 1e6


class Message(BaseModel):
    """A conversation message.

    ``tools_calls`` (10xGraph's spelling) holds OpenAI-shaped calls:
    ``[{"id": ..., "type": "function", "function": {"name": ..., "arguments": "<json>"}}]``.
    There is no ``tool_call_id`` field: a tool result names its call in
    ``ToolResultBlock.call_id`` and, for local tools, ``metadata["tool_call_id"]``.

    ``content`` also accepts a plain string, validated into ``[TextBlock(text=...)]``.
    A constructor ``message_id`` is kept as given; only the helpers (``text_message``,
    ``tool_message``) route an explicit id through ``generate_id``.
    """

    message_id: MessageId = Field(default_factory=lambda: generate_id(None))
    role: Literal["user", "assistant", "system", "tool"]
    content: list[ContentBlock]
    delta: bool = False
    tools_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    timestamp: float | None = Field(default_factory=_now_timestamp)
    metadata: dict[str, Any] = Field(default_factory=dict)
    usages: TokenUsages | None = None
    raw: dict[str, Any] | None = None
    parsed_content: dict[str, Any] | BaseModel | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_to_block(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [TextBlock(text=value)]
        return value

    @field_serializer("parsed_content", when_used="unless-none")
    def _dump_parsed_content(self, value: Any, info: SerializationInfo) -> Any:
        # Declared as BaseModel, a subclass instance would otherwise dump as {}.
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json" if info.mode_is_json() else "python")
        return value

    @staticmethod
    def generate_id(default_id: MessageId | None = None) -> MessageId:
        """Same as the module's ``generate_id``: the installed generator's truthy value first,
        then ``default_id`` unless None or "", else a fresh uuid4 string."""
        return generate_id(default_id)

    @classmethod
    def text_message(
        cls,
        content: str,
        role: Literal["user", "assistant", "system", "tool"] = "user",
        message_id: MessageId | None = None,
    ) -> Message:
        """A message of ``role`` holding one ``TextBlock`` with ``content``; its id from
        ``generate_id(message_id)``."""
        return cls(
            message_id=generate_id(message_id),
            role=role,
            content=[TextBlock(text=content)],
        )

    @classmethod
    def tool_message(
        cls,
        content: Sequence[ContentBlock] | str,
        message_id: MessageId | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Message:
        """A ``role="tool"`` message with ``content`` (a string or blocks, copied into a list) and
        ``meta`` copied into ``metadata``; its id from ``generate_id(message_id)``."""
        return cls(
            message_id=generate_id(message_id),
            role="tool",
            content=content if isinstance(content, str) else list(content),
            metadata=dict(meta) if meta else {},
        )

    def text(self) -> str:
        """Concatenated text of the text blocks and tool-result outputs."""
        parts: list[str] = []
        for block in self.content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                parts.append(_output_text(block.output))
            elif isinstance(block, dict):
                # Blocks stay dicts when a message is built with model_construct.
                kind = block.get("type")
                if kind == "text":
                    parts.append(str(block.get("text", "")))
                elif kind == "tool_result":
                    parts.append(_output_text(block.get("output")))
        return "".join(parts)


def _output_text(output: Any) -> str:
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if isinstance(output, BaseModel):
        return output.model_dump_json()
    return json.dumps(output, default=str)
