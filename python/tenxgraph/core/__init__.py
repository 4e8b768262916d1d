"""tenxgraph.core: exceptions, state models and (lazily) the graph builder."""

from __future__ import annotations


from tenxgraph._lazy import lazy_exports

from tenxgraph.core.exceptions import (
    GraphError,
    GraphRecursionError,
    GraphStopRequested,
    InvalidConfigError,
    MessageNotFoundError,
    MetricsError,
    NodeError,
    NodeTimeoutError,
    ResourceNotFoundError,
    SchemaVersionError,
    SerializationError,
    StaleStateError,
    StorageError,
    FailpointError,
    ForkedProcessError,
    ThreadBusyError,
    LeaseLostError,
    TransientStorageError,
)
from tenxgraph.core.state import (
    AgentState,
    AnnotationBlock,
    AnnotationRef,
    AudioBlock,
    BaseContextManager,
    ContentBlock,
    DataBlock,
    DocumentBlock,
    ErrorBlock,
    ExecutionState,
    ExecutionStatus,
    ImageBlock,
    MediaRef,
    Message,
    MessageContextManager,
    ReasoningBlock,
    StreamChunk,
    StreamEvent,
    TextBlock,
    TokenUsages,
    ToolCallBlock,
    ToolResult,
    ToolResultBlock,
    VideoBlock,
    add_messages,
    append_items,
    remove_tool_messages,
    replace_messages,
    replace_value,
)

# graph names are added by core/graph
# They load on first access (PEP 562) so that importing tenxgraph.core, e.g. from a
# checkpointer module, never pulls in the graph runtime and cannot create import cycles.
_GRAPH_NAMES = frozenset({"StateGraph", "CompiledGraph", "Edge", "Node", "RemoteToolConfig", "ToolNode", "Agent",
                          "BaseAgent"})


# RetryConfig lives with the model layer (10xGraph exports it here too); lazy for the same reason.
__getattr__, __dir__ = lazy_exports(__name__, globals(), {**dict.fromkeys(_GRAPH_NAMES, "tenxgraph.core.graph"),
                                                          "RetryConfig": "tenxgraph.core.llm.retry"})


__all__ = [
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
    "GraphError",
    "GraphRecursionError",
    "GraphStopRequested",
    "InvalidConfigError",
    "ImageBlock",
    "MediaRef",
    "Message",
    "MessageContextManager",
    "MessageNotFoundError",
    "MetricsError",
    "NodeError",
    "NodeTimeoutError",
    "ReasoningBlock",
    "ResourceNotFoundError",
    "RetryConfig",
    "SchemaVersionError",
    "SerializationError",
    "StaleStateError",
    "StorageError",
    "StreamChunk",
    "StreamEvent",
    "TextBlock",
    "FailpointError",
    "ForkedProcessError",
    "ThreadBusyError",
    "LeaseLostError",
    "TokenUsages",
    "ToolCallBlock",
    "ToolResult",
    "ToolResultBlock",
    "TransientStorageError",
    "VideoBlock",
    "add_messages",
    "append_items",
    "remove_tool_messages",
    "replace_messages",
    "replace_value",
]
