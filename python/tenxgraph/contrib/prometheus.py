"""A ``prometheus_client`` collector over :func:`tenxgraph.metrics.snapshot`.

    from prometheus_client import REGISTRY, start_http_server
    from tenxgraph.contrib.prometheus import TenxgraphCollector

    REGISTRY.register(TenxgraphCollector())
    start_http_server(9464)

Each counter ``tenxgraph.tool.calls`` is exported as the counter ``tenxgraph_tool_calls`` (the
exposition adds ``_total``); each duration pair ``tenxgraph.tool.duration_seconds_sum`` /
``_count`` as the summary ``tenxgraph_tool_duration_seconds``. Whatever the core adds to the
snapshot is exported without a change here. Needs ``pip install "10xgraph[prometheus]"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

try:
    from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily
    from prometheus_client.registry import REGISTRY, CollectorRegistry
except ImportError as exc:  # pragma: no cover - exercised by the import error test
    raise ImportError(
        'tenxgraph.contrib.prometheus needs prometheus_client: pip install "10xgraph[prometheus]"'
    ) from exc

from tenxgraph import metrics

__all__ = ["TenxgraphCollector", "prometheus_name", "register"]


def prometheus_name(name: str) -> str:
    """``tenxgraph.tool.calls`` -> ``tenxgraph_tool_calls`` (Prometheus names have no dots)."""
    return name.replace(".", "_").replace("-", "_")


class TenxgraphCollector:
    """Reads the snapshot on every scrape; registering it costs nothing between scrapes."""

    def __init__(self, snapshot: Callable[[], dict[str, float]] = metrics.snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """One family per metric of the current snapshot: each duration as a Summary (count and sum
        in seconds), every other value as a Counter, names with dots made underscores."""
        snap = self._snapshot()
        durations = metrics.duration_names(snap)
        in_pairs = {f"{d}_sum" for d in durations} | {f"{d}_count" for d in durations}
        for name in durations:
            yield SummaryMetricFamily(
                prometheus_name(name),
                metrics.describe(name),
                count_value=int(snap[f"{name}_count"]),
                sum_value=snap[f"{name}_sum"],
            )
        for name, value in sorted(snap.items()):
            if name not in in_pairs:
                yield CounterMetricFamily(prometheus_name(name), metrics.describe(name), value=value)

    def describe(self) -> Iterator[Metric]:
        """The same families as ``collect``, so the registry checks names at ``register()`` time
        (a second collector on one registry is refused)."""
        # The same families with their current values; lets the registry check names at
        # register() time (a second TenxgraphCollector on one registry is refused).
        return self.collect()


def register(registry: CollectorRegistry = REGISTRY) -> TenxgraphCollector:
    """Registers a collector on ``registry`` (the default registry unless given) and returns it."""
    collector = TenxgraphCollector()
    registry.register(collector)
    return collector
