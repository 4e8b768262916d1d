"""Reducers: how a field's current value combines with an update.

A state field opts in with ``Annotated[T, reducer]``; the runtime reads the first callable
in the field metadata when it merges parallel tool branches and new node messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal, TypeVar

from pydantic import Field

from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import (
    ContentBlock,
    RemoteToolCallBlock,
    ToolCallBlock,
)

__all__ = [
    "REMOVE_ALL_MESSAGES",
    "RemoveMessage",
    "add_messages",
    "append_items",
    "remove_tool_messages",
    "replace_messages",
    "replace_value",
]

T = TypeVar("T")

# Message id of a tombstone that clears every message before it.
REMOVE_ALL_MESSAGES: Final = "__remove_all__"


class RemoveMessage(Message):
    """Tombstone: passed to ``add_messages``, it deletes the message with ``message_id``
    (or, with ``REMOVE_ALL_MESSAGES``, everything merged so far). Never kept in a context."""

    message_id: str | int
    role: Literal["user", "assistant", "system", "tool"] = "system"
    content: list[ContentBlock] = Field(default_factory=list)


def add_messages(
    left: Sequence[Message] | None, right: Sequence[Message] | Message | None
) -> list[Message]:
    """Append ``right`` to ``left``, skipping ids already present and streaming deltas.

    Tombstones in ``right`` apply in order: a ``RemoveMessage`` drops the message with its
    id (unknown ids are ignored); ``REMOVE_ALL_MESSAGES`` drops everything merged so far.
    """
    if isinstance(right, Message):
        right = [right]
    merged = [m for m in left or () if not isinstance(m, RemoveMessage)]
    ids = {m.message_id for m in merged}
    for msg in right or ():
        if isinstance(msg, RemoveMessage):
            if msg.message_id == REMOVE_ALL_MESSAGES:
                merged = []
                ids = set()
            elif msg.message_id in ids:
                merged = [m for m in merged if m.message_id != msg.message_id]
                ids.discard(msg.message_id)
            continue
        if msg.delta or msg.message_id in ids:
            continue
        merged.append(msg)
        ids.add(msg.message_id)
    return merged


def replace_messages(left: Sequence[Message] | None, right: list[Message]) -> list[Message]:
    """Reducer that keeps the node's list as it is, replacing the old one (no merge, no dedup)."""
    return right


def _item_id(item: Any) -> Any:
    if isinstance(item, dict):
        return item.get("id")
    return getattr(item, "id", None)


def append_items(left: Sequence[T] | None, right: Iterable[T] | None) -> list[T]:
    """Append ``right`` to ``left``, skipping items whose ``.id`` is already present.
    Items without an id (None) are always appended."""
    merged = list(left or ())
    seen = {i for i in map(_item_id, merged) if i is not None}
    for item in right or ():
        item_id = _item_id(item)
        if item_id is not None:
            if item_id in seen:
                continue
            seen.add(item_id)
        merged.append(item)
    return merged


def replace_value(left: T | None, right: T) -> T:
    """Reducer that keeps the node's value, replacing the old one."""
    return right


def _has_tool_calls(msg: Message) -> bool:
    return bool(msg.tools_calls) or any(
        isinstance(b, ToolCallBlock | RemoteToolCallBlock) for b in msg.content
    )


def _final_reply_index(messages: Sequence[Message], start: int) -> int | None:
    """Index of the assistant reply that closes the tool exchange opened at ``start``,
    or None while the exchange is still open (calls without results, no reply yet)."""
    j = start
    n = len(messages)
    while j < n and messages[j].role == "assistant" and _has_tool_calls(messages[j]):
        j += 1
        first_result = j
        while j < n and messages[j].role == "tool":
            j += 1
        if j == first_result:
            return None
    if j < n and messages[j].role == "assistant":
        return j
    return None


def remove_tool_messages(messages: Sequence[Message]) -> list[Message]:
    """Drop completed tool exchanges, keeping each exchange's final assistant reply.

    An exchange is one or more assistant messages with tool calls, each followed by its
    tool results, closed by an assistant reply without tool calls. Open exchanges are kept
    whole, since the model still needs the calls and results to continue.
    """
    kept: list[Message] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg.role == "assistant" and _has_tool_calls(msg):
            reply = _final_reply_index(messages, i)
            if reply is not None:
                i = reply
                continue
        kept.append(msg)
        i += 1
    return kept
