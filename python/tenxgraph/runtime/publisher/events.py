"""The event a publisher receives: where it comes from (``Event``), its phase (``EventType``),
what it carries (``ContentType``) and the run it belongs to (``EventModel``), as in 10xGraph 0.10."""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tenxgraph.core.state.message_block import ContentBlock

__all__ = ["ContentType", "Event", "EventModel", "EventType"]


class Event(StrEnum):
    """The source of an event."""

    GRAPH_EXECUTION = "graph_execution"
    NODE_EXECUTION = "node_execution"
    LLM_CALL = "llm_call"
    TOOL_EXECUTION = "tool_execution"
    STREAMING = "streaming"
    REALTIME = "realtime"


class EventType(StrEnum):
    """The phase of an event."""

    START = "start"
    PROGRESS = "progress"
    RESULT = "result"
    END = "end"
    UPDATE = "update"
    ERROR = "error"
    INTERRUPTED = "interrupted"


class ContentType(StrEnum):
    """What an event carries."""

    TEXT = "text"
    MESSAGE = "message"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    IMAGE = "image"
    AUDIO = "audio"
    TRANSCRIPT = "transcript"
    VIDEO = "video"
    DOCUMENT = "document"
    DATA = "data"
    STATE = "state"
    UPDATE = "update"
    ERROR = "error"


def _now() -> float:
    # 10xGraph's default was `datetime.now().timestamp` bound once at import, so every event
    # carried the same (import-time) value; each event here gets its own time.
    return time.time()


class EventModel(BaseModel):
    """One event of a run. Enum fields hold their string values (``use_enum_values``)."""

    model_config = ConfigDict(use_enum_values=True)

    event: Event = Field(..., description="Type of the event source")
    event_type: EventType = Field(..., description="Phase of the event (start, progress, end, update)")
    content: str = Field(default="", description="Streamed textual content")
    content_blocks: list[ContentBlock] | None = Field(default=None, description="Structured content blocks")
    data: dict[str, Any] = Field(default_factory=dict, description="Additional structured data")
    content_type: list[ContentType] | None = Field(default=None, description="Semantic type of content")
    node_name: str = Field(default="", description="Name of the node producing this event")
    run_id: str = Field(default_factory=lambda: str(uuid.uuid4()), description="Unique ID for this run")
    thread_id: str | int = Field(default="", description="Thread ID for this execution")
    user_id: str | int | None = Field(default=None, description="User ID associated with this execution")
    timestamp: float = Field(default_factory=_now, description="UNIX timestamp of when the event was created")
    is_error: bool = Field(default=False, description="Marks this event as representing an error state")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Optional metadata for consumers")

    @classmethod
    def default(
        cls,
        base_config: dict[str, Any],
        data: dict[str, Any],
        content_type: list[ContentType],
        event: Event = Event.GRAPH_EXECUTION,
        event_type: EventType = EventType.START,
        node_name: str = "",
        extra: dict[str, Any] | None = None,
    ) -> EventModel:
        """An event of the run ``base_config`` describes (its thread, run, user and timestamp)."""
        metadata: dict[str, Any] = {
            "run_timestamp": base_config.get("timestamp", ""),
            "is_stream": base_config.get("is_stream", False),
        }
        if extra:
            metadata.update(extra)
        return cls(
            event=event,
            event_type=event_type,
            content_type=content_type,
            data=data,
            thread_id=base_config.get("thread_id", ""),
            node_name=node_name,
            run_id=base_config.get("run_id", ""),
            user_id=base_config.get("user_id"),
            metadata=metadata,
        )

    @classmethod
    def stream(
        cls,
        base_config: dict[str, Any],
        node_name: str = "",
        extra: dict[str, Any] | None = None,
    ) -> EventModel:
        """A streaming-update event (text and reasoning) of the run ``base_config`` describes."""
        event = cls.default(base_config, {}, [ContentType.TEXT, ContentType.REASONING], Event.STREAMING,
                            EventType.UPDATE, node_name, extra)
        return event
