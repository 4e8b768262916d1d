"""LangSmith and Logfire as span destinations (LangsmithPublisher, LogfirePublisher, setup_*).

LangSmith itself cannot be reached from here, so its OTLP/HTTP endpoint is a local receiver that
decodes what the real exporter sends (path, headers, protobuf spans). Logfire runs for real with
``send_to_logfire=False``. Each case runs in a child process: the OpenTelemetry global provider
can be set only once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GUARD = 120.0


class Receiver:
    """An OTLP/HTTP trace endpoint on 127.0.0.1 that keeps every request it gets."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.got = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                spans = [
                    {"name": s.name, "attrs": {a.key: _value(a.value) for a in s.attributes}}
                    for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans
                ]
                receiver.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                          "spans": spans})
                receiver.got.set()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/otel"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[dict]:
        return [s for r in self.requests for s in r["spans"]]


def _value(v) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.server.shutdown()


PRELUDE = r"""
import asyncio, json, os, sys
from opentelemetry import trace
from tenxgraph.core.state import Message
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tests_py.publisher_graphs import tool_graph

async def run(app, thread="t-obs"):
    out = await app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": thread})
    await app.aclose()
    return out["messages"][-1].text()

def flush(provider=None):
    (provider or trace.get_tracer_provider()).force_flush()
"""


def _child(body: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", PRELUDE + body], cwd=ROOT, capture_output=True, text=True,
                          timeout=GUARD, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _names(spans: list[dict]) -> list[str]:
    return sorted(s["name"] for s in spans)


def test_langsmith_publisher_exports_every_span_with_the_key_and_project(receiver) -> None:
    out = _child(r"""
from tenxgraph.runtime.publisher import LangsmithPublisher
pub = LangsmithPublisher(api_key="k-123", project="support-bot", endpoint=os.environ["EP"])
text = asyncio.run(run(tool_graph(pub, checkpointer=InMemoryCheckpointer())))
flush()
print(json.dumps({"text": text, "global": type(trace.get_tracer_provider()).__name__}))
""", {"EP": receiver.url})
    assert out == {"text": "sum is 3", "global": "TracerProvider"}
    assert receiver.requests and {r["path"] for r in receiver.requests} == {"/otel/v1/traces"}
    headers = receiver.requests[0]["headers"]
    assert headers["x-api-key"] == "k-123" and headers["langsmith-project"] == "support-bot"
    spans = receiver.spans()
    assert _names(spans) == ["tenxgraph.graph", *["tenxgraph.node"] * 4,
                             "tenxgraph.tool"]
    tool = next(s for s in spans if s["name"] == "tenxgraph.tool")
    assert tool["attrs"]["tenxgraph.tool.name"] == "add" and tool["attrs"]["tenxgraph.tool.from_ledger"] is False
    assert {s["attrs"]["tenxgraph.graph.thread_id"] for s in spans} == {"t-obs"}


def test_setup_langsmith_on_a_given_provider_keeps_the_graphs_publisher_and_the_global_one(receiver) -> None:
    out = _child(r"""
from opentelemetry.sdk.trace import TracerProvider
from tenxgraph.runtime.publisher import setup_langsmith
from tests_py.publisher_graphs import Recorder
os.environ["LANGSMITH_API_KEY"] = "env-key"
from tests_py.publisher_graphs import tool_state_graph
rec = Recorder()
provider = TracerProvider()
g = tool_state_graph(rec)
setup_langsmith(g, endpoint=os.environ["EP"], tracer_provider=provider)
text = asyncio.run(run(g.compile(checkpointer=InMemoryCheckpointer())))
flush(provider)
print(json.dumps({"text": text, "recorded": len(rec.events),
                  "global": type(trace.get_tracer_provider()).__name__}))
""", {"EP": receiver.url})
    # The graph's own publisher still gets every event; the global provider was left alone.
    assert out == {"text": "sum is 3", "recorded": 15, "global": "ProxyTracerProvider"}
    assert receiver.requests[0]["headers"]["x-api-key"] == "env-key"
    assert "langsmith-project" not in receiver.requests[0]["headers"]
    assert _names(receiver.spans()).count("tenxgraph.tool") == 1


def test_bad_langsmith_input_raises_before_anything_is_installed() -> None:
    out = _child(r"""
from tenxgraph.runtime.publisher import LangsmithPublisher, setup_langsmith, setup_observability
os.environ.pop("LANGSMITH_API_KEY", None)
errors = []
for call in (lambda: LangsmithPublisher(), lambda: LangsmithPublisher(api_key="  "),
             lambda: LangsmithPublisher(api_key="k", endpoint="api.smith.langchain.com"),
             lambda: setup_langsmith(None), lambda: LangsmithPublisher(api_key="k", level="verbose"),
             lambda: setup_observability(None, {"level": "everything", "langsmith": {"enabled": True}}),
             lambda: setup_observability(None, {"langsmith": True}),
             lambda: setup_observability(None, ["langsmith"])):
    try:
        call()
        errors.append(None)
    except ValueError as e:
        errors.append(str(e))
print(json.dumps({"errors": errors, "global": type(trace.get_tracer_provider()).__name__}))
""")
    errors = out["errors"]
    assert all(errors), errors
    assert "LANGSMITH_API_KEY" in errors[0] and "LANGSMITH_API_KEY" in errors[1]
    assert "http(s) URL" in errors[2] and "LANGSMITH_API_KEY" in errors[3]
    assert "verbose" in errors[4] and "everything" in errors[5]
    assert "observability.langsmith must be an object" in errors[6] and "must be an object" in errors[7]
    assert out["global"] == "ProxyTracerProvider"


def test_setup_observability_with_nothing_enabled_installs_nothing() -> None:
    out = _child(r"""
from tenxgraph.runtime.publisher import setup_observability
from tests_py.publisher_graphs import tool_state_graph
g = tool_state_graph()
setup_observability(g, {"level": "full", "logfire": {"enabled": False}})
print(json.dumps({"publisher": g.publisher is None, "global": type(trace.get_tracer_provider()).__name__}))
""")
    assert out == {"publisher": True, "global": "ProxyTracerProvider"}


logfire_needed = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import logfire"], capture_output=True).returncode != 0,
    reason="the logfire extra is not installed")


@logfire_needed
def test_logfire_publisher_sends_spans_through_logfires_provider() -> None:
    out = _child(r"""
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tenxgraph.runtime.publisher import LogfirePublisher, ObservabilityLevel
mem = InMemorySpanExporter()
pub = LogfirePublisher(send_to_logfire=False, console=False, service_name="svc",
                       additional_span_processors=[SimpleSpanProcessor(mem)], level=ObservabilityLevel.FULL)
text = asyncio.run(run(tool_graph(pub, checkpointer=InMemoryCheckpointer())))
flush()
spans = [s for s in mem.get_finished_spans() if s.name.startswith("tenxgraph.")]
print(json.dumps({"text": text, "names": sorted(s.name for s in spans),
                  "service": sorted({s.resource.attributes.get("service.name") for s in spans})}))
""")
    assert out["text"] == "sum is 3"
    assert out["names"] == ["tenxgraph.graph", *["tenxgraph.node"] * 4, "tenxgraph.tool"]
    assert out["service"] == ["svc"]


@logfire_needed
def test_setup_observability_with_both_sends_logfires_spans_to_langsmith_too(receiver) -> None:
    out = _child(r"""
from tenxgraph.runtime.publisher import setup_observability
from tests_py.publisher_graphs import tool_state_graph
os.environ["LANGSMITH_API_KEY"] = "both-key"
g = tool_state_graph()
setup_observability(g, {"level": "spans", "logfire": {"enabled": True, "send_to_logfire": False, "console": False},
                        "langsmith": {"enabled": True, "project": "p", "endpoint": os.environ["EP"]}})
text = asyncio.run(run(g.compile(checkpointer=InMemoryCheckpointer())))
flush()
print(json.dumps({"text": text, "level": g.publisher.level.value}))
""", {"EP": receiver.url})
    assert out == {"text": "sum is 3", "level": "spans"}
    assert receiver.requests[0]["headers"]["langsmith-project"] == "p"
    assert [n for n in _names(receiver.spans()) if n.startswith("tenxgraph.")] == [
        "tenxgraph.graph", *["tenxgraph.node"] * 4, "tenxgraph.tool"]


DIFF_SCRIPT = r"""
import asyncio, os
from opentelemetry import trace
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.runtime.publisher import LangsmithPublisher

async def main():
    pub = LangsmithPublisher(api_key="k-diff", project="proj", endpoint=os.environ["EP"])
    g = StateGraph(AgentState, publisher=pub)
    g.add_node("a", lambda state: [Message.text_message("A", role="assistant")])
    g.set_entry_point("a"); g.add_edge("a", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t1"})
    for _ in range(100):  # 10xGraph's publish tasks finish later than the run
        await asyncio.sleep(0.02)
    trace.get_tracer_provider().force_flush()
    emit("done")

asyncio.run(main())
"""


def test_langsmith_export_matches_10xgraph(oracle) -> None:
    seen = {}
    for side in ("theirs", "ours"):
        r = Receiver()
        try:
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            assert run(DIFF_SCRIPT, env={"EP": r.url}) == "done"
            seen[side] = {
                "paths": sorted({q["path"] for q in r.requests}),
                "headers": sorted({(k, v) for q in r.requests for k, v in q["headers"].items()
                                   if k in ("x-api-key", "langsmith-project")}),
                "graph_spans": [s["attrs"].get("tenxgraph.graph.thread_id") for s in r.spans()
                                if s["name"] == "tenxgraph.graph"],
                "node_a": [s["name"] for s in r.spans() if s["attrs"].get("tenxgraph.node.name") == "a"],
            }
        finally:
            r.server.shutdown()
    # 10xGraph's run span had not ended by the flush after the run (only its node spans were
    # exported); ours is exported with the run's thread id.
    assert seen["theirs"].pop("graph_spans") == [] and seen["ours"].pop("graph_spans") == ["t1"]
    assert seen["ours"] == seen["theirs"]
    assert seen["ours"]["headers"] == [("langsmith-project", "proj"), ("x-api-key", "k-diff")]
    assert seen["ours"]["node_a"] == ["tenxgraph.node"]
