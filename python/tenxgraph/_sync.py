"""The sync twin of a coroutine call, for the sync API (``invoke``, ``get_state``, ...).

Below both the graph and the checkpointers, which each offer sync wrappers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from typing import Any

__all__ = ["run_sync"]


def run_sync(coro: Any) -> Any:
    """Runs a coroutine from sync code; inside a running loop (Jupyter, an async app) it runs on a
    private loop in a worker thread instead of failing, with the caller's contextvars."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    ctx = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tenxgraph-sync") as pool:
        return pool.submit(ctx.run, asyncio.run, coro).result()
