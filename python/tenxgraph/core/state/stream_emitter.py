"""StreamEmitter: what a tool's ``emit`` parameter receives during ``stream`` / ``astream``, to put
progress chunks into the stream as it runs (10xGraph's ``tenxgraph.core.state.stream_emitter``).

Under ``invoke`` / ``ainvoke`` a tool gets ``emit=None``. Each method may be called from a sync
tool's worker thread: chunks are handed to the loop with ``call_soon_threadsafe``. A tool answered
from the ledger on a replay does not run, so it emits nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tenxgraph.core.state.stream_chunks import StreamChunk, StreamEvent

__all__ = ["StreamEmitter"]


class StreamEmitter:
    """Puts a running tool's chunks into the stream, tagged with the tool name, call id and
    node. Thread-safe: a sync tool may call it from its worker thread. Made by the tool node;
    not constructed by users."""
    def __init__(
        self,
        *,
        tool_name: str,
        tool_call_id: str,
        node_name: str,
        thread_id: str | None,
        run_id: str | None,
        queue: asyncio.Queue[Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._tool_name = tool_name
        self._tool_call_id = tool_call_id
        self._node_name = node_name
        self._thread_id = thread_id
        self._run_id = run_id
        self._queue = queue
        self._loop = loop

    def _send(self, event: StreamEvent, extra: dict[str, Any] | None, **fields: Any) -> None:
        data: dict[str, Any] = {"tool_name": self._tool_name, "tool_call_id": self._tool_call_id,
                                "node": self._node_name}
        data.update(extra or {})
        data.update(fields)
        chunk = StreamChunk(event=event, data=data, thread_id=self._thread_id, run_id=self._run_id)
        self._loop.call_soon_threadsafe(self._queue.put_nowait, chunk)

    def progress(self, message: str, data: dict[str, Any] | None = None) -> None:
        """A ``message`` chunk (shown at every granularity) with ``status="tool_progress"``."""
        self._send(StreamEvent.MESSAGE, data, status="tool_progress", message=message)

    def error(self, message: str, data: dict[str, Any] | None = None) -> None:
        """An ``error`` chunk with ``status="tool_failed"``; informational: the tool goes on."""
        self._send(StreamEvent.ERROR, data, status="tool_failed", message=message)

    def message(self, message: str, data: dict[str, Any] | None = None) -> None:
        """A ``message`` chunk with ``status="tool_message"``."""
        self._send(StreamEvent.MESSAGE, data, status="tool_message", message=message)

    def update(self, data: dict[str, Any]) -> None:
        """An ``updates`` chunk carrying ``data``."""
        self._send(StreamEvent.UPDATES, data)
