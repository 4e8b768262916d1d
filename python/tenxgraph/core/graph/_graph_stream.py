"""Streaming on ``CompiledGraph``: ``astream`` and its sync twin ``stream``, and the chunks that
close a stream (the pause or stop, the summary, the error)."""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, cast

from tenxgraph._run_values import copy_message
from tenxgraph._runtime import Run
from tenxgraph._stream import Emitter
from tenxgraph._sync import run_loop
from tenxgraph.core.state.stream_chunks import StreamChunk, StreamEvent
from tenxgraph.utils.constants import ResponseGranularity

if TYPE_CHECKING:
    from tenxgraph.core.graph.compiled_graph import CompiledGraph
    from tenxgraph.runtime.publisher.publish import EventOutbox

__all__ = ["StreamingRuns", "SYNC_EVENT_FLUSH_SECONDS"]

# How long a sync run (invoke, stream) waits for its last events to reach a slow publisher: its
# private event loop ends with the run.
SYNC_EVENT_FLUSH_SECONDS = 1.0


def _final_chunks(emitter: Emitter, run: Run, outcome: dict[str, Any], started: float) -> list[StreamChunk]:
    """The chunks that close a stream: a pause, a stop, and (FULL) the summary."""
    exec_meta = outcome["exec"]
    chunks = []
    if outcome.get("stopped"):
        chunks.append(emitter.make(StreamEvent.UPDATES, data={"status": "stopped",
                                   "reason": "Graph execution stopped by request"}, status="stopped"))
    elif exec_meta["status"] in ("interrupted_before", "interrupted_after"):
        reason = exec_meta.get("interrupt_reason")
        data: dict[str, Any] = {"status": "interrupted", "reason": reason, "node": exec_meta.get("interrupted_node")}
        if reason == "remote_tool_call":  # the text 10xGraph's clients look for
            data.update(reason="Remote tool call - graph interrupted", interrupt_reason=reason)
        if exec_meta.get("interrupt_data") and "interrupt" in exec_meta["interrupt_data"]:
            data["interrupt"] = exec_meta["interrupt_data"]["interrupt"]
        chunks.append(emitter.make(StreamEvent.UPDATES, data=data, status="interrupted"))
    response = run.response("low")
    chunks.append(emitter.make(StreamEvent.UPDATES, data={
        "status": "graph_invoked", "reason": "Graph execution finished",
        "time_taken": time.perf_counter() - started,
        "is_interrupted": exec_meta["status"] in ("interrupted_before", "interrupted_after"),
        "total_messages": len(response["messages"]), **response["token_usage"]}, status="graph_invoked"))
    return [c for c in chunks if emitter.wants(c.event)]


def _error_chunk(emitter: Emitter, run: Run, exc: Exception) -> StreamChunk:
    """The ERROR chunk of a failed run: 10xGraph's keys (``reason``, and ``node``, ``step``,
    ``max_steps`` when a node raised), ``error`` and ``error_code``, and the state as it was
    when the failing node started."""
    data: dict[str, Any] = {"status": "invoked_graph", "reason": str(exc), "error": str(exc),
                            "error_code": getattr(exc, "error_code", None)}
    if run.failed_at is not None:
        data["node"], data["step"] = run.failed_at
        if run.options is not None:
            data["max_steps"] = run.options.recursion_limit
    return emitter.make(StreamEvent.ERROR, data=data, status="invoked_graph", state=run.state)


class StreamingRuns:
    """Mixin of ``CompiledGraph``: a run whose messages are handed out as its steps commit."""

    _outbox: EventOutbox | None

    async def astream(
        self,
        input_data: dict[str, Any],
        config: dict[str, Any] | None = None,
        response_granularity: ResponseGranularity | str = ResponseGranularity.LOW,
    ) -> AsyncIterator[StreamChunk]:
        """Streams a run with the same guarantees as ``ainvoke`` (the same Rust loop, ledger,
        per-step commits, timeouts and stop). A node's messages are yielded once its step is
        committed; tool results as each tool returns. Leaving the iterator early (break, or the
        consuming task cancelled) cancels the run's in-flight Python work; committed steps stay.
        """
        graph = cast("CompiledGraph[Any]", self)
        granularity = ResponseGranularity(response_granularity).value
        cfg, options = graph._prepare_config(config)
        cfg["is_stream"] = True
        run = Run(graph, cfg, input_data)
        run.options = options
        await graph._validate_input(run, cfg)
        # A streamed run hands its messages out as they are: its state is not kept afterwards.
        run.known = graph._live.take((str(cfg["thread_id"]), str(cfg["user_id"])))
        emitter = Emitter(asyncio.get_running_loop(), granularity, cfg)
        run.emitter = emitter
        for m in run.input_messages:
            emitter.input_message(m)
        started = time.perf_counter()
        task = asyncio.ensure_future(graph._execute(run, cfg, streaming=True))
        task.add_done_callback(lambda _t: emitter.close())
        try:
            # The end-of-run sentinel is queued after every chunk scheduled before it.
            while (chunk := await emitter.queue.get()) is not None:
                yield chunk
            try:
                outcome = task.result()
            except Exception as exc:
                emitter.take_held()  # a step that did not commit is never shown
                if run.commits:  # a request refused before its run started gets only the error
                    yield _error_chunk(emitter, run, exc)
                raise
            for chunk in emitter.take_held():  # nothing normally: the final commit flushed it all
                yield chunk
            if run.answered_from_store:
                # A finished thread asked to finish ({}): nothing ran, and ainvoke returns the
                # stored last turn; a client that lost the end of its stream (a kill right after
                # the last commit) reconnects this way, so it gets that turn here too.
                for m in run.produced:
                    yield emitter.make(StreamEvent.MESSAGE, message=copy_message(m), status="node_invoked")
            for chunk in _final_chunks(emitter, run, outcome, started):
                yield chunk
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def stream(
        self,
        input_data: dict[str, Any],
        config: dict[str, Any] | None = None,
        response_granularity: ResponseGranularity | str = ResponseGranularity.LOW,
    ) -> Iterator[StreamChunk]:
        """Sync ``astream``: the run goes on a private event loop in a worker thread."""
        out: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=256)
        stop = threading.Event()
        running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []
        # The thread that last asked for a chunk. A generator still referenced when its thread
        # ends (a script's last line) is never closed: the worker, waiting on a full queue, kept
        # the interpreter from exiting for good (red-team, session 36). It gives up then.
        consumer = [threading.current_thread()]

        def offer(item: tuple[str, Any]) -> bool | None:
            """Puts ``item`` for the consumer within 0.1 s: True; None while the queue stays full;
            False once the consumer has left: the generator closed, or, with the queue full, the
            thread that last read it ended (the run is then cut, as when a consumer leaves the
            loop). While there is room the chunks are queued whoever reads next: a generator
            handed to another thread after the first ended is served (second red-team)."""
            if stop.is_set():
                return False
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                return None if consumer[0].is_alive() else False

        async def pump() -> None:
            task = asyncio.current_task()
            assert task is not None
            running.append((asyncio.get_running_loop(), task))
            if stop.is_set():  # the consumer left before the run started
                return
            agen = self.astream(input_data, config, response_granularity)
            try:
                async for chunk in agen:
                    while (handed := offer(("chunk", chunk))) is None:
                        await asyncio.sleep(0)  # the run's other tasks go on meanwhile
                    if not handed:
                        break
            finally:
                await agen.aclose()
                if self._outbox is not None:  # the private loop ends with the run (see invoke)
                    await self._outbox.flush(SYNC_EVENT_FLUSH_SECONDS)

        def worker() -> None:
            try:
                run_loop(pump())
                end: tuple[str, Any] = ("done", None)
            except BaseException as exc:  # handed to the consumer thread
                end = ("error", exc)
            while offer(end) is None:
                pass

        thread = threading.Thread(target=contextvars.copy_context().run, args=(worker,), name="tenxgraph-stream")
        thread.start()
        try:
            while True:
                consumer[0] = threading.current_thread()
                try:
                    kind, value = out.get(timeout=0.5)
                except queue.Empty:
                    if thread.is_alive():
                        continue
                    try:  # the worker's last put may have landed after the timeout
                        kind, value = out.get_nowait()
                    except queue.Empty:
                        # It gave up: the thread that read this stream had ended.
                        raise RuntimeError("this stream was cut when the thread reading it ended; to read a "
                                           "stream from another thread, take it over before the first one "
                                           "ends") from None
                if kind == "chunk":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            stop.set()
            # A consumer that leaves early cancels the run where it is (a tool still running),
            # as leaving ``astream`` does; the pump alone would only notice at the next chunk,
            # and the join below waited for the tool to finish (red-team, session 23).
            for loop, task in running:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the private loop has ended: so has the run
                    pass
            while thread.is_alive():
                try:
                    out.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.05)
