"""Calling code that may be sync or async, from either side (10xGraph 0.10's helpers)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from tenxgraph._sync import run_sync

__all__ = ["call_sync_or_async", "run_coroutine"]


def _is_async(func: Any) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


async def call_sync_or_async(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Awaits ``func(*args, **kwargs)``: a coroutine function is awaited on this loop; a sync
    one runs in a worker thread (it must not block the loop), and an awaitable it returns is
    awaited too."""
    if _is_async(func):
        return await func(*args, **kwargs)
    result = await asyncio.to_thread(func, *args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Runs ``coro`` to completion from sync code and returns its result. Called from a thread
    whose event loop is running (a sync callback inside an async app), it runs on a private loop
    in a worker thread: 10xGraph scheduled it on the running loop and blocked that same thread
    waiting for it, which never returned."""
    if not inspect.iscoroutine(coro):
        raise TypeError(f"run_coroutine needs a coroutine, got {type(coro).__name__}")
    return run_sync(coro)
