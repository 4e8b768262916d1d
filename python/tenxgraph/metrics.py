"""Runtime counters kept in the Rust core (process-wide, since the process started).

``snapshot()`` returns ``{name: value}`` for every counter: ``tenxgraph.node.*``,
``tenxgraph.tool.*``, ``tenxgraph.ledger.*``, ``tenxgraph.storage.*`` (and any group the core
adds later). Durations are pairs: ``<name>_seconds_sum`` (total seconds) and
``<name>_seconds_count`` (observations), e.g. ``tenxgraph.tool.duration_seconds_sum`` /
``tenxgraph.tool.duration_seconds_count``. ``tenxgraph.ledger.hits`` counts calls answered from
the ledger (the same events as ``tenxgraph.tool.replayed``).

Exporters built on it: :mod:`tenxgraph.contrib.prometheus` (a ``prometheus_client`` collector)
and :mod:`tenxgraph.contrib.otel` (observable instruments on an OpenTelemetry meter).
"""

from __future__ import annotations

from tenxgraph import _core

__all__ = ["DESCRIPTIONS", "describe", "duration_names", "snapshot"]

# What each metric counts; exporters use it as help text. A name missing here still exports.
DESCRIPTIONS: dict[str, str] = {
    "tenxgraph.node.executions": "Node executions started",
    "tenxgraph.node.errors": "Node executions that raised",
    "tenxgraph.node.timeouts": "Nodes cancelled by node_timeout",
    "tenxgraph.node.stopped": "Nodes cancelled by a stop request",
    "tenxgraph.node.duration_seconds": "Time spent in nodes that finished (returned or raised)",
    "tenxgraph.tool.calls": "Tool calls run (not answered from the ledger)",
    "tenxgraph.tool.errors": "Tool calls that failed or returned an error result",
    "tenxgraph.tool.timeouts": "Tool calls cancelled by tool_timeout",
    "tenxgraph.tool.replayed": "Tool calls answered from the ledger instead of running",
    "tenxgraph.tool.record_failures": "Tool calls that completed but whose result could not be recorded",
    "tenxgraph.tool.duration_seconds": "Time spent in tool calls that finished (returned or raised; not timed out)",
    "tenxgraph.ledger.hits": "Ledger lookups that found a recorded result",
    "tenxgraph.ledger.misses": "Ledger lookups that found no record (the tool ran)",
    "tenxgraph.ledger.read_failures": "Ledger lookups that failed (the tools ran, at-least-once)",
    "tenxgraph.storage.stale_conflicts": "Step commits refused because another execution wrote first",
    "tenxgraph.storage.steps_committed": "Durable steps committed",
    "tenxgraph.storage.redis_fallbacks": "Times Redis failed and Postgres served instead",
    "tenxgraph.storage.nul_replaced": "Writes whose NUL characters were stored as U+FFFD (Postgres)",
}


def snapshot() -> dict[str, float]:
    """Every counter's current value, read from the Rust core (a few dozen atomic loads)."""
    return dict(_core.metrics_snapshot())


def duration_names(snap: dict[str, float]) -> list[str]:
    """The durations in ``snap``: each ``<name>`` that has both ``<name>_sum`` and ``<name>_count``."""
    return sorted(
        name[: -len("_sum")]
        for name in snap
        if name.endswith("_seconds_sum") and name[: -len("_sum")] + "_count" in snap
    )


def describe(name: str) -> str:
    """The help text of a metric (a duration by its base name)."""
    return DESCRIPTIONS.get(name, f"tenxgraph metric {name}")
