"""Node: a named callable, with the parameter-injection plan of 10xGraph computed once."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
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

    def arguments(self, state: Any, config: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
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
        args, kwargs = self.arguments(state, config)
        if self.is_async:
            return await self.func(*args, **kwargs)
        # Off the event loop; asyncio.to_thread carries the caller's contextvars into the thread.
        result = await asyncio.to_thread(self.func, *args, **kwargs)
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
        result = await asyncio.to_thread(self.func, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

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
