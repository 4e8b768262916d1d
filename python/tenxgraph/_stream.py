"""Streaming a run: chunks produced while the Rust loop drives the graph.

Messages a node produced are held back until the step that produced them is committed (the host
hears about each commit), so a client never sees a step a crash could undo; tool results are
streamed the moment each tool returns (their ledger record follows within the same node). The run
is polled on the event loop's thread, so chunks are put on the consumer's queue right there; one
emitted from any other thread goes through ``call_soon_threadsafe`` (a syscall to wake the loop),
and while such a hand-off is pending, later chunks queue behind it, so the consumer sees them in
the order they were emitted.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from tenxgraph.core.state.message import Message
from tenxgraph.core.state.message_block import ErrorBlock
from tenxgraph.core.state.stream_chunks import StreamChunk, StreamEvent

__all__ = ["Emitter"]

_ALLOWED = {
    "low": {StreamEvent.MESSAGE, StreamEvent.ERROR},
    "partial": {StreamEvent.MESSAGE, StreamEvent.ERROR, StreamEvent.STATE},
    "full": {StreamEvent.MESSAGE, StreamEvent.ERROR, StreamEvent.STATE, StreamEvent.UPDATES},
}


class Emitter:
    def __init__(self, loop: asyncio.AbstractEventLoop, granularity: str, config: dict[str, Any]) -> None:
        self.loop = loop
        self.allowed = _ALLOWED[granularity]
        # The ids as the run reads them (str() of what was given; a thread id may stay an int, as
        # the chunk's type allows): a run id of 1 or a thread id of 1.5 ran under ainvoke and made
        # every chunk of astream fail its own validation, a raw ValidationError.
        tid, rid = config.get("thread_id"), config.get("run_id")
        self.thread_id = tid if tid is None or isinstance(tid, str) or type(tid) is int else str(tid)
        self.run_id = rid if rid is None or isinstance(rid, str) else str(rid)
        self.queue: asyncio.Queue[StreamChunk | None] = asyncio.Queue()
        self._held: list[StreamChunk] = []
        self._lock = threading.Lock()
        self._loop_thread = threading.get_ident()  # made by the run, on its loop's thread
        self._in_flight = 0  # chunks handed over with call_soon_threadsafe, not yet queued

    def _put(self, chunk: StreamChunk | None) -> None:
        with self._lock:
            direct = self._in_flight == 0 and threading.get_ident() == self._loop_thread
            if not direct:
                self._in_flight += 1
        if direct:
            self.queue.put_nowait(chunk)
        else:
            self.loop.call_soon_threadsafe(self._put_handed_over, chunk)

    def _put_handed_over(self, chunk: StreamChunk | None) -> None:
        with self._lock:
            self._in_flight -= 1
        self.queue.put_nowait(chunk)

    def wants(self, event: StreamEvent) -> bool:
        return event in self.allowed

    def make(self, event: StreamEvent, *, message: Message | None = None, state: Any = None,
             data: dict[str, Any] | None = None, **meta: Any) -> StreamChunk:
        return StreamChunk(event=event, message=message, state=state, data=data, metadata=meta,
                           thread_id=self.thread_id, run_id=self.run_id)

    def emit(self, chunk: StreamChunk) -> None:
        if chunk.event in self.allowed:
            self._put(chunk)

    def hold(self, chunk: StreamChunk) -> None:
        if chunk.event in self.allowed:
            with self._lock:
                self._held.append(chunk)

    def flush(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for chunk in held:
            self._put(chunk)

    def take_held(self) -> list[StreamChunk]:
        """What is still held back, for the consumer on the loop thread once the run ended."""
        with self._lock:
            held, self._held = self._held, []
        return held

    def delta_sink(self, node: str, function_name: str) -> Any:
        """Where a node's deltas (``Message(delta=True)``, e.g. a model's tokens) go: straight to
        the consumer, as 10xGraph streams them. They are never stored, so showing them early
        shows nothing a crash could undo; the node's final message is still held for its commit."""

        def emit(msg: Message) -> None:
            self.emit(self.make(StreamEvent.MESSAGE, message=msg, node=node, function_name=function_name))

        return emit

    def close(self) -> None:
        self._put(None)

    def input_message(self, msg: Message) -> None:
        """A message of the run's input, streamed first (10xGraph's metadata for it), once the
        input is committed: an input refused before the run starts (a paused thread, no
        messages for a new thread) is not shown as accepted."""
        self.hold(self.make(StreamEvent.MESSAGE, message=msg, status="invoking_graph",
                            reason="initial human message"))

    def node_message(self, msg: Message, node: str, function_name: str) -> None:
        """A message a (non-tool) node produced, held for its step's commit. The metadata has
        10xGraph's ``node`` and ``function_name`` (the node function's ``__name__``), and our
        ``status``."""
        self.hold(self.make(StreamEvent.MESSAGE, message=msg, status="node_invoked", node=node,
                            function_name=function_name))

    def tool_message(self, msg: Message, node: str, call: Any, *, now: bool) -> None:
        """A tool's result message. ``data`` is 10xGraph's: the tool's name, its arguments (the
        parsed JSON object; the raw value when that is not one), the call's id and the node, with
        ``status`` ``tool_result``; a failed call's chunk is an ERROR chunk whose ``data`` adds
        10xGraph's ``reason`` and ``error`` (the ErrorBlock's message). The message rides along in
        both, and the metadata keeps our ``status`` and ``node``."""
        data: dict[str, Any] = {"tool_name": call.name, "args": _arguments(call.arguments),
                                "tool_call_id": call.call_id or "", "node": node}
        error = next((b for b in msg.content if isinstance(b, ErrorBlock)), None)
        if error is not None:
            data = {"status": "tool_failed", **data, "reason": "Tool execution resulted in error",
                    "error": error.message}
            chunk = self.make(StreamEvent.ERROR, message=msg, data=data, status="tool_failed", node=node)
        else:
            chunk = self.make(StreamEvent.MESSAGE, message=msg, data={"status": "tool_result", **data},
                              status="tool_result", node=node)
        (self.emit if now else self.hold)(chunk)


def _arguments(raw: Any) -> Any:
    """A call's arguments as 10xGraph's stream shows them: the JSON object parsed; anything that
    does not parse to one (not JSON, nested past the interpreter's recursion limit: a
    RecursionError, not a ValueError) as the model sent it. Never raises: a chunk's decoration
    must not fail the node (it did, under ``astream`` only, in session 21's red-team pass)."""
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError):
            return raw
        return parsed if isinstance(parsed, dict) else raw
    return raw
