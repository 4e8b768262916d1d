"""tenxgraph.runtime.publisher: the events a run publishes, where, and that no publisher can hold
a run up or fail it."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.runtime.publisher import (
    BasePublisher,
    CompositePublisher,
    ConsolePublisher,
    ContentType,
    Event,
    EventModel,
    EventType,
    publish_event,
)
from tenxgraph.runtime.publisher.publish import outbox_for
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils import END, interrupt
from tests_py.publisher_graphs import Failing, Hung, Recorder, tool_graph

HANG_GUARD = 120  # seconds: only ever reached if the run hangs, which is the failure


async def _settle(box_publisher: BasePublisher) -> None:
    await outbox_for(box_publisher).flush(30)


def _texts(out: dict) -> list[str]:
    return [m.text() for m in out["messages"]]


@pytest.mark.asyncio
async def test_a_tool_run_publishes_each_point_in_order(checkpointer, make_thread) -> None:
    rec = Recorder()
    app = tool_graph(rec, checkpointer=checkpointer)
    tid = make_thread()
    out = await app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": tid})
    await _settle(rec)
    assert rec.seq() == [
        ("graph_execution", "start", "__start__"),
        ("node_execution", "start", "__start__"), ("node_execution", "end", "__start__"),
        ("graph_execution", "progress", "__start__"),
        ("node_execution", "start", "model"), ("node_execution", "end", "model"),
        ("graph_execution", "progress", "__start__"),
        ("node_execution", "start", "tools"),
        ("tool_execution", "start", "add"), ("tool_execution", "end", "add"),
        ("node_execution", "end", "tools"),
        ("graph_execution", "progress", "__start__"),
        ("node_execution", "start", "model"), ("node_execution", "end", "model"),
        ("graph_execution", "end", "__start__"),
    ]
    ev = rec.events
    assert all(e.thread_id == tid and e.run_id == ev[0].run_id and e.user_id == "anonymous" for e in ev)
    tool_end = ev[9]
    assert tool_end.data["tool_call_id"] == "c1" and tool_end.data["function_name"] == "add"
    assert tool_end.data["message"]["content"][0]["output"] == "3"
    assert tool_end.metadata["from_ledger"] is False and tool_end.metadata["tool_node"] == "tools"
    assert tool_end.content_type == [ContentType.TOOL_RESULT, ContentType.MESSAGE]
    model_end = ev[5].data["messages"]
    assert [(m["role"], m["tools_calls"][0]["id"]) for m in model_end] == [("assistant", "c1")]
    final = ev[-1]
    assert [m["role"] for m in final.data["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert final.data["state"]["execution_meta"]["status"] == "completed"
    assert _texts(out)[-1] == "sum is 3"
    # Every event is its own object, never changed after it was queued.
    assert len({id(e) for e in ev}) == len(ev)


@pytest.mark.asyncio
async def test_a_failing_node_publishes_node_error_then_graph_error() -> None:
    def boom(state: AgentState) -> None:
        raise RuntimeError("boom")

    rec = Recorder()
    g = StateGraph(AgentState, publisher=rec)
    g.add_node("a", boom)
    g.set_entry_point("a")
    g.add_edge("a", END)
    app = g.compile()
    with pytest.raises(Exception, match="boom"):
        await app.ainvoke({"messages": [Message.text_message("x")]}, {"thread_id": "err"})
    await _settle(rec)
    assert rec.seq()[-3:] == [("node_execution", "start", "a"), ("node_execution", "error", "a"),
                              ("graph_execution", "error", "__start__")]
    node_err, graph_err = rec.events[-2:]
    assert node_err.data["error"] == "boom" and node_err.is_error
    assert graph_err.data["error"].startswith("[NODE_001]") and graph_err.metadata["error_code"] == "NODE_001"


@pytest.mark.asyncio
async def test_interrupts_publish_interrupted_then_end() -> None:
    def ask(state: AgentState) -> list[Message]:
        answer = interrupt({"q": "ok?"})
        return [Message.text_message(f"got {answer}", role="assistant")]

    rec = Recorder()
    g = StateGraph(AgentState, publisher=rec)
    g.add_node("ask", ask)
    g.add_node("after", lambda state: [Message.text_message("after", role="assistant")])
    g.set_entry_point("ask")
    g.add_edge("ask", "after")
    g.add_edge("after", END)
    app = g.compile(interrupt_before=["after"])
    cfg = {"thread_id": "hitl"}
    await app.ainvoke({"messages": [Message.text_message("x")]}, cfg)
    await _settle(rec)
    assert rec.seq()[-3:] == [("node_execution", "start", "ask"), ("graph_execution", "interrupted", "__start__"),
                              ("graph_execution", "end", "__start__")]
    assert rec.events[-2].metadata["interrupt_reason"] == "interrupt"
    rec.events.clear()
    await app.ainvoke({"resume": "yes"}, cfg)  # pauses again, before "after"
    await _settle(rec)
    assert ("node_execution", "end", "ask") in rec.seq()
    assert rec.events[-2].event_type == EventType.INTERRUPTED
    assert rec.events[-2].metadata["interrupt_reason"] == "interrupt_before: after"
    assert ("node_execution", "start", "__start__") not in rec.seq()  # a resume does not start over


@pytest.mark.asyncio
async def test_a_hung_publisher_neither_stalls_nor_changes_the_run(checkpointer, make_thread) -> None:
    plain = await tool_graph(checkpointer=checkpointer).ainvoke(
        {"messages": [Message.text_message("add")]}, {"thread_id": make_thread()})
    hung = Hung()
    box = outbox_for(hung)
    box.publish_timeout = 0.2  # each stuck publish is given up on quickly
    app = tool_graph(hung, checkpointer=checkpointer)
    out = await asyncio.wait_for(
        app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": make_thread()}), HANG_GUARD)
    assert _texts(out) == _texts(plain)
    assert hung.calls >= 1
    # aclose delivers what it can and closes the publisher, both bounded: the close hangs forever.
    app.shutdown_timeout = 1.5
    closed = await asyncio.wait_for(app.aclose(), HANG_GUARD)
    assert closed["status"] == "closed" and closed["publisher"]["status"] == "timeout", closed
    assert box.timed_out_count >= 1


def test_a_hung_publisher_does_not_hang_sync_invoke() -> None:
    hung = Hung()
    app = tool_graph(hung)
    out = app.invoke({"messages": [Message.text_message("add")]}, {"thread_id": "sync"})
    assert _texts(out)[-1] == "sum is 3"


@pytest.mark.asyncio
async def test_a_full_outbox_drops_new_events_and_counts_them() -> None:
    hung = Hung()
    box = outbox_for(hung)
    box.max_pending = 2
    box.publish_timeout = None  # the first event holds the drain for good
    out = await asyncio.wait_for(tool_graph(hung).ainvoke({"messages": [Message.text_message("add")]},
                                                          {"thread_id": "full"}), HANG_GUARD)
    assert _texts(out)[-1] == "sum is 3"
    await asyncio.sleep(0)
    # 15 events: one taken by the stuck drain, two waiting, the rest dropped.
    assert box.dropped_count == 12 and box.delivered_count == 0 and hung.calls == 1


@pytest.mark.asyncio
async def test_a_failing_publisher_does_not_fail_the_run(caplog: pytest.LogCaptureFixture) -> None:
    bad = Failing()
    out = await tool_graph(bad).ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": "f"})
    await _settle(bad)
    assert _texts(out)[-1] == "sum is 3"
    assert bad.calls == 15 and outbox_for(bad).failed_count == 15
    assert "Failed to publish event" in caplog.text


@pytest.mark.asyncio
async def test_composite_fans_out_past_a_failing_member() -> None:
    rec, bad = Recorder(), Failing()
    app = tool_graph([bad, rec])
    assert isinstance(app._publisher, CompositePublisher)
    await app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": "c"})
    await _settle(app._publisher)
    assert len(rec.events) == 15 and bad.calls == 15


def test_publisher_argument_rules() -> None:
    assert StateGraph(AgentState, publisher=[]).publisher is None
    assert StateGraph(AgentState, publisher=None).publisher is None
    with pytest.raises(TypeError, match="publisher must be a BasePublisher"):
        StateGraph(AgentState, publisher=object())
    with pytest.raises(TypeError, match="publisher must be a BasePublisher"):
        StateGraph(AgentState, publisher=[Recorder(), "not one"])
    with pytest.raises(TypeError):
        BasePublisher({})  # abstract


@pytest.mark.asyncio
async def test_publish_event_inside_a_node_reaches_the_graph_publisher() -> None:
    seen_thread = {}

    def node(state: AgentState, config: dict) -> list[Message]:
        ev = EventModel.default(config, {"custom": 1}, [ContentType.DATA], Event.NODE_EXECUTION,
                                EventType.UPDATE, "custom")
        seen_thread["id"] = ev.thread_id
        publish_event(ev)  # a sync node runs in a thread: the event still reaches the run's publisher
        return [Message.text_message("ok", role="assistant")]

    rec = Recorder()
    g = StateGraph(AgentState, publisher=rec)
    g.add_node("n", node)
    g.set_entry_point("n")
    g.add_edge("n", END)
    await g.compile().ainvoke({"messages": [Message.text_message("x")]}, {"thread_id": "pe"})
    await _settle(rec)
    custom = [e for e in rec.events if e.node_name == "custom"]
    assert len(custom) == 1 and custom[0].data == {"custom": 1} and seen_thread["id"] == "pe"
    publish_event(EventModel(event=Event.STREAMING, event_type=EventType.UPDATE))  # no run: nothing to do


@pytest.mark.asyncio
async def test_console_publisher_prints_one_line_per_event(capsys: pytest.CaptureFixture[str]) -> None:
    pub = ConsolePublisher()
    await pub.publish(EventModel.default({"thread_id": "t"}, {"k": 1}, [ContentType.STATE], node_name="n"))
    line = capsys.readouterr().out
    assert "Source: n.start" in line and "{'k': 1}" in line
    await pub.close()
    with pytest.raises(RuntimeError, match="closed ConsolePublisher"):
        await pub.publish(EventModel(event=Event.GRAPH_EXECUTION, event_type=EventType.START))


def test_event_model_defaults_and_enums() -> None:
    ev = EventModel.default({"thread_id": 7, "run_id": "r", "user_id": "u", "timestamp": "ts", "is_stream": True},
                            {}, [ContentType.MESSAGE], Event.TOOL_EXECUTION, EventType.END, "t", {"x": 1})
    assert (ev.event, ev.event_type, ev.thread_id, ev.run_id, ev.user_id) == ("tool_execution", "end", 7, "r", "u")
    assert ev.metadata == {"run_timestamp": "ts", "is_stream": True, "x": 1}
    s = EventModel.stream({"thread_id": "t"}, node_name="n")
    assert s.event == Event.STREAMING and s.event_type == EventType.UPDATE
    assert s.content_type == [ContentType.TEXT, ContentType.REASONING]
    assert EventModel(event="graph_execution", event_type="start").timestamp > 0
    with pytest.raises(ValueError):
        EventModel(event="nope", event_type="start")


IMPORTS = [
    "import tenxgraph.runtime",
    "import tenxgraph.runtime.publisher",
    "from tenxgraph.runtime import publisher, EventModel, publish_event",
    "from tenxgraph.runtime.publisher.console_publisher import ConsolePublisher\n"
    "from tenxgraph.runtime.publisher.base_publisher import BasePublisher\n"
    "from tenxgraph.runtime.publisher.events import EventModel\n"
    "from tenxgraph.runtime.publisher import BasePublisher as B\nassert B is BasePublisher",
    "from tenxgraph.runtime.publisher.events import Event\nimport tenxgraph.core.graph\nimport tenxgraph.runtime",
    "from tenxgraph.runtime.publisher.publish import publish_event\nfrom tenxgraph.core.graph import StateGraph",
    "from tenxgraph.core.graph import StateGraph\nfrom tenxgraph.runtime.publisher.otel_publisher import OtelPublisher",
    "import tenxgraph.utils\nfrom tenxgraph.runtime import CompositePublisher",
    "from tenxgraph.storage.checkpointer import InMemoryCheckpointer\nimport tenxgraph.runtime.publisher.events",
    "import tenxgraph.prebuilt.tools\nimport tenxgraph.runtime",
    "from tenxgraph.core.graph import RemoteToolConfig\nfrom tenxgraph.runtime.publisher import publish_event",
]


@pytest.mark.parametrize("statements", IMPORTS)
def test_runtime_imports_first_in_any_order(statements: str) -> None:
    r = subprocess.run([sys.executable, "-c", statements], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_sync_stream_delivers_the_run_events() -> None:
    rec = Recorder()
    chunks = list(tool_graph(rec).stream({"messages": [Message.text_message("add")]}, {"thread_id": "ss"}))
    assert chunks and rec.events[-1].event_type == EventType.END
    assert all(e.metadata["is_stream"] is True for e in rec.events)
    assert [e.node_name for e in rec.events if e.event == Event.TOOL_EXECUTION] == ["add", "add"]
