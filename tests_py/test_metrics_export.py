"""Every metric, read three ways (``tenxgraph.metrics.snapshot()``, a real ``prometheus_client``
registry, a real OpenTelemetry in-memory reader) after runs that time out, replay a tool from
the ledger and lose a write conflict."""

from __future__ import annotations

import asyncio
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from tenxgraph import END, START, AgentState, Message, StateGraph, metrics
from tenxgraph.contrib.otel import instrument
from tenxgraph.contrib.prometheus import TenxgraphCollector, prometheus_name, register
from tenxgraph.core.exceptions import NodeError, NodeTimeoutError, StaleStateError
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tests_py.tool_graphs import call, tool_graph, tool_texts


def user(text: str) -> Message:
    return Message.text_message(text)


def otel_values(reader: InMemoryMetricReader) -> dict[str, float]:
    out: dict[str, float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                (point,) = m.data.data_points
                out[m.name] = point.value
    return out


def prometheus_values(registry: CollectorRegistry, names: list[str]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    durations = set(metrics.duration_names(dict.fromkeys(names, 0.0)))
    for name in names:
        base = name.rsplit("_", 1)[0]
        if base in durations:  # a summary: <prom name>_sum / _count
            out[name] = registry.get_sample_value(f"{prometheus_name(base)}_{name.rsplit('_', 1)[1]}")
        else:
            out[name] = registry.get_sample_value(f"{prometheus_name(name)}_total")
    return out


async def _tool_timeout(cp: SqliteCheckpointer, thread: str) -> None:
    async def hang() -> str:
        await asyncio.sleep(30)
        return "never"

    app = tool_graph(AgentState, [hang], [[call("c1", "hang", {})]], checkpointer=cp)
    r = await app.ainvoke({"messages": [user("go")]}, {"thread_id": thread, "tool_timeout": 0.2})
    assert "NODE_TIMEOUT_002" in tool_texts(r["messages"])["c1"]


async def _node_timeout(cp: SqliteCheckpointer, thread: str) -> None:
    async def slow(state: AgentState) -> Message:
        await asyncio.sleep(30)
        return Message.text_message("never", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("slow", slow)
    g.add_edge(START, "slow")
    g.add_edge("slow", END)
    with pytest.raises(NodeTimeoutError):
        await g.compile(checkpointer=cp).ainvoke({"messages": [user("go")]}, {"thread_id": thread, "node_timeout": 0.2})


async def _ledger_replay(cp: SqliteCheckpointer, thread: str) -> None:
    runs = {"n": 0}

    async def charge(amount: int) -> str:
        runs["n"] += 1
        return f"charged {amount}"

    app = tool_graph(AgentState, [charge], [[call("call_1", "charge", {"amount": 5})]], checkpointer=cp)
    cfg = {"thread_id": thread}
    await app.ainvoke({"messages": [user("pay")]}, cfg)
    # Back to the tools node with the same assistant message last: what a crash mid-node leaves.
    state = await cp.aget_state(cfg)
    ask = next(m for m in state.context if m.tools_calls)
    state.context = state.context[: state.context.index(ask) + 1]
    await cp.aput_state(cfg, state)
    await app.ainvoke({"state": {"current_node": "tools"}}, cfg)
    assert runs["n"] == 1


async def _failures(cp: SqliteCheckpointer, thread: str) -> None:
    async def broken() -> str:
        raise RuntimeError("card declined")

    app = tool_graph(AgentState, [broken], [[call("c1", "broken", {})]], checkpointer=cp)
    r = await app.ainvoke({"messages": [user("go")]}, {"thread_id": thread})
    assert "card declined" in tool_texts(r["messages"])["c1"]

    async def crash(state: AgentState) -> Message:
        raise ValueError("bug")

    g = StateGraph(AgentState)
    g.add_node("crash", crash)
    g.add_edge(START, "crash")
    g.add_edge("crash", END)
    with pytest.raises(NodeError):
        await g.compile(checkpointer=cp).ainvoke({"messages": [user("go")]}, {"thread_id": f"{thread}-node"})


async def _conflict(cp: SqliteCheckpointer, thread: str) -> None:
    async def meddle(state: AgentState) -> Message:
        # Another writer commits the thread while this node runs: the run's commit must lose.
        await cp.aput_state({"thread_id": thread}, state)
        return Message.text_message("mine", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("meddle", meddle)
    g.add_edge(START, "meddle")
    g.add_edge("meddle", END)
    with pytest.raises(StaleStateError):
        await g.compile(checkpointer=cp).ainvoke({"messages": [user("go")]}, {"thread_id": thread})


@pytest.mark.asyncio
async def test_every_metric_reads_the_same_through_snapshot_prometheus_and_otel(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    register(registry)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrument(provider.get_meter("tenxgraph-test"))

    cp = SqliteCheckpointer(tmp_path / "m.db")
    before = metrics.snapshot()
    await _tool_timeout(cp, "tool-timeout")
    await _node_timeout(cp, "node-timeout")
    await _ledger_replay(cp, "replay")
    await _conflict(cp, "conflict")
    await _failures(cp, "failures")

    # Counters are process-wide: a straggler from an earlier test could tick between reads, so
    # the three reads are taken between two equal snapshots.
    for _ in range(20):
        snap = metrics.snapshot()
        prom = prometheus_values(registry, list(snap))
        otel = otel_values(reader)
        if metrics.snapshot() == snap:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the counters never held still")

    assert set(otel) == set(snap), "OTel must export exactly the snapshot's metrics"
    for name, value in snap.items():
        assert prom[name] == pytest.approx(value), name
        assert otel[name] == pytest.approx(value), name

    grew = {name for name in snap if snap[name] > before.get(name, 0.0)}
    expected = {
        "tenxgraph.node.executions", "tenxgraph.node.errors", "tenxgraph.node.timeouts",
        "tenxgraph.node.duration_seconds_sum", "tenxgraph.node.duration_seconds_count",
        "tenxgraph.tool.calls", "tenxgraph.tool.timeouts", "tenxgraph.tool.replayed", "tenxgraph.tool.errors",
        "tenxgraph.tool.duration_seconds_sum", "tenxgraph.tool.duration_seconds_count",
        "tenxgraph.ledger.hits", "tenxgraph.ledger.misses",
        "tenxgraph.storage.stale_conflicts", "tenxgraph.storage.steps_committed",
    }
    assert expected <= grew, sorted(expected - grew)
    assert snap["tenxgraph.ledger.hits"] - before["tenxgraph.ledger.hits"] >= 1
    assert snap["tenxgraph.storage.stale_conflicts"] - before["tenxgraph.storage.stale_conflicts"] >= 1
    # Every metric named in the issue is exported, whatever its value now.
    for name in ("tenxgraph.storage.redis_fallbacks", "tenxgraph.tool.record_failures",
                 "tenxgraph.ledger.read_failures", "tenxgraph.node.stopped", "tenxgraph.storage.nul_replaced"):
        assert name in snap and name in otel and prom[name] is not None
    # The exposition is well formed and typed.
    text = generate_latest(registry).decode()
    assert "# TYPE tenxgraph_tool_duration_seconds summary" in text
    assert "# TYPE tenxgraph_tool_timeouts_total counter" in text


def test_new_counters_export_without_code_changes() -> None:
    """The lead's lease counters (or any later ones) reach both exporters through the snapshot."""
    fake = {
        "tenxgraph.lease.acquired": 3.0,
        "tenxgraph.lease.lost": 1.0,
        "tenxgraph.lease.hold_seconds_sum": 2.5,
        "tenxgraph.lease.hold_seconds_count": 2.0,
    }
    registry = CollectorRegistry()
    registry.register(TenxgraphCollector(snapshot=lambda: dict(fake)))
    assert registry.get_sample_value("tenxgraph_lease_acquired_total") == 3.0
    assert registry.get_sample_value("tenxgraph_lease_hold_seconds_sum") == 2.5
    assert registry.get_sample_value("tenxgraph_lease_hold_seconds_count") == 2.0

    reader = InMemoryMetricReader()
    instrument(MeterProvider(metric_readers=[reader]).get_meter("t"), snapshot=lambda: dict(fake))
    values = otel_values(reader)
    assert values == fake
    units = {m.name: m.unit for rm in reader.get_metrics_data().resource_metrics
             for sm in rm.scope_metrics for m in sm.metrics}
    assert units["tenxgraph.lease.hold_seconds_sum"] == "s" and units["tenxgraph.lease.acquired"] == "1"


def test_collector_registered_twice_on_one_registry_is_refused() -> None:
    registry = CollectorRegistry()
    register(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        register(registry)


def test_durations_are_sum_count_pairs() -> None:
    snap = metrics.snapshot()
    for base in ("tenxgraph.node.duration_seconds", "tenxgraph.tool.duration_seconds"):
        assert f"{base}_sum" in snap and f"{base}_count" in snap
    assert metrics.duration_names(snap) == ["tenxgraph.node.duration_seconds", "tenxgraph.tool.duration_seconds"]


def test_core_has_no_hard_dependency_on_the_exporters() -> None:
    requires = importlib.metadata.requires("10xgraph") or []
    for package in ("prometheus", "opentelemetry"):
        for req in requires:
            if req.lower().startswith(package):
                assert "extra ==" in req, f"{req} must only come with an extra"
    def marked(req: str, extra: str) -> bool:
        return req.replace('"', "'").replace(" ", "").endswith(f"extra=='{extra}'")

    assert any(r.startswith("prometheus") and marked(r, "prometheus") for r in requires), requires
    assert any(r.startswith("opentelemetry") and marked(r, "otel") for r in requires), requires
    # With neither package importable, the runtime and snapshot() work and the contrib modules
    # say which extra to install.
    code = """
import sys
sys.modules["prometheus_client"] = None
sys.modules["opentelemetry"] = None
import tenxgraph, tenxgraph.metrics
assert "tenxgraph.tool.calls" in tenxgraph.metrics.snapshot()
for mod, extra in (("tenxgraph.contrib.prometheus", "prometheus"), ("tenxgraph.contrib.otel", "otel")):
    try:
        __import__(mod)
    except ImportError as e:
        assert f"10xgraph[{extra}]" in str(e), e
    else:
        raise SystemExit(f"{mod} imported without its dependency")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
