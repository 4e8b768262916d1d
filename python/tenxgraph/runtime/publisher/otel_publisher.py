"""OpenTelemetry traces of runs: one span per run, per node and per tool call.

    from tenxgraph.runtime.publisher.otel_publisher import setup_tracing

    setup_tracing(graph)              # before graph.compile(); the global TracerProvider
    app = graph.compile(checkpointer=...)

Spans (10xGraph's names): ``tenxgraph.graph`` (the run), ``tenxgraph.node`` (child of the run),
``tenxgraph.tool`` (child of its tool node). Every span has ``tenxgraph.graph.thread_id``,
``tenxgraph.graph.run_id`` (and ``tenxgraph.graph.user_id``); node spans ``tenxgraph.node.name``
and ``tenxgraph.node.step``; tool spans ``tenxgraph.tool.name``, ``tenxgraph.tool.call_id`` and
``tenxgraph.tool.from_ledger``: True when the call was answered from the ledger and the tool did
not run, so the trace of a resumed run shows what the replay skipped. Failed nodes, tools and
runs end with an ERROR status; an interrupted run's span has ``tenxgraph.graph.interrupted``.

Needs ``pip install "10xgraph[otel]"`` (the API; the application brings the SDK and exporter).
Spans are made from the run's events, so they follow the publisher's delivery rules: a span the
outbox had to drop is missing, never a step.
"""

from __future__ import annotations

import logging
import threading
from enum import StrEnum
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import StatusCode
except ImportError:  # the module still imports (star imports, listings); constructing needs the extra
    trace = None  # type: ignore[assignment]
    StatusCode = None  # type: ignore[assignment,misc]

from tenxgraph.runtime.publisher import otel_attributes as A
from tenxgraph.runtime.publisher.base_publisher import BasePublisher
from tenxgraph.runtime.publisher.events import Event, EventModel, EventType

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from tenxgraph.core.graph.state_graph import StateGraph

__all__ = ["ObservabilityLevel", "OtelPublisher", "setup_tracing"]

_log = logging.getLogger("tenxgraph.publisher")



class ObservabilityLevel(StrEnum):
    """How much a span carries. ``SPANS``: structure and ids; ``STANDARD`` (default): also the
    error texts; ``FULL``: also tool arguments and results (may contain personal data)."""

    SPANS = "spans"
    STANDARD = "standard"
    FULL = "full"


def _ns(ts: float) -> int:
    return int(ts * 1_000_000_000)


class OtelPublisher(BasePublisher):
    """Turns a run's events into spans on ``tracer`` (default: the global provider's
    ``"10xgraph"`` tracer)."""

    def __init__(self, tracer: Tracer | None = None, level: ObservabilityLevel = ObservabilityLevel.STANDARD) -> None:
        if trace is None:
            raise ImportError('OtelPublisher needs opentelemetry-api: pip install "10xgraph[otel]"')
        super().__init__({})
        self._tracer_arg = tracer
        self._tracer: Tracer | None = None
        self.level = ObservabilityLevel(level)
        self._lock = threading.Lock()
        # run_id -> the run's span; (run_id, key) -> an open node or tool span.
        self._runs: dict[str, Span] = {}
        self._children: dict[tuple[str, str], Span] = {}

    def _get_tracer(self) -> Tracer:
        if self._tracer is None:
            self._tracer = self._tracer_arg or trace.get_tracer("10xgraph")
        return self._tracer

    async def publish(self, event: EventModel) -> None:
        if self._is_closed:
            return
        try:
            self._dispatch(event)
        except Exception:  # noqa: BLE001 - a tracing bug must not cost the run anything
            _log.exception("OtelPublisher failed to process event %s/%s", event.event, event.event_type)

    def _dispatch(self, e: EventModel) -> None:
        with self._lock:
            if e.event == Event.GRAPH_EXECUTION:
                if e.event_type == EventType.START:
                    self._start_run(e)
                elif e.event_type == EventType.INTERRUPTED:
                    span = self._runs.get(e.run_id)
                    if span is not None:
                        span.set_attribute(A.GRAPH_INTERRUPTED, str(e.metadata.get("interrupt_reason") or ""))
                elif e.event_type in (EventType.END, EventType.ERROR):
                    self._end_run(e)
            elif e.event == Event.NODE_EXECUTION:
                if e.event_type == EventType.START:
                    self._start_child(e, f"node:{e.node_name}", "tenxgraph.node", self._runs.get(e.run_id),
                                      {A.NODE_NAME: e.node_name, A.NODE_STEP: int(e.data.get("step") or 0)})
                elif e.event_type in (EventType.END, EventType.ERROR):
                    self._end_child(e, f"node:{e.node_name}")
            elif e.event == Event.TOOL_EXECUTION:
                key = f"tool:{e.metadata.get('tool_node')}:{e.metadata.get('call_index')}"
                if e.event_type == EventType.START:
                    parent = self._children.get((e.run_id, f"node:{e.metadata.get('tool_node')}"))
                    attrs: dict[str, Any] = {
                        A.TOOL_NAME: e.node_name, A.TOOL_CALL_ID: str(e.data.get("tool_call_id") or ""),
                        A.TOOL_FROM_LEDGER: bool(e.metadata.get("from_ledger")), A.TOOL_TYPE: "local",
                        A.NODE_NAME: str(e.metadata.get("tool_node") or ""),
                    }
                    if self.level == ObservabilityLevel.FULL:
                        attrs[A.TOOL_ARGUMENTS] = str(e.data.get("args"))
                    self._start_child(e, key, "tenxgraph.tool", parent or self._runs.get(e.run_id), attrs)
                elif e.event_type in (EventType.END, EventType.ERROR):
                    span = self._children.get((e.run_id, key))
                    if span is not None and self.level == ObservabilityLevel.FULL and "message" in e.data:
                        span.set_attribute(A.TOOL_RESULT, str(e.data["message"].get("content")))
                    self._end_child(e, key)

    def _common(self, span: Span, e: EventModel) -> None:
        span.set_attribute(A.GRAPH_THREAD_ID, str(e.thread_id))
        span.set_attribute(A.GRAPH_RUN_ID, str(e.run_id))
        if e.user_id is not None:
            span.set_attribute(A.GRAPH_USER_ID, str(e.user_id))

    def _start_run(self, e: EventModel) -> None:
        span = self._get_tracer().start_span("tenxgraph.graph", start_time=_ns(e.timestamp))
        self._common(span, e)
        span.set_attribute(A.GEN_AI_SYSTEM, "10xgraph")
        span.set_attribute(A.GEN_AI_OPERATION, "graph")
        span.set_attribute(A.SESSION_ID, str(e.thread_id))
        self._runs[e.run_id] = span

    def _end_run(self, e: EventModel) -> None:
        # Spans a crash or a cancellation left open end with the run.
        for key in [k for k in self._children if k[0] == e.run_id]:
            self._children.pop(key).end(end_time=_ns(e.timestamp))
        span = self._runs.pop(e.run_id, None)
        if span is None:
            return
        if e.event_type == EventType.ERROR:
            span.set_status(StatusCode.ERROR, self._error_text(e))
        span.end(end_time=_ns(e.timestamp))

    def _start_child(self, e: EventModel, key: str, name: str, parent: Span | None, attrs: dict[str, Any]) -> None:
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        span = self._get_tracer().start_span(name, context=ctx, start_time=_ns(e.timestamp))
        self._common(span, e)
        for k, v in attrs.items():
            span.set_attribute(k, v)
        old = self._children.pop((e.run_id, key), None)
        if old is not None:  # a node re-run (an interrupt resumed in the same run): close the first
            old.end(end_time=_ns(e.timestamp))
        self._children[(e.run_id, key)] = span

    def _end_child(self, e: EventModel, key: str) -> None:
        span = self._children.pop((e.run_id, key), None)
        if span is None:
            return
        if e.event_type == EventType.ERROR or e.is_error:
            span.set_status(StatusCode.ERROR, self._error_text(e))
        span.end(end_time=_ns(e.timestamp))

    def _error_text(self, e: EventModel) -> str:
        if self.level == ObservabilityLevel.SPANS:
            return "error"
        return str(e.data.get("error") or "error")

    async def close(self) -> None:
        self.sync_close()

    def sync_close(self) -> None:
        with self._lock:
            if self._is_closed:
                return
            self._is_closed = True
            for span in self._children.values():
                span.end()
            for span in self._runs.values():
                span.end()
            self._children.clear()
            self._runs.clear()


def setup_tracing(graph: StateGraph[Any], tracer: Tracer | None = None,
                  level: ObservabilityLevel = ObservabilityLevel.STANDARD) -> OtelPublisher:
    """Adds an :class:`OtelPublisher` to ``graph`` (call before ``compile()``) and returns it.
    A publisher the graph already has keeps its events (both get them; 10xGraph replaced it)."""
    from tenxgraph.runtime.publisher.composite_publisher import CompositePublisher

    publisher = OtelPublisher(tracer=tracer, level=level)
    existing = getattr(graph, "publisher", None)
    graph.publisher = publisher if existing is None else CompositePublisher([existing, publisher])
    return publisher
