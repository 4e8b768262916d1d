"""State, message, reducer and streaming models of a graph run."""

from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.context_manager import BaseContextManager, MessageContextManager
from tenxgraph.core.state.execution_state import (
    ExecutionState,
    ExecutionStatus,
    StopRequestStatus,
)
from tenxgraph.core.state.message import Message, TokenUsages
from tenxgraph.core.state.message_block import (
    AnnotationBlock,
    AnnotationRef,
    AudioBlock,
    ContentBlock,
    DataBlock,
    DocumentBlock,
    ErrorBlock,
    ImageBlock,
    MediaRef,
    ReasoningBlock,
    RemoteToolCallBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    VideoBlock,
)
from tenxgraph.core.state.reducers import (
    REMOVE_ALL_MESSAGES,
    RemoveMessage,
    add_messages,
    append_items,
    remove_tool_messages,
    replace_messages,
    replace_value,
)
from tenxgraph.core.state.stream_chunks import StreamChunk, StreamEvent
from tenxgraph.core.state.stream_emitter import StreamEmitter
from tenxgraph.core.state.tool_result import ToolResult

# The summary manager pulls in the model layer; loaded on first access so state models stay light.
from tenxgraph._lazy import lazy_exports  # noqa: E402

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "SummaryContextManager": "tenxgraph.core.state.summary_context_manager"})

__all__ = [
    "REMOVE_ALL_MESSAGES",
    "AgentState",
    "AnnotationBlock",
    "AnnotationRef",
    "AudioBlock",
    "BaseContextManager",
    "ContentBlock",
    "DataBlock",
    "DocumentBlock",
    "ErrorBlock",
    "ExecutionState",
    "ExecutionStatus",
    "ImageBlock",
    "MediaRef",
    "Message",
    "MessageContextManager",
    "ReasoningBlock",
    "RemoteToolCallBlock",
    "RemoveMessage",
    "StopRequestStatus",
    "StreamChunk",
    "StreamEmitter",
    "StreamEvent",
    "SummaryContextManager",
    "TextBlock",
    "TokenUsages",
    "ToolCallBlock",
    "ToolResult",
    "ToolResultBlock",
    "VideoBlock",
    "add_messages",
    "append_items",
    "remove_tool_messages",
    "replace_messages",
    "replace_value",
]
