"""OtelPublisher: a span per run, node and tool call; a resumed run's trace says which tool calls
the ledger answered (the replay skipped them)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from tenxgraph import END, START, AgentState, Message, StateGraph  # noqa: E402
from tenxgraph.core.graph.tool_node import ToolNode  # noqa: E402
from tenxgraph.runtime.publisher.otel_publisher import OtelPublisher, setup_tracing  # noqa: E402
from tenxgraph.runtime.publisher.publish import outbox_for  # noqa: E402
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer  # noqa: E402
from tests_py.kit_agents.support import DONE, charge_card, lookup_order, model, route, send_receipt  # noqa: E402
from tests_py.publisher_graphs import Recorder, tool_graph  # noqa: E402

TARGET = "tests_py.kit_agents.support:build"


def _tracer() -> tuple[InMemorySpanExporter, object]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider.get_tracer("test")


def _by_name(exporter: InMemorySpanExporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.mark.asyncio
async def test_spans_per_run_node_and_tool_with_ids(checkpointer, make_thread) -> None:
    exporter, tracer = _tracer()
    pub = OtelPublisher(tracer=tracer)
    app = tool_graph(pub, checkpointer=checkpointer)
    tid = make_thread()
    await app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": tid, "run_id": "run-1"})
    await outbox_for(pub).flush(30)
    (run,) = _by_name(exporter, "tenxgraph.graph")
    nodes = _by_name(exporter, "tenxgraph.node")
    (tool,) = _by_name(exporter, "tenxgraph.tool")
    assert [n.attributes["tenxgraph.node.name"] for n in nodes] == ["__start__", "model", "tools", "model"]
    for span in (run, *nodes, tool):
        assert span.attributes["tenxgraph.graph.thread_id"] == tid
        assert span.attributes["tenxgraph.graph.run_id"] == "run-1"
        assert span.context.trace_id == run.context.trace_id
    assert all(n.parent.span_id == run.context.span_id for n in nodes)
    tools_node = nodes[2]
    assert tool.parent.span_id == tools_node.context.span_id
    assert tool.attributes["tenxgraph.tool.name"] == "add"
    assert tool.attributes["tenxgraph.tool.call_id"] == "c1"
    assert tool.attributes["tenxgraph.tool.from_ledger"] is False
    assert run.status.status_code != StatusCode.ERROR


@pytest.mark.asyncio
async def test_failures_end_spans_with_error_status() -> None:
    exporter, tracer = _tracer()
    pub = OtelPublisher(tracer=tracer)

    def boom(state: AgentState) -> None:
        raise RuntimeError("no model today")

    g = StateGraph(AgentState, publisher=pub)
    g.add_node("m", boom)
    g.set_entry_point("m")
    g.add_edge("m", END)
    with pytest.raises(Exception, match="no model today"):
        await g.compile().ainvoke({"messages": [Message.text_message("x")]}, {"thread_id": "e"})
    await outbox_for(pub).flush(30)
    (run,) = _by_name(exporter, "tenxgraph.graph")
    node = [n for n in _by_name(exporter, "tenxgraph.node") if n.attributes["tenxgraph.node.name"] == "m"][0]
    assert node.status.status_code == StatusCode.ERROR and "no model today" in node.status.description
    assert run.status.status_code == StatusCode.ERROR and "NODE_001" in run.status.description


def test_setup_tracing_keeps_the_graph_publisher() -> None:
    exporter, tracer = _tracer()
    rec = Recorder()
    g = StateGraph(AgentState, publisher=rec)
    g.add_node("n", lambda state: [Message.text_message("ok", role="assistant")])
    g.set_entry_point("n")
    g.add_edge("n", END)
    otel = setup_tracing(g, tracer=tracer)
    assert isinstance(otel, OtelPublisher)
    g.compile().invoke({"messages": [Message.text_message("x")]}, {"thread_id": "s"})
    assert len(_by_name(exporter, "tenxgraph.graph")) == 1 and rec.events[-1].event_type == "end"


def _support_graph(checkpointer, publisher):
    # The kit's support agent (tests_py/kit_agents/support.py), with a publisher.
    graph = StateGraph(AgentState, publisher=publisher)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup_order, charge_card, send_receipt]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return sqlite_db if request.param == "sqlite" else request.getfixturevalue("pg_dsn")


@pytest.mark.asyncio
async def test_the_resumed_run_trace_shows_calls_answered_from_the_ledger(crash_kit, db: str) -> None:
    # SIGKILL in a child right after charge_card's result reached the ledger, mid tool node.
    crashed = crash_kit.run_until_crash(TARGET, "order-1", failpoints="after_record:charge_card=kill",
                                        input="charge order 4821", db=db)
    assert crashed.killed, crashed
    exporter, tracer = _tracer()
    pub = OtelPublisher(tracer=tracer)
    cp = PgCheckpointer(db) if db.startswith("postgres") else SqliteCheckpointer(db)
    app = _support_graph(cp, pub)
    out = await app.ainvoke({}, {"thread_id": "order-1"})
    await outbox_for(pub).flush(30)
    assert out["messages"][-1].text() == DONE
    crash_kit.effects.assert_exactly_once("charge_card")
    tools = {s.attributes["tenxgraph.tool.name"]: s for s in _by_name(exporter, "tenxgraph.tool")}
    assert set(tools) == {"lookup_order", "charge_card", "send_receipt"}
    assert tools["charge_card"].attributes["tenxgraph.tool.from_ledger"] is True
    # A call that ran in this process says so: the trace tells the two apart.
    # The resume ran in this process: a tool that ran again recorded its effect with our pid.
    ran_here = {e.name for e in crash_kit.effects.all() if e.pid == os.getpid()}
    assert "charge_card" not in ran_here
    for name, span in tools.items():
        assert span.attributes["tenxgraph.tool.from_ledger"] is (name not in ran_here), (name, ran_here)
    (run,) = _by_name(exporter, "tenxgraph.graph")
    assert run.attributes["tenxgraph.graph.thread_id"] == "order-1"
    await app.aclose()


def test_without_opentelemetry_the_module_imports_and_the_publisher_says_what_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry': raise ImportError('not installed')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from tenxgraph.runtime.publisher import *\n"
        "from tenxgraph.runtime.publisher import OtelPublisher\n"
        "try:\n"
        "    OtelPublisher()\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert 'pip install "10xgraph[otel]"' in r.stdout
