"""Node: a named callable, with the parameter-injection plan of 10xGraph computed once."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

__all__ = ["Node"]


class Node:
    """A graph node. ``func`` receives the state (and the run config) as 10xGraph injects them:

    - exactly one required parameter, not named ``state``/``config``: it gets the state;
    - otherwise parameters named ``state`` and ``config`` get those;
    - any other required parameter fails the node with a TypeError (NodeError NODE_001).
    """

    def __init__(self, name: str, func: Callable[..., Any]) -> None:
        self.name = name
        self.func = func
        self._plan = _injection_plan(func)
        self.is_async = _is_async(func)

    @property
    def function_name(self) -> str:
        """What stream chunks call the node's function (10xGraph's ``function_name``): its
        ``__name__``, else the node's name (an Agent or a callable object has none; 10xGraph
        gave such an object's ``str()``, its address)."""
        name = getattr(self.func, "__name__", None)
        return name if isinstance(name, str) else self.name

    def arguments(self, state: Any, config: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The ``(args, kwargs)`` the node function is called with: the state, the config, or both, by
        its signature. TypeError naming the node when it has other required parameters."""
        kind, extra = self._plan
        if kind == "single":
            return [state], {}
        if extra:
            raise TypeError(
                f"Node '{self.name}' has required parameter(s) {extra} that cannot be injected; "
                "only 'state' and 'config' are supplied"
            )
        kwargs: dict[str, Any] = {}
        if kind in ("state", "both"):
            kwargs["state"] = state
        if kind in ("config", "both"):
            kwargs["config"] = config
        return [], kwargs

    async def call(self, state: Any, config: dict[str, Any]) -> Any:
        """Calls the node function with its arguments: a coroutine function awaited on the loop, a sync
        one in a worker thread (``asyncio.to_thread``, with the caller's contextvars); an awaitable it
        returns is awaited. Raises what the function raises."""
        args, kwargs = self.arguments(state, config)
        if self.is_async:
            return await self.func(*args, **kwargs)
        # Off the event loop; asyncio.to_thread carries the caller's contextvars into the thread.
        result = await asyncio.to_thread(_no_stop_iteration, self.func, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def input_data(self, state: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The node's arguments by name (10xGraph's ``input_data``, what AI callbacks see)."""
        kind, _ = self._plan
        if kind == "single":
            return {self._single_name(): state}
        args, kwargs = self.arguments(state, config)
        return kwargs

    async def call_with(self, input_data: dict[str, Any]) -> Any:
        """Calls the node with ``input_data`` as a callback may have changed it."""
        kind, _ = self._plan
        if kind == "single" and len(input_data) == 1 and self._single_name() in input_data:
            args, kwargs = [input_data[self._single_name()]], {}  # it may be positional-only
        else:
            args, kwargs = [], dict(input_data)
        if self.is_async:
            return await self.func(*args, **kwargs)
        result = await asyncio.to_thread(_no_stop_iteration, self.func, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def execute(self, config: dict[str, Any], state: Any, callback_mgr: Any = None) -> dict[str, Any]:
        """Runs this function node once, outside a graph, as 10xGraph's ``Node.execute`` does.

        Returns ``{"state", "messages", "next_node"}``: the node's messages are appended to
        ``state.context`` in place (or its returned state is taken), ``next_node`` is a Command's
        goto. AI callbacks of ``callback_mgr`` wrap the call, as in a run. A failure is a
        ``NodeError`` ``NODE_001`` caused by the original exception. Nothing is persisted: there
        is no checkpointer here, so ``interrupt()`` and tool replay-safety do not apply.
        """
        from tenxgraph._run_values import added, require_state, to_message
        from tenxgraph.core.exceptions import NodeError
        from tenxgraph.core.state.agent_state import AgentState
        from tenxgraph.core.state.reducers import add_messages
        from tenxgraph.utils.callbacks import CallbackContext, InvocationType
        from tenxgraph.utils.command import Command

        if not callable(self.func) or _is_graph_node_object(self.func):
            # A ToolNode or an Agent needs the run around it (the ledger, the model client).
            raise TypeError(
                f"Node.execute runs a function node; '{self.name}' holds a "
                f"{type(self.func).__name__}: run it inside a compiled graph (or ToolNode.invoke)"
            )
        if not isinstance(state, AgentState):
            raise TypeError(f"Node.execute needs an AgentState, got {type(state).__name__}")
        if not isinstance(config, dict):
            raise TypeError(f"Node.execute needs a config dict, got {type(config).__name__}")
        pre_len = len(state.context)
        pre_ctx = list(state.context)
        try:
            if callback_mgr is not None and callback_mgr.wraps(InvocationType.AI):
                ctx = CallbackContext(
                    invocation_type=InvocationType.AI,
                    node_name=self.name,
                    function_name=getattr(self.func, "__name__", str(self.func)),
                    metadata={"config": config},
                )
                input_data = self.input_data(state, config)
                try:
                    input_data = await callback_mgr.execute_before_invoke(ctx, input_data)
                    result = await self.call_with(input_data)
                    result = await callback_mgr.execute_after_invoke(ctx, input_data, result)
                except Exception as exc:
                    recovery = await callback_mgr.execute_on_error(ctx, input_data, exc)
                    if recovery is None:
                        raise
                    result = [recovery]
            else:
                result = await self.call(state, config)
            if result is None:
                raise ValueError("the node returned None: return a str, a Message, a list of them, the state, or a Command")
            next_node: str | None = None
            messages: list[Any] = []
            if isinstance(result, Command):
                next_node = result.goto
                if result.state is not None:
                    state = require_state(result.state)
                    messages = added(state, pre_ctx, pre_len)
                result = result.update
            if isinstance(result, AgentState):
                state = result
                messages = added(state, pre_ctx, pre_len)
            elif result is not None:
                items = result if isinstance(result, list) else [result]
                messages = [to_message(item) for item in items]
                state.context = add_messages(state.context, messages)
        except Exception as exc:
            raise NodeError(
                f"Error in node '{self.name}': {exc}",
                "NODE_001",
                {"node_name": self.name, "error_type": type(exc).__name__},
            ) from exc
        return {"state": state, "messages": messages, "next_node": next_node}

    async def stream(self, config: dict[str, Any], state: Any, callback_mgr: Any = None) -> AsyncIterator[Any]:
        """Runs this function node once, outside a graph, as 10xGraph's ``Node.stream`` does: yields
        an ``updates`` ``StreamChunk`` (``data["status"] == "invoking_node"``), then one
        (``"node_invoked"``), then each new message twice (the ``Message``, then a ``message``
        chunk), and last the result dict of :meth:`execute` plus ``is_non_streaming``.

        A node written as an async generator streams: each item it yields (a ``Message`` or a
        str; a ``StreamChunk`` is passed through) comes out as it is produced, is appended to
        ``state.context``, and the result dict has ``is_non_streaming`` False. A failure raises
        ``NodeError`` ``NODE_001`` after the first chunk. Nothing is persisted (no checkpointer).
        """
        from tenxgraph.core.state.stream_chunks import StreamChunk, StreamEvent

        fname = self.function_name

        def update(status: str) -> StreamChunk:
            return StreamChunk(event=StreamEvent.UPDATES, data={"status": status, "tool_name": fname, "node": self.name},
                               thread_id=config.get("thread_id") if isinstance(config, dict) else None,
                               run_id=config.get("run_id") if isinstance(config, dict) else None)

        def message_chunk(m: Any) -> StreamChunk:
            return StreamChunk(event=StreamEvent.MESSAGE, message=m, thread_id=config.get("thread_id"),
                               run_id=config.get("run_id"),
                               metadata={"node": self.name, "function_name": fname})

        yield update("invoking_node")
        if inspect.isasyncgenfunction(self.func) or inspect.isasyncgenfunction(getattr(self.func, "__call__", None)):
            async for item in self._stream_generator(config, state, fname):
                yield item
                if not isinstance(item, (dict, StreamChunk)):
                    yield message_chunk(item)
            return
        result = await self.execute(config, state, callback_mgr)
        yield update("node_invoked")
        for m in result["messages"]:
            yield m
            yield message_chunk(m)
        yield {"is_non_streaming": True, **result}

    async def _stream_generator(self, config: dict[str, Any], state: Any, fname: str) -> AsyncIterator[Any]:
        """The async-generator branch of :meth:`stream`: items as they come, then the result.
        (10xGraph 0.10 yielded none of such a node's messages.)"""
        from tenxgraph._run_values import to_message
        from tenxgraph.core.exceptions import NodeError
        from tenxgraph.core.state.agent_state import AgentState
        from tenxgraph.core.state.reducers import add_messages
        from tenxgraph.core.state.stream_chunks import StreamChunk, StreamEvent

        if not isinstance(state, AgentState):
            raise TypeError(f"Node.stream needs an AgentState, got {type(state).__name__}")
        if not isinstance(config, dict):
            raise TypeError(f"Node.stream needs a config dict, got {type(config).__name__}")
        messages: list[Any] = []
        args, kwargs = self.arguments(state, config)
        try:
            async for item in self.func(*args, **kwargs):
                if isinstance(item, StreamChunk):
                    yield item
                    continue
                m = to_message(item)
                messages.append(m)
                state.context = add_messages(state.context, [m])
                yield m
        except Exception as exc:
            raise NodeError(
                f"Error in node '{self.name}': {exc}",
                "NODE_001",
                {"node_name": self.name, "error_type": type(exc).__name__},
            ) from exc
        yield StreamChunk(event=StreamEvent.UPDATES,
                          data={"status": "node_invoked", "tool_name": fname, "node": self.name},
                          thread_id=config.get("thread_id"), run_id=config.get("run_id"))
        yield {"is_non_streaming": False, "state": state, "messages": messages, "next_node": None}

    def _single_name(self) -> str:
        try:
            params = [
                p for p in inspect.signature(self.func).parameters.values()
                if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
                and p.default is inspect.Parameter.empty
            ]
        except (TypeError, ValueError):
            return "state"
        return params[0].name if params else "state"

    def __repr__(self) -> str:
        return f"Node({self.name!r})"


def _is_graph_node_object(func: Any) -> bool:
    from tenxgraph.core.graph.tool_node import ToolNode

    return isinstance(func, ToolNode) or hasattr(func, "_tenxgraph_agent_node") or type(func).__name__ in (
        "Agent",
        "BaseAgent",
    )


def _is_async(func: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)


def _injection_plan(func: Callable[..., Any]) -> tuple[str, list[str]]:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return "single", []
    params = [
        p
        for p in sig.parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    required = [p for p in params if p.default is inspect.Parameter.empty]
    names = {p.name for p in params}
    if len(required) == 1 and required[0].name not in ("state", "config"):
        return "single", []
    extra = [p.name for p in required if p.name not in ("state", "config")]
    has_state, has_config = "state" in names, "config" in names
    kind = "both" if has_state and has_config else "state" if has_state else "config" if has_config else "none"
    return kind, extra


def _no_stop_iteration(func: Any, *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``, a ``StopIteration`` it raises turned into a ``RuntimeError``
    (as Python does for a coroutine): an asyncio future cannot hold a StopIteration, so a sync
    node's ``next(iter([]))`` never completed its ``to_thread`` future and the run waited for its
    node_timeout (900 s by default; 10xGraph the same). Red-team, session 35."""
    try:
        return func(*args, **kwargs)
    except StopIteration as exc:
        raise RuntimeError(f"the node raised StopIteration: {exc!r}") from exc

