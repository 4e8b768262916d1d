"""Callbacks, validators and graph lifecycle hooks, with 10xGraph 0.10's API.

A :class:`CallbackManager` is given to ``StateGraph.compile(callback_manager=...)``. Where its
parts run (see docs/migrating-from-10xgraph.md, "Callbacks and lifecycle hooks"):

- ``before_invoke`` / ``after_invoke`` / ``on_error`` for ``InvocationType.AI`` wrap every
  node that is not a ToolNode; for ``InvocationType.TOOL`` they wrap each tool call that really
  runs. A call answered from the tool ledger on replay runs nothing, so it fires none of them.
- input validators run on a run's input messages before anything is merged or persisted.
- lifecycle hooks fire at the points the Rust loop names (start, after each node, interrupt,
  end, error), in the same order on ``invoke``/``ainvoke`` and ``stream``/``astream``.
"""

from __future__ import annotations

import inspect
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union

from tenxgraph.core.state.message import Message

if TYPE_CHECKING:
    from tenxgraph.core.state.agent_state import AgentState

__all__ = [
    "AfterInvokeCallback",
    "AfterInvokeCallbackType",
    "BaseValidator",
    "BeforeInvokeCallback",
    "BeforeInvokeCallbackType",
    "CallbackContext",
    "CallbackManager",
    "GraphLifecycleContext",
    "GraphLifecycleHook",
    "InvocationType",
    "OnErrorCallback",
    "OnErrorCallbackType",
]

logger = logging.getLogger("tenxgraph.utils")

T = TypeVar("T")
R = TypeVar("R")
StateT = TypeVar("StateT", bound="AgentState")


class InvocationType(StrEnum):
    """What a callback is registered for."""

    AI = "ai"
    TOOL = "tool"
    MCP = "mcp"
    INPUT_VALIDATION = "input_validation"
    SKILL = "skill"


@dataclass
class CallbackContext:
    """What is being invoked: passed to every callback."""

    invocation_type: InvocationType
    node_name: str
    function_name: str | None = None
    metadata: dict[str, Any] | None = None


class BaseValidator(ABC):
    """A check on a run's input messages; raise (``ValidationError``) to refuse them."""

    @abstractmethod
    async def validate(self, messages: list[Message]) -> bool:
        """Return True when the messages pass; raise when they do not."""


class BeforeInvokeCallback(ABC, Generic[T, R]):
    """Runs before an invocation; returns the (possibly changed) input."""

    @abstractmethod
    async def __call__(self, context: CallbackContext, input_data: T) -> T | R: ...


class AfterInvokeCallback(ABC, Generic[T, R]):
    """Runs after an invocation; returns the (possibly changed) output."""

    @abstractmethod
    async def __call__(self, context: CallbackContext, input_data: T, output_data: Any) -> Any | R: ...


class OnErrorCallback(ABC):
    """Runs when an invocation raised; a returned ``Message`` replaces the failure."""

    @abstractmethod
    async def __call__(self, context: CallbackContext, input_data: Any, error: Exception) -> Any | None: ...


BeforeInvokeCallbackType = Union[
    BeforeInvokeCallback[Any, Any], Callable[[CallbackContext, Any], Union[Any, Awaitable[Any]]]
]
AfterInvokeCallbackType = Union[
    AfterInvokeCallback[Any, Any], Callable[[CallbackContext, Any, Any], Union[Any, Awaitable[Any]]]
]
OnErrorCallbackType = Union[
    OnErrorCallback, Callable[[CallbackContext, Any, Exception], Union[Any, None, Awaitable[Any]]]
]


@dataclass
class GraphLifecycleContext:
    """Passed to every lifecycle hook: the run's config (``thread_id``, ``run_id``, your keys)."""

    config: dict[str, Any]

    @property
    def thread_id(self) -> str:
        """``config["thread_id"]``, or "" when absent."""
        return self.config.get("thread_id", "")

    @property
    def run_id(self) -> str:
        """``config["run_id"]``, or "" when absent."""
        return self.config.get("run_id", "")


class GraphLifecycleHook(Generic[StateT]):
    """Override the methods you need; each may return a replacement state (None keeps it).

    A hook that raises is logged and skipped: it never fails the run. ``on_turn_start`` /
    ``on_turn_end`` belong to 10xGraph's realtime sessions, which tenxgraph does not have: they
    never fire here (nor in 10xGraph's invoke and stream runs)."""

    async def on_graph_start(self, context: GraphLifecycleContext, state: StateT) -> StateT | None:
        """The state is loaded and the input merged; no node has run and nothing is committed."""
        return None

    async def on_graph_end(
        self, context: GraphLifecycleContext, final_state: StateT, messages: list[Message], total_steps: int
    ) -> StateT | None:
        """The run reached END; the returned state is what the final commit persists."""
        return None

    async def on_graph_error(
        self,
        context: GraphLifecycleContext,
        error: Exception,
        partial_state: StateT,
        messages: list[Message],
        step: int,
        node_name: str,
    ) -> tuple[StateT, str] | None:
        """The run failed. Return ``(state, error_message)`` to change what is persisted; the
        error is raised to the caller either way."""
        return None

    async def on_interrupt(
        self, context: GraphLifecycleContext, interrupted_node: str, interrupt_type: str, state: StateT
    ) -> StateT | None:
        """The run pauses: ``interrupt_type`` is "before", "after", "interrupt" or "stop"."""
        return None

    async def on_resume(
        self, context: GraphLifecycleContext, resumed_node: str, state: StateT, resume_data: dict[str, Any]
    ) -> StateT | None:
        """A paused thread is resumed (fires just before ``on_graph_start``)."""
        return None

    async def on_checkpoint(
        self, context: GraphLifecycleContext, state: StateT, messages: list[Message], is_context_trimmed: bool
    ) -> tuple[StateT, list[Message]] | StateT | None:
        """Before every durable commit; a returned state is what it writes (a returned message
        list is ignored: the loop writes the context as it is)."""
        return None

    async def on_state_update(
        self, context: GraphLifecycleContext, node_name: str, old_state: StateT, new_state: StateT, step: int
    ) -> StateT | None:
        """A node finished and its result is merged, before routing and its step's commit."""
        return None

    async def on_turn_start(self, context: GraphLifecycleContext, state: StateT, turn_index: int) -> StateT | None:
        """Never fired by tenxgraph (10xGraph's realtime sessions only); kept so hooks written for
        10xGraph still subclass cleanly."""
        return None

    async def on_turn_end(self, context: GraphLifecycleContext, state: StateT, turn_index: int) -> StateT | None:
        """Never fired by tenxgraph (10xGraph's realtime sessions only); kept so hooks written for
        10xGraph still subclass cleanly."""
        return None


async def _call(callback: Any, *args: Any) -> Any:
    result = callback(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class CallbackManager:
    """The callbacks, validators and lifecycle hooks of a compiled graph."""

    def __init__(self) -> None:
        self._before_callbacks: dict[InvocationType, list[BeforeInvokeCallbackType]] = {t: [] for t in InvocationType}
        self._after_callbacks: dict[InvocationType, list[AfterInvokeCallbackType]] = {t: [] for t in InvocationType}
        self._error_callbacks: dict[InvocationType, list[OnErrorCallbackType]] = {t: [] for t in InvocationType}
        self._validators: list[BaseValidator] = []
        self._lifecycle_hooks: list[GraphLifecycleHook[Any]] = []

    # -- registration ---------------------------------------------------------------------

    def register_before_invoke(self, invocation_type: InvocationType, callback: BeforeInvokeCallbackType) -> None:
        """Adds a before-invoke callback for ``invocation_type`` (callbacks chain in registration
        order). Raises ValueError for an unknown invocation type."""
        self._before_callbacks[InvocationType(invocation_type)].append(callback)

    def register_after_invoke(self, invocation_type: InvocationType, callback: AfterInvokeCallbackType) -> None:
        """Adds an after-invoke callback for ``invocation_type``. Raises ValueError for an unknown
        invocation type."""
        self._after_callbacks[InvocationType(invocation_type)].append(callback)

    def register_on_error(self, invocation_type: InvocationType, callback: OnErrorCallbackType) -> None:
        """Adds an on-error callback for ``invocation_type``. Raises ValueError for an unknown
        invocation type."""
        self._error_callbacks[InvocationType(invocation_type)].append(callback)

    def register_input_validator(self, validator: BaseValidator) -> None:
        """Adds a validator run on every run's input messages before anything is merged or persisted."""
        self._validators.append(validator)

    def register_lifecycle_hook(self, hook: GraphLifecycleHook[Any]) -> None:
        """Adds a lifecycle hook; hooks fire in registration order."""
        self._lifecycle_hooks.append(hook)

    def clear_callbacks(self, invocation_type: InvocationType | None = None) -> None:
        """Removes the before/after/on-error callbacks of ``invocation_type`` (of every type when
        None). Validators and lifecycle hooks stay."""
        kinds = [InvocationType(invocation_type)] if invocation_type else list(InvocationType)
        for kind in kinds:
            self._before_callbacks[kind].clear()
            self._after_callbacks[kind].clear()
            self._error_callbacks[kind].clear()

    def get_callback_counts(self) -> dict[str, dict[str, int]]:
        """``{invocation type: {"before_invoke": n, "after_invoke": n, "on_error": n}}`` for every type."""
        return {
            kind.value: {
                "before_invoke": len(self._before_callbacks[kind]),
                "after_invoke": len(self._after_callbacks[kind]),
                "on_error": len(self._error_callbacks[kind]),
            }
            for kind in InvocationType
        }

    def wraps(self, invocation_type: InvocationType) -> bool:
        """Whether any invoke callback is registered for ``invocation_type`` (the runtime skips
        the wrapping otherwise)."""
        return bool(
            self._before_callbacks[invocation_type]
            or self._after_callbacks[invocation_type]
            or self._error_callbacks[invocation_type]
        )

    # -- invoke callbacks -----------------------------------------------------------------

    async def execute_before_invoke(self, context: CallbackContext, input_data: Any) -> Any:
        """Chains the before callbacks; one that raises gets the on_error callbacks, then raises."""
        data = input_data
        for callback in self._before_callbacks[context.invocation_type]:
            try:
                data = await _call(callback, context, data)
            except Exception as exc:
                await self.execute_on_error(context, input_data, exc)
                raise
        return data

    async def execute_after_invoke(self, context: CallbackContext, input_data: Any, output_data: Any) -> Any:
        """Chains the after callbacks over the output; one that raises is handled as above."""
        out = output_data
        for callback in self._after_callbacks[context.invocation_type]:
            try:
                out = await _call(callback, context, input_data, out)
            except Exception as exc:
                await self.execute_on_error(context, input_data, exc)
                raise
        return out

    async def execute_on_error(self, context: CallbackContext, input_data: Any, error: Exception) -> Message | None:
        """Every on_error callback runs; the last one's answer counts. A ``Message`` is a
        recovery value, None is none; anything else is ignored with a warning, and a callback
        that raises is logged and skipped."""
        recovery: Message | None = None
        for callback in self._error_callbacks[context.invocation_type]:
            try:
                result = await _call(callback, context, input_data, error)
            except Exception:
                logger.exception("on_error callback %r failed", callback)
                continue
            if result is None or isinstance(result, Message):
                recovery = result
            else:
                logger.warning("on_error callback %r returned %r, not a Message or None; ignored", callback, result)
        return recovery

    async def execute_validators(self, messages: list[Message], config: dict[str, Any] | None = None) -> bool:
        """Runs every validator on ``messages``; the first that raises refuses them."""
        for validator in self._validators:
            await validator.validate(messages)
        return True

    # -- lifecycle hooks ------------------------------------------------------------------

    async def _fire_chain(self, method: str, state: Any, call: Callable[[Any, Any], Awaitable[Any]]) -> Any:
        """Each hook sees the state the previous one returned (``call(bound_method, state)`` puts
        it where that hook method takes it); a failing hook is logged and skipped."""
        current = state
        for hook in self._lifecycle_hooks:
            try:
                changed = await call(getattr(hook, method), current)
            except Exception:
                logger.exception("lifecycle hook %s.%s failed", type(hook).__name__, method)
                continue
            if changed is not None:
                current = changed
        return current

    async def fire_on_graph_start(self, context: GraphLifecycleContext, state: Any) -> Any:
        """Runs every lifecycle hook's ``on_graph_start`` in registration order, each seeing the state
        the previous one returned (None keeps it); a hook that raises is logged and skipped. Returns
        the final state."""
        return await self._fire_chain("on_graph_start", state, lambda f, s: f(context, s))

    async def fire_on_graph_end(self, context: GraphLifecycleContext, final_state: Any,
                                messages: list[Message], total_steps: int) -> Any:
        """Runs every lifecycle hook's ``on_graph_end`` in registration order, each seeing the state
        the previous one returned (None keeps it); a hook that raises is logged and skipped. Returns
        the final state."""
        return await self._fire_chain("on_graph_end", final_state, lambda f, s: f(context, s, messages, total_steps))

    async def fire_on_graph_error(self, context: GraphLifecycleContext, error: Exception, partial_state: Any,
                                  messages: list[Message], step: int, node_name: str) -> tuple[Any, str]:
        """Runs every hook's ``on_graph_error``; a hook returning ``(state, message)`` replaces both
        for the next hook. Returns ``(state, message)`` (``str(error)`` unless a hook changed it); a
        hook that raises, or returns something other than a 2-tuple, is logged and skipped."""
        state, message = partial_state, str(error)
        for hook in self._lifecycle_hooks:
            try:
                result = await hook.on_graph_error(context, error, state, messages, step, node_name)
            except Exception:
                logger.exception("lifecycle hook %s.on_graph_error failed", type(hook).__name__)
                continue
            if result is None:
                continue
            # A hook must never fail the run: a return of the wrong shape is logged and ignored.
            if not (isinstance(result, tuple) and len(result) == 2):
                logger.error("lifecycle hook %s.on_graph_error returned %s, not (state, message): ignored",
                             type(hook).__name__, type(result).__name__)
                continue
            state, message = result
        return state, message

    async def fire_on_interrupt(self, context: GraphLifecycleContext, interrupted_node: str,
                                interrupt_type: str, state: Any) -> Any:
        """Runs every lifecycle hook's ``on_interrupt`` in registration order, each seeing the state
        the previous one returned (None keeps it); a hook that raises is logged and skipped. Returns
        the final state."""
        return await self._fire_chain(
            "on_interrupt", state, lambda f, s: f(context, interrupted_node, interrupt_type, s))

    async def fire_on_resume(self, context: GraphLifecycleContext, resumed_node: str, state: Any,
                             resume_data: dict[str, Any]) -> Any:
        """Runs every lifecycle hook's ``on_resume`` in registration order, each seeing the state the
        previous one returned (None keeps it); a hook that raises is logged and skipped. Returns the
        final state."""
        return await self._fire_chain(
            "on_resume", state, lambda f, s: f(context, resumed_node, s, resume_data))

    async def fire_on_checkpoint(self, context: GraphLifecycleContext, state: Any, messages: list[Message],
                                 is_context_trimmed: bool) -> tuple[Any, list[Message]]:
        """Runs every hook's ``on_checkpoint``; a returned ``(state, messages)`` replaces both, a
        returned state only the state. Returns ``(state, messages)``; a hook that raises is logged
        and skipped."""
        current, msgs = state, messages
        for hook in self._lifecycle_hooks:
            try:
                result = await hook.on_checkpoint(context, current, msgs, is_context_trimmed)
            except Exception:
                logger.exception("lifecycle hook %s.on_checkpoint failed", type(hook).__name__)
                continue
            if isinstance(result, tuple):
                if len(result) != 2:
                    logger.error("lifecycle hook %s.on_checkpoint returned a tuple of %d, not (state, messages): "
                                 "ignored", type(hook).__name__, len(result))
                    continue
                current, msgs = result
            elif result is not None:
                current = result
        return current, msgs

    async def fire_on_state_update(self, context: GraphLifecycleContext, node_name: str, old_state: Any,
                                   new_state: Any, step: int) -> Any:
        """Runs every lifecycle hook's ``on_state_update`` in registration order, each seeing the state
        the previous one returned (None keeps it); a hook that raises is logged and skipped. Returns
        the final state. The chain runs over ``new_state``."""
        return await self._fire_chain(
            "on_state_update", new_state, lambda f, s: f(context, node_name, old_state, s, step))

    async def fire_on_turn_start(self, context: GraphLifecycleContext, state: Any, turn_index: int) -> Any:
        """Runs every lifecycle hook's ``on_turn_start`` in registration order, each seeing the state
        the previous one returned (None keeps it); a hook that raises is logged and skipped. Returns
        the final state. The runtime never calls it."""
        return await self._fire_chain("on_turn_start", state, lambda f, s: f(context, s, turn_index))

    async def fire_on_turn_end(self, context: GraphLifecycleContext, state: Any, turn_index: int) -> Any:
        """Runs every lifecycle hook's ``on_turn_end`` in registration order, each seeing the state the
        previous one returned (None keeps it); a hook that raises is logged and skipped. Returns the
        final state. The runtime never calls it."""
        return await self._fire_chain("on_turn_end", state, lambda f, s: f(context, s, turn_index))
