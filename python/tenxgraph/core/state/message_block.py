"""Content blocks of a Message, discriminated on ``type``.

Each block validates from and dumps to plain JSON (``model_dump(mode="json")``), which is
the form stored in checkpoints and the tool ledger.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

__all__ = [
    "AnnotationBlock",
    "AnnotationRef",
    "AudioBlock",
    "ContentBlock",
    "DataBlock",
    "DocumentBlock",
    "ErrorBlock",
    "ImageBlock",
    "MediaRef",
    "ReasoningBlock",
    "RemoteToolCallBlock",
    "TextBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "VideoBlock",
]


class MediaRef(BaseModel):
    """Where media bytes live: a URL, a provider file id, or inline base64 data."""

    kind: Literal["url", "file_id", "data"] = "url"
    url: str | None = None
    file_id: str | None = None
    data_base64: str | None = None
    mime_type: str | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    filename: str | None = None
    width: int | None = None
    height: int | None = None
    duration_ms: int | None = None
    page: int | None = None


class AnnotationRef(BaseModel):
    """A source an annotation points at (citation target)."""

    url: str | None = None
    file_id: str | None = None
    page: int | None = None
    index: int | None = None
    title: str | None = None


class TextBlock(BaseModel):
    """Plain text, optionally with citation ``annotations``."""
    type: Literal["text"] = "text"
    text: str
    annotations: list[AnnotationRef] = Field(default_factory=list)


class ImageBlock(BaseModel):
    """An image by reference (``media``), with optional alt text and bounding box."""
    type: Literal["image"] = "image"
    media: MediaRef
    alt_text: str | None = None
    bbox: list[float] | None = None


class AudioBlock(BaseModel):
    """Audio by reference, with optional transcript, sample rate and channel count."""
    type: Literal["audio"] = "audio"
    media: MediaRef
    transcript: str | None = None
    sample_rate: int | None = None
    channels: int | None = None


class VideoBlock(BaseModel):
    """Video by reference, with an optional thumbnail."""
    type: Literal["video"] = "video"
    media: MediaRef
    thumbnail: MediaRef | None = None


class DocumentBlock(BaseModel):
    """A document (PDF, ...) by reference, optionally limited to ``pages`` or an ``excerpt``."""
    type: Literal["document"] = "document"
    media: MediaRef
    pages: list[int] | None = None
    excerpt: str | None = None


class DataBlock(BaseModel):
    """Arbitrary data of ``mime_type``, inline as base64 or by reference."""
    type: Literal["data"] = "data"
    mime_type: str
    data_base64: str | None = None
    media: MediaRef | None = None


class ToolCallBlock(BaseModel):
    """A tool call the model asked for: ``id`` (the call id the ledger key is built from),
    ``name`` and ``args``."""
    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    tool_type: str | None = None


class RemoteToolCallBlock(BaseModel):
    """Placeholder for a call the client executes; the graph pauses until it answers."""

    type: Literal["remote_tool_call"] = "remote_tool_call"
    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    tool_type: str = "remote"


class ToolResultBlock(BaseModel):
    """The answer to the tool call ``call_id``: ``output``, ``is_error`` and an optional
    ``status`` (completed / failed)."""
    type: Literal["tool_result"] = "tool_result"
    call_id: str
    output: Any = None
    is_error: bool = False
    status: Literal["completed", "failed"] | None = None


class ReasoningBlock(BaseModel):
    """Model reasoning. ``summary``/``details`` follow 10xGraph's block; ``thinking`` and
    ``signature`` carry provider-native reasoning (Anthropic) so it can be sent back.
    ``summary`` defaults to "" so a thinking-only block is valid."""

    type: Literal["reasoning"] = "reasoning"
    summary: str = ""
    details: list[str] | None = None
    thinking: str | None = None
    signature: str | None = None


class AnnotationBlock(BaseModel):
    """Citations or notes, with the text ``spans`` they refer to."""
    type: Literal["annotation"] = "annotation"
    kind: Literal["citation", "note"] = "citation"
    refs: list[AnnotationRef] = Field(default_factory=list)
    spans: list[tuple[int, int]] | None = None


class ErrorBlock(BaseModel):
    """An error shown in the conversation: ``message``, optional ``code`` and ``data``."""
    type: Literal["error"] = "error"
    message: str
    code: str | None = None
    data: dict[str, Any] | None = None


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | AudioBlock
    | VideoBlock
    | DocumentBlock
    | DataBlock
    | ToolCallBlock
    | RemoteToolCallBlock
    | ToolResultBlock
    | ReasoningBlock
    | AnnotationBlock
    | ErrorBlock,
    Field(discriminator="type"),
]
