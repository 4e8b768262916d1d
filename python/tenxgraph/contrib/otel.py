"""OpenTelemetry instruments over :func:`tenxgraph.metrics.snapshot`, on the application's meter.

    from opentelemetry import metrics as otel_metrics
    from tenxgraph.contrib.otel import instrument

    instrument(otel_metrics.get_meter("tenxgraph"))

Every snapshot entry becomes an observable counter of the same name (``tenxgraph.tool.calls``;
durations as ``tenxgraph.tool.duration_seconds_sum`` in seconds and ``..._count``), read by the
application's metric readers and exporters on their own schedule. Entries the core adds later
appear without a change here. Needs ``pip install "10xgraph[otel]"`` (the API; the application
brings the SDK and exporter it uses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

try:
    from opentelemetry.metrics import CallbackOptions, Meter, ObservableCounter, Observation, get_meter
except ImportError as exc:  # pragma: no cover - exercised by the import error test
    raise ImportError('tenxgraph.contrib.otel needs opentelemetry-api: pip install "10xgraph[otel]"') from exc

from tenxgraph import metrics

__all__ = ["instrument"]


def _reader(name: str, snapshot: Callable[[], dict[str, float]]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        value = snapshot().get(name)
        return [] if value is None else [Observation(value)]

    return observe


def instrument(
    meter: Meter | None = None, snapshot: Callable[[], dict[str, float]] = metrics.snapshot
) -> list[ObservableCounter]:
    """Creates one observable counter per metric on ``meter`` (default: the global meter
    provider's ``"tenxgraph"`` meter) and returns them. Call once per meter."""
    meter = meter or get_meter("tenxgraph")
    instruments = []
    for name in sorted(snapshot()):
        seconds = name.endswith("_seconds_sum")
        # A duration's two halves share the help text of the duration.
        base = name.rsplit("_", 1)[0] if name.endswith(("_seconds_sum", "_seconds_count")) else name
        instruments.append(
            meter.create_observable_counter(
                name,
                callbacks=[_reader(name, snapshot)],
                unit="s" if seconds else "1",
                description=metrics.describe(base),
            )
        )
    return instruments
