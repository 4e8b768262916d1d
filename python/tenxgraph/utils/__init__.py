"""tenxgraph.utils: constants, Command, ThreadInfo, the @tool decorator, reducers, callbacks,
validators' base class and lifecycle hooks."""

from __future__ import annotations

from typing import Any

from tenxgraph.core.state.reducers import (
    add_messages,
    append_items,
    replace_messages,
    replace_value,
)
from tenxgraph.utils.callbacks import (
    AfterInvokeCallback,
    BaseValidator,
    BeforeInvokeCallback,
    CallbackContext,
    CallbackManager,
    GraphLifecycleContext,
    GraphLifecycleHook,
    InvocationType,
    OnErrorCallback,
)
from tenxgraph.utils.command import Command
from tenxgraph.utils.converter import convert_messages
from tenxgraph.utils.constants import (
    DEFAULT_ANONYMOUS_USER_ID,
    DEFAULT_NODE_TIMEOUT_SECONDS,
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    END,
    RESUME_KEY,
    START,
    ExecutionState,
    ResponseGranularity,
)
from tenxgraph.utils.thread_info import ThreadInfo
from tenxgraph.utils.tool_decorator import get_tool_metadata, has_tool_decorator, tool

# Imported eagerly and bound after the submodule loads: the package attribute `interrupt` must be
# the function (10xGraph's API), not the module `tenxgraph.utils.interrupt` of the same name.
from tenxgraph.utils.interrupt import GraphInterrupt, Interrupt, interrupt, pending_interrupt  # noqa: E402

# Utilities of 10xGraph's tenxgraph.utils (issue 14, item 8).
from tenxgraph.utils.background_task_manager import BackgroundTaskManager, TaskMetadata  # noqa: E402
from tenxgraph.utils.callable_utils import call_sync_or_async, run_coroutine  # noqa: E402
from tenxgraph.utils.id_generator import (  # noqa: E402
    AsyncIDGenerator,
    BaseIDGenerator,
    BigIntIDGenerator,
    DefaultIDGenerator,
    HexIDGenerator,
    IDType,
    IntIDGenerator,
    ShortIDGenerator,
    TimestampIDGenerator,
    UUIDGenerator,
)
from tenxgraph.utils.logging import SecretRedactionFilter, install_secret_redaction, logger, mask_secrets  # noqa: E402
from tenxgraph.utils.shutdown import (  # noqa: E402
    DelayedKeyboardInterrupt,
    GracefulShutdownManager,
    delayed_keyboard_interrupt,
    setup_exception_handler,
    shutdown_with_timeout,
)
from tenxgraph.utils.validators import (  # noqa: E402
    MessageContentValidator,
    PromptInjectionValidator,
    ValidationError,
    register_default_validators,
)

_ITEM8 = [
    "AsyncIDGenerator", "BackgroundTaskManager", "BaseIDGenerator", "BigIntIDGenerator", "DefaultIDGenerator",
    "DelayedKeyboardInterrupt", "GracefulShutdownManager", "HexIDGenerator", "IDType", "IntIDGenerator",
    "SecretRedactionFilter", "ShortIDGenerator", "TaskMetadata", "TimestampIDGenerator", "UUIDGenerator",
    "delayed_keyboard_interrupt", "install_secret_redaction", "logger", "mask_secrets", "setup_exception_handler",
    "shutdown_with_timeout",
    "MessageContentValidator", "PromptInjectionValidator", "ValidationError", "register_default_validators",
    "call_sync_or_async", "run_coroutine",
]

__all__ = [
    "AfterInvokeCallback",
    "BaseValidator",
    "BeforeInvokeCallback",
    "CallbackContext",
    "CallbackManager",
    "GraphLifecycleContext",
    "GraphLifecycleHook",
    "InvocationType",
    "OnErrorCallback",
    *_ITEM8,
    "GraphInterrupt",
    "Interrupt",
    "interrupt",
    "pending_interrupt",
    "DEFAULT_ANONYMOUS_USER_ID",
    "DEFAULT_NODE_TIMEOUT_SECONDS",
    "DEFAULT_TOOL_TIMEOUT_SECONDS",
    "END",
    "RESUME_KEY",
    "START",
    "Command",
    "ExecutionState",
    "ResponseGranularity",
    "ThreadInfo",
    "add_messages",
    "append_items",
    "convert_messages",
    "get_tool_metadata",
    "has_tool_decorator",
    "replace_messages",
    "replace_value",
    "tool",
]
