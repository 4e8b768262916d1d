"""Small 10xGraph 0.10 modules: ``utils.media_scheme``, ``utils.injection.fresh``,
``runtime.publisher.otel_attributes`` and ``runtime.publisher.kafka_publisher``: same values and
answers as 10xGraph's (differential), and the core install imports without injectq."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

MEDIA_SCRIPT = """
from tenxgraph.utils import media_scheme as ms
urls = ["graph://media/abc", "agentflow://media/k/1.png", "https://x/y", "", None, "graph://other/x",
        "graph://media/"]
emit({"consts": [ms.MEDIA_SCHEME, ms.LEGACY_MEDIA_SCHEME, list(ms.MEDIA_SCHEMES)],
      "is": [ms.is_internal_media_url(u) for u in urls],
      "strip": [ms.strip_media_scheme(u) for u in urls if u is not None]})
"""


def test_media_scheme_matches_10xgraph(oracle) -> None:  # type: ignore[no-untyped-def]
    theirs, ours = oracle.run_both(MEDIA_SCRIPT)
    assert ours == theirs
    assert ours["is"] == [True, True, False, False, False, False, True]
    assert ours["strip"][:3] == ["abc", "k/1.png", "https://x/y"]


ATTRS_SCRIPT = """
from tenxgraph.runtime.publisher import otel_attributes as a
emit({n: getattr(a, n) for n in dir(a) if n.isupper()})
"""


def test_otel_attribute_names_are_10xgraphs(oracle) -> None:  # type: ignore[no-untyped-def]
    theirs, ours = oracle.run_both(ATTRS_SCRIPT)
    assert len(theirs) > 30
    # Every 10xGraph name with its value; ours only adds names.
    assert {k: ours.get(k) for k in theirs} == theirs
    assert set(ours) - set(theirs) == {"TOOL_CALL_ID", "TOOL_FROM_LEDGER", "TOOL_ARGUMENTS", "TOOL_RESULT",
                                       "GRAPH_INTERRUPTED"}


def test_the_otel_publisher_takes_its_attribute_names_from_otel_attributes() -> None:
    pytest.importorskip("opentelemetry.sdk.trace")
    import asyncio

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tenxgraph.core.graph import StateGraph, ToolNode
    from tenxgraph.core.state import AgentState, Message
    from tenxgraph.runtime.publisher import otel_attributes as A
    from tenxgraph.runtime.publisher.otel_publisher import OtelPublisher
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer
    from tenxgraph.utils import END

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def add(a: int, b: int) -> int:
        """Adds."""
        return a + b

    def model(state: AgentState) -> list[Message]:
        if state.context[-1].role == "tool":
            return [Message.text_message("done", role="assistant")]
        return [Message(role="assistant", content=[], tools_calls=[
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}])]

    g = StateGraph(AgentState, publisher=OtelPublisher(tracer=provider.get_tracer("t")))
    g.add_node("model", model)
    g.add_node("tools", ToolNode([add]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END,
                            {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    app = g.compile(checkpointer=InMemoryCheckpointer())

    async def run() -> None:
        await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": "attrs"})
        await app.aclose()

    asyncio.run(run())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["tenxgraph.graph"].attributes[A.GRAPH_THREAD_ID] == "attrs"
    tool = spans["tenxgraph.tool"].attributes
    assert tool[A.TOOL_NAME] == "add" and tool[A.TOOL_CALL_ID] == "c1" and tool[A.TOOL_FROM_LEDGER] is False


KAFKA_SCRIPT = """
from tenxgraph.runtime.publisher.kafka_publisher import KafkaPublisher
from tenxgraph.runtime.publisher import KafkaPublisher as K2
from tenxgraph.runtime import KafkaPublisher as K3
emit({"same": KafkaPublisher is K2 is K3, "module": KafkaPublisher.__module__})
"""


def test_kafka_publisher_lives_at_10xgraphs_path(oracle) -> None:  # type: ignore[no-untyped-def]
    theirs, ours = oracle.run_both(KAFKA_SCRIPT)
    assert ours == theirs == {"same": True, "module": "tenxgraph.runtime.publisher.kafka_publisher"}
    from tenxgraph.runtime.publisher.errors import PublisherUnavailableError
    from tenxgraph.runtime.publisher.kafka_publisher import KafkaPublisher

    with pytest.raises(PublisherUnavailableError) as err:
        KafkaPublisher({"bootstrap_servers": "localhost:9092"})
    assert err.value.error_code == "PUBLISHER_001"


FRESH_SCRIPT = """
from abc import ABC, abstractmethod
from injectq import Inject, InjectQ
from tenxgraph.utils.injection import fresh

class Service(ABC):
    @abstractmethod
    def name(self): ...

class Impl(Service):
    def __init__(self, n):
        self.n = n
    def name(self):
        return self.n

class Concrete:
    pass

def node(svc: Service = Inject[Service], other: Concrete = Inject[Concrete]):
    s = fresh(svc)
    return s.name() if s is not None else None, type(fresh(other)).__name__

c = InjectQ.get_instance()
first = node()
c.bind_instance(Service, Impl("one"), allow_concrete=True)
second = node()
# Another graph's container becomes the active one: the same default now resolves there.
other = InjectQ()
other.bind_instance(Service, Impl("two"), allow_concrete=True)
other.activate()
third = node()
explicit = fresh(Impl("passed"))
emit({"unbound": first, "bound": second, "rebound": third, "explicit": explicit.name(), "plain": fresh(7)})
"""


def test_fresh_resolves_inject_defaults_on_each_call_as_10xgraph(oracle) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("injectq")
    theirs, ours = oracle.run_both(FRESH_SCRIPT)
    assert ours == theirs
    assert ours["unbound"] == [None, "NoneType"]  # unbound: None, abstract or not
    assert ours["bound"][0] == "one" and ours["rebound"][0] == "two"
    assert ours["explicit"] == "passed" and ours["plain"] == 7


def test_the_core_install_imports_without_injectq() -> None:
    # A child where importing injectq fails, as on a core (pydantic-only) install.
    code = (
        "import sys; sys.modules['injectq'] = None\n"
        "import tenxgraph, tenxgraph.utils.injection as inj, tenxgraph.utils.metrics, tenxgraph.utils.media_scheme\n"
        "import tenxgraph.runtime.publisher.otel_attributes, tenxgraph.runtime.publisher.kafka_publisher\n"
        "sentinel = object()\n"
        "assert inj.fresh(sentinel) is sentinel\n"
        "print('OK')\n"
    )
    import tenxgraph

    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(tenxgraph.__file__))}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr
