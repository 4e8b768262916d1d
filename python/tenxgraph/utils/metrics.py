"""10xGraph's in-process metrics facade: named counters and timers, optionally bridged to OpenTelemetry.

``counter(name).inc()`` and ``with timer(name): ...`` keep their values in this process (read them
with :func:`snapshot`); after :func:`setup_otel_metrics` every observation is also sent to an
OpenTelemetry counter / histogram (unit ``ms``) of the same name, created on first use. A failing
OTel instrument is logged at debug level and never raised into the caller. ``enable_metrics(False)``
turns every ``inc`` / ``observe`` into a no-op.

What feeds it: :class:`tenxgraph.utils.background_task_manager.BackgroundTaskManager` records
10xGraph's ``background_task_manager.*`` counters here, at the same points. The node, tool, ledger
and storage counters are counted by the Rust core instead and are read from
:func:`tenxgraph.metrics.snapshot` (``tenxgraph.node.executions``, ``tenxgraph.tool.calls`` ...:
10xGraph's names, no per-call attributes); ``pg_checkpointer.*`` are not recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

__all__ = ["Counter", "TimerMetric", "counter", "enable_metrics", "setup_otel_metrics", "snapshot", "timer"]

_log = logging.getLogger("tenxgraph.metrics")
_lock = threading.RLock()
_counters: dict[str, Counter] = {}
_timers: dict[str, TimerMetric] = {}
_state: dict[str, Any] = {"enabled": True, "meter": None}
_otel_instruments: dict[tuple[str, str], Any] = {}


def enable_metrics(value: bool) -> None:
    """Turn recording on (``True``, the default) or off process-wide; values already counted stay."""
    _state["enabled"] = bool(value)


def setup_otel_metrics(meter: Any = None) -> bool:
    """Send every later counter / timer observation to OpenTelemetry as well.

    ``meter`` defaults to the global MeterProvider's meter ``"10xgraph"`` (10xGraph's name). Returns
    True once installed, False (nothing changed, in-process values still kept) when ``meter`` is
    omitted and ``opentelemetry`` is not installed.
    """
    if meter is None:
        try:
            from opentelemetry import metrics as otel_metrics
        except ImportError:
            _log.info("opentelemetry is not installed: metrics stay in-process")
            return False
        meter = otel_metrics.get_meter("10xgraph")
    with _lock:
        _state["meter"] = meter
        _otel_instruments.clear()
    return True


def _instrument(kind: str, name: str) -> Any:
    meter = _state["meter"]
    if meter is None:
        return None
    with _lock:
        inst = _otel_instruments.get((kind, name))
        if inst is None:
            inst = meter.create_counter(name) if kind == "counter" else meter.create_histogram(name, unit="ms")
            _otel_instruments[(kind, name)] = inst
        return inst


@dataclass
class Counter:
    """A monotonically increasing count named ``name``; ``value`` is what this process counted."""
    name: str
    value: int = 0

    def inc(self, amount: int = 1, attributes: dict[str, Any] | None = None) -> None:
        """Add ``amount`` (and to the OTel counter with ``attributes``, when bridged); no-op when disabled."""
        if not _state["enabled"]:
            return
        with _lock:
            self.value += amount
        _export("counter", self.name, "add", amount, attributes)


def _export(kind: str, name: str, method: str, value: float, attributes: dict[str, Any] | None) -> None:
    """Mirrors one observation to the OTel instrument of ``name``, when the bridge is installed."""
    try:
        inst = _instrument(kind, name)
        if inst is not None:
            getattr(inst, method)(value, attributes or {})
    except Exception as exc:  # telemetry must never fail the code it measures
        _log.debug("OTel %s %s failed: %s", kind, name, exc)


@dataclass
class TimerMetric:
    """Durations in milliseconds observed under ``name``: how many, their total and the largest."""
    name: str
    count: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0

    def observe(self, duration_ms: float, attributes: dict[str, Any] | None = None) -> None:
        """Record one duration (and to the OTel histogram with ``attributes``); no-op when disabled."""
        if not _state["enabled"]:
            return
        with _lock:
            self.count += 1
            self.total_ms += duration_ms
            self.max_ms = max(self.max_ms, duration_ms)
        _export("histogram", self.name, "record", duration_ms, attributes)

    @property
    def avg_ms(self) -> float:
        """Mean observed duration, 0.0 before the first observation."""
        return self.total_ms / self.count if self.count else 0.0


def counter(name: str) -> Counter:
    """The process-wide counter ``name``, created at 0 on first use (the same object every call)."""
    with _lock:
        c = _counters.get(name)
        if c is None:
            c = _counters[name] = Counter(name)
        return c


class _Timing:
    def __init__(self, metric: TimerMetric, attributes: dict[str, Any] | None) -> None:
        self.metric = metric
        self.attributes = attributes
        self._start: float | None = None

    def __enter__(self) -> _Timing:
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if self._start is not None:
            attrs = dict(self.attributes or {})
            # Split latency by outcome, as 10xGraph does: a p99 mixing failures with successes misleads.
            attrs["outcome"] = "error" if exc_type is not None else "ok"
            self.metric.observe((time.perf_counter() - self._start) * 1000.0, attrs)
        return False


def timer(name: str, attributes: dict[str, Any] | None = None) -> _Timing:
    """A context manager that records the block's wall time in ms on timer ``name`` (also when it
    raises; the exception propagates). OTel observations carry ``attributes`` plus ``outcome``."""
    with _lock:
        metric = _timers.get(name)
        if metric is None:
            metric = _timers[name] = TimerMetric(name)
    return _Timing(metric, attributes)


def snapshot() -> dict[str, Any]:
    """A copy of every value now: ``{"counters": {name: value}, "timers": {name: {"count", "avg_ms", "max_ms"}}}``."""
    with _lock:
        return {
            "counters": {k: c.value for k, c in _counters.items()},
            "timers": {k: {"count": t.count, "avg_ms": t.avg_ms, "max_ms": t.max_ms} for k, t in _timers.items()},
        }
