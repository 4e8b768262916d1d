"""tenxgraph.utils.metrics, 10xGraph's in-process metrics facade: counters, ms timers, snapshot,
the on/off switch, the OpenTelemetry bridge (a real SDK meter and reader), and the
BackgroundTaskManager counters that feed it, compared with 10xGraph 0.10."""

from __future__ import annotations

import asyncio

import pytest

from tenxgraph.utils import metrics

# Exercises the facade and the task manager's counters the same way on both runtimes.
SCRIPT = """
import asyncio
from tenxgraph.utils import metrics
from tenxgraph.utils.background_task_manager import BackgroundTaskManager

c = metrics.counter("t.requests")
c.inc(); c.inc(4)
same = metrics.counter("t.requests") is c
with metrics.timer("t.block"):
    pass
try:
    with metrics.timer("t.block"):
        raise KeyError("x")
except KeyError:
    pass
metrics.enable_metrics(False)
c.inc(100)
metrics.enable_metrics(True)

async def ok():
    return 1

async def boom():
    raise RuntimeError("fails")

async def forever():
    await asyncio.Event().wait()

async def main():
    m = BackgroundTaskManager(max_pending_tasks=3)
    gate = asyncio.Event()

    async def waits():
        await gate.wait()

    for coro in (ok(), boom(), waits()):
        m.create_task(coro)
    dropped = m.create_task(forever())  # a fourth in flight: dropped
    gate.set()
    await m.wait_for_all(return_exceptions=True)
    slow = m.create_task(forever(), timeout=0.05)
    try:
        await slow
    except asyncio.CancelledError:
        pass
    m.create_task(forever())
    await m.shutdown(timeout=30)
    return dropped

dropped = asyncio.run(main())
snap = metrics.snapshot()
timer = snap["timers"]["t.block"]
emit({"counters": snap["counters"], "timer_count": timer["count"], "timer_keys": sorted(timer),
      "same": same, "dropped": dropped, "top": sorted(snap)})
"""


def test_facade_and_task_manager_counters_match_10xgraph(oracle) -> None:  # type: ignore[no-untyped-def]
    theirs, ours = oracle.run_both(SCRIPT)
    assert ours == theirs, (theirs, ours)
    assert ours["counters"]["t.requests"] == 5  # the disabled inc(100) was not counted
    assert ours["counters"]["background_task_manager.tasks_dropped"] == 1
    assert ours["counters"]["background_task_manager.tasks_failed"] == 1
    assert ours["counters"]["background_task_manager.tasks_timed_out"] == 1
    assert ours["counters"]["background_task_manager.shutdown_completed"] == 1


def test_counter_and_timer_values() -> None:
    c = metrics.counter("unit.counter")
    start = c.value
    c.inc()
    c.inc(2)
    assert metrics.counter("unit.counter").value == start + 3
    with metrics.timer("unit.timer"):
        pass
    with pytest.raises(ValueError):
        with metrics.timer("unit.timer"):
            raise ValueError("propagates")
    snap = metrics.snapshot()
    t = snap["timers"]["unit.timer"]
    assert t["count"] >= 2 and t["max_ms"] >= t["avg_ms"] >= 0.0
    assert snap["counters"]["unit.counter"] == start + 3
    assert metrics.TimerMetric("fresh").avg_ms == 0.0


def test_disabled_metrics_record_nothing() -> None:
    c = metrics.counter("unit.disabled")
    metrics.enable_metrics(False)
    try:
        c.inc(10)
        metrics.TimerMetric("unit.disabled.t").observe(5.0)
        with metrics.timer("unit.disabled.timer"):
            pass
    finally:
        metrics.enable_metrics(True)
    assert c.value == 0
    assert metrics.snapshot()["timers"]["unit.disabled.timer"]["count"] == 0


def test_otel_bridge_exports_counters_and_histograms_with_outcome() -> None:
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    assert metrics.setup_otel_metrics(meter) is True
    try:
        metrics.counter("otel.calls").inc(3, attributes={"node": "agent"})
        with metrics.timer("otel.latency", attributes={"node": "agent"}):
            pass
        with pytest.raises(RuntimeError):
            with metrics.timer("otel.latency", attributes={"node": "agent"}):
                raise RuntimeError("x")
        data = reader.get_metrics_data()
    finally:
        metrics._state["meter"] = None  # other tests must not write to this reader
        metrics._otel_instruments.clear()
    points = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    calls = list(points["otel.calls"].data.data_points)
    assert [(p.value, dict(p.attributes)) for p in calls] == [(3, {"node": "agent"})]
    latency = points["otel.latency"]
    assert latency.unit == "ms"
    outcomes = sorted((dict(p.attributes)["outcome"], p.count) for p in latency.data.data_points)
    assert outcomes == [("error", 1), ("ok", 1)]


def test_a_failing_otel_instrument_never_reaches_the_caller() -> None:
    class BrokenMeter:
        def create_counter(self, name: str) -> object:
            raise RuntimeError("exporter down")

        def create_histogram(self, name: str, unit: str = "") -> object:
            raise RuntimeError("exporter down")

    metrics.setup_otel_metrics(BrokenMeter())
    try:
        c = metrics.counter("broken.calls")
        c.inc()
        with metrics.timer("broken.latency"):
            pass
    finally:
        metrics._state["meter"] = None
        metrics._otel_instruments.clear()
    assert c.value == 1
    assert metrics.snapshot()["timers"]["broken.latency"]["count"] == 1


def test_background_task_manager_records_its_counters() -> None:
    from tenxgraph.utils.background_task_manager import BackgroundTaskManager

    before = metrics.snapshot()["counters"]

    async def ok() -> int:
        return 1

    async def main() -> None:
        m = BackgroundTaskManager()
        t = m.create_task(ok())
        assert t is not None
        await t
        await asyncio.sleep(0)  # let the done callback run
        await m.shutdown(timeout=30)

    asyncio.run(main())
    after = metrics.snapshot()["counters"]

    def grew(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    assert grew("background_task_manager.tasks_created") == 1
    assert grew("background_task_manager.tasks_completed") == 1
    assert grew("background_task_manager.shutdown_completed") == 1
