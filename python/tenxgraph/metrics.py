"""Runtime counters kept in the Rust core (process-wide).

``snapshot()`` returns ``{name: value}`` for ``tenxgraph.node.*``, ``tenxgraph.tool.*``,
``tenxgraph.ledger.*`` and ``tenxgraph.storage.*``; durations are ``*_seconds_sum`` totals next
to their counts (``tenxgraph.node.executions``, ``tenxgraph.tool.calls``).
"""

from __future__ import annotations

from tenxgraph import _core

__all__ = ["snapshot"]


def snapshot() -> dict[str, float]:
    return dict(_core.metrics_snapshot())
