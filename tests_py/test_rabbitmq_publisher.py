"""RabbitMQPublisher against a real RabbitMQ broker: 10xGraph 0.10's exchange, routing key and
payload, the default exchange with ``declare=False``, and a broker that is down, killed mid-run
or paused costs events, never a step of the run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

from tenxgraph.core.state import Message
from tenxgraph.runtime.publisher import CompositePublisher, PublisherUnavailableError, RabbitMQPublisher
from tenxgraph.runtime.publisher.publish import outbox_for
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tests_py.publisher_graphs import GUARD, Gate, Recorder, tool_graph, two_step_graph, until
from tests_py.rabbitmq_server import RabbitMQServer, start_rabbitmq

aio_pika = pytest.importorskip("aio_pika")


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitMQServer]:
    server = start_rabbitmq()
    try:
        yield server
    finally:
        server.stop()


async def _bound_queue(url: str, exchange: str | None, routing_key: str, kind: str = "topic"):
    """A connection and an exclusive queue receiving what the publisher sends (bound to
    ``exchange``, or named ``routing_key`` on the default exchange when ``exchange`` is None)."""
    conn = await aio_pika.connect(url)
    ch = await conn.channel()
    if exchange is None:
        queue = await ch.declare_queue(routing_key, exclusive=True)
    else:
        ex = await ch.declare_exchange(exchange, aio_pika.ExchangeType[kind.upper()], durable=True)
        queue = await ch.declare_queue("", exclusive=True)
        await queue.bind(ex, routing_key=routing_key)
    return conn, queue


async def _drain(queue, n: int) -> list[dict]:
    got: list[dict] = []
    async with queue.iterator() as it:
        async for msg in it:
            async with msg.process():
                got.append(json.loads(msg.body))
            if len(got) == n:
                break
    return got


@pytest.mark.asyncio
async def test_every_event_reaches_a_queue_bound_to_the_tenxgraph_events_exchange_in_order(rabbit) -> None:
    conn, queue = await _bound_queue(rabbit.url, "tenxgraph.events", "tenxgraph.events")
    rec = Recorder()
    pub = RabbitMQPublisher({"url": rabbit.url})
    app = tool_graph(CompositePublisher([rec, pub]), checkpointer=InMemoryCheckpointer())
    try:
        out = await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("add")]},
                                                 {"thread_id": "t-rmq"}), GUARD)
        assert out["messages"][-1].text() == "sum is 3"
        await app.aclose()  # delivers what is queued, then closes the publishers
        got = await asyncio.wait_for(_drain(queue, len(rec.events)), GUARD)
        assert len(got) == 15
        assert got == [e.model_dump(mode="json") for e in rec.events]
        with pytest.raises(RuntimeError, match="closed"):
            await pub.publish(rec.events[0])
    finally:
        await conn.close()


@pytest.mark.asyncio
async def test_custom_exchange_type_and_routing_key(rabbit) -> None:
    exchange, key = f"ex-{uuid.uuid4().hex}", "agents.support"
    conn, queue = await _bound_queue(rabbit.url, exchange, key, kind="direct")
    rec = Recorder()
    pub = RabbitMQPublisher({"url": rabbit.url, "exchange": exchange, "routing_key": key,
                             "exchange_type": "DIRECT"})
    both = CompositePublisher([rec, pub])
    app = tool_graph(both, checkpointer=InMemoryCheckpointer())
    try:
        await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": "t"}), GUARD)
        assert await outbox_for(both).flush(GUARD)
        assert outbox_for(both).delivered_count == 15 and outbox_for(both).failed_count == 0
        got = await asyncio.wait_for(_drain(queue, 15), GUARD)
        assert [(g["event"], g["event_type"]) for g in got] == [(str(e.event), str(e.event_type)) for e in rec.events]
    finally:
        await app.aclose()
        await conn.close()


@pytest.mark.asyncio
async def test_declare_false_publishes_to_the_queue_named_by_the_routing_key(rabbit) -> None:
    key = f"q-{uuid.uuid4().hex}"
    conn, queue = await _bound_queue(rabbit.url, None, key)
    pub = RabbitMQPublisher({"url": rabbit.url, "declare": False, "routing_key": key})
    app = tool_graph(pub, checkpointer=InMemoryCheckpointer())
    try:
        await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": "t"}), GUARD)
        assert await outbox_for(pub).flush(GUARD)
        got = await asyncio.wait_for(_drain(queue, 15), GUARD)
        assert {g["thread_id"] for g in got} == {"t"}
    finally:
        await app.aclose()
        await conn.close()


@pytest.mark.asyncio
async def test_a_broker_that_is_down_costs_every_event_and_no_step() -> None:
    pub = RabbitMQPublisher({"url": "amqp://guest:guest@127.0.0.1:1/", "connection_timeout": 2})
    box = outbox_for(pub)
    app = tool_graph(pub, checkpointer=InMemoryCheckpointer())
    try:
        out = await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("add")]},
                                                 {"thread_id": "t"}), GUARD)
        assert out["messages"][-1].text() == "sum is 3"
        assert await box.flush(GUARD)
        assert box.delivered_count == 0 and box.failed_count + box.timed_out_count == 15
    finally:
        await app.aclose()


@pytest.mark.asyncio
async def test_broker_killed_mid_run_costs_events_not_steps() -> None:
    server = start_rabbitmq()  # our own: this test kills it
    pub = RabbitMQPublisher({"url": server.url, "connection_timeout": 2})
    box = outbox_for(pub)
    gate = Gate()
    cp: InMemoryCheckpointer = InMemoryCheckpointer()
    app = two_step_graph(pub, gate, cp)
    try:
        run = asyncio.ensure_future(app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": "t"}))
        await asyncio.wait_for(gate.started.wait(), GUARD)
        await until(lambda: box.delivered_count >= 4, "the first events to be delivered")
        before = box.delivered_count
        os.kill(server.pid, signal.SIGKILL)
        server._proc.wait(timeout=GUARD)
        gate.go.set()
        out = await asyncio.wait_for(run, GUARD)
        assert [m.text() for m in out["messages"]] == ["go", "first", "second"]
        state = await cp.aget_state({"thread_id": "t"})
        assert state is not None and state.execution_meta.status == "completed"
        assert await box.flush(GUARD)
        assert box.failed_count + box.timed_out_count >= 1 and box.dropped_count == 0
        assert before <= box.delivered_count <= before + 1
    finally:
        server.stop()
        await app.aclose()


@pytest.mark.asyncio
async def test_a_paused_broker_does_not_hold_up_the_run() -> None:
    server = start_rabbitmq()
    pub = RabbitMQPublisher({"url": server.url, "connection_timeout": 1})
    box = outbox_for(pub)
    app = tool_graph(pub, checkpointer=InMemoryCheckpointer())
    os.kill(server.pid, signal.SIGSTOP)  # the kernel accepts connections; nobody answers
    try:
        out = await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("add")]},
                                                 {"thread_id": "t"}), GUARD)
        assert out["messages"][-1].text() == "sum is 3"
        assert await box.flush(GUARD)
        assert box.delivered_count == 0 and box.failed_count + box.timed_out_count == 15
    finally:
        os.kill(server.pid, signal.SIGKILL)  # a paused broker would take its time to stop cleanly
        server.stop()
        await app.aclose()


def _publisher_threads() -> int:
    return sum(t.name == "tenxgraph-rabbitmq-publisher" for t in threading.enumerate())


def test_one_publisher_serves_sync_runs_on_many_loops_and_sync_close_stops_it(rabbit) -> None:
    pub = RabbitMQPublisher({"url": rabbit.url, "exchange": f"ex-{uuid.uuid4().hex}"})
    app = tool_graph(pub, checkpointer=InMemoryCheckpointer())
    before = _publisher_threads()
    for i in range(3):
        out = app.invoke({"messages": [Message.text_message("add")]}, {"thread_id": f"sync-{i}"})
        assert out["messages"][-1].text() == "sum is 3"
        assert asyncio.run(outbox_for(pub).flush(GUARD))
    assert _publisher_threads() == before + 1
    assert outbox_for(pub).delivered_count == 45 and outbox_for(pub).failed_count == 0
    pub.sync_close()
    assert _publisher_threads() == before
    pub.sync_close()  # idempotent


def test_constructor_defaults_and_bad_config() -> None:
    pub = RabbitMQPublisher()
    assert (pub.url, pub.exchange, pub.routing_key, pub.exchange_type, pub.declare, pub.durable,
            pub.connection_timeout, pub.heartbeat) == (
        "amqp://guest:guest@localhost/", "tenxgraph.events", "tenxgraph.events", "topic", True, True, 10, 60)
    with pytest.raises(ValueError, match="exchange_type"):
        RabbitMQPublisher({"exchange_type": "topics"})
    with pytest.raises(ValueError, match="exchange_type"):
        RabbitMQPublisher({"exchange_type": 3})


def test_without_aio_pika_the_constructor_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "aio_pika", None)  # what an install without it looks like
    with pytest.raises(PublisherUnavailableError) as err:
        RabbitMQPublisher({})
    assert err.value.error_code == "PUBLISHER_002" and "10xgraph[rabbitmq]" in str(err.value)
    assert isinstance(err.value, RuntimeError)


DIFF_SCRIPT = r"""
import asyncio, json, os
import aio_pika
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.runtime.publisher import RabbitMQPublisher

async def main():
    d = RabbitMQPublisher()
    defaults = [d.url, d.exchange, d.routing_key, d.exchange_type, d.declare, d.durable,
                d.connection_timeout, d.heartbeat]
    conn = await aio_pika.connect(os.environ["AMQP_URL"])
    ch = await conn.channel()
    ex = await ch.declare_exchange(os.environ["EXCHANGE"], aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await ch.declare_queue("", exclusive=True)
    await queue.bind(ex, routing_key="tenxgraph.events")
    pub = RabbitMQPublisher({"url": os.environ["AMQP_URL"], "exchange": os.environ["EXCHANGE"]})
    g = StateGraph(AgentState, publisher=pub)
    g.add_node("a", lambda state: [Message.text_message("A", role="assistant")])
    g.set_entry_point("a"); g.add_edge("a", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t1"})
    got, props = [], set()
    for _ in range(200):  # 10xGraph's publish tasks finish later than the run
        msg = await queue.get(no_ack=True, fail=False)
        if msg is None:
            if any(p["node_name"] == "a" for p in got):
                break
            await asyncio.sleep(0.05)
            continue
        got.append(json.loads(msg.body))
        props.add((msg.content_type, msg.delivery_mode, msg.routing_key, msg.exchange))
    emit({
        "defaults": defaults,
        "properties": sorted(props, key=repr),
        "payload_keys": sorted({k for p in got for k in p}),
        "a_node_events": sorted({(p["event"], p["node_name"]) for p in got if p["node_name"] == "a"}),
        "thread_ids": sorted({p["thread_id"] for p in got}),
    })
    await conn.close()

asyncio.run(main())
"""


def test_same_wire_format_as_10xgraph(oracle, rabbit) -> None:
    env = {"AMQP_URL": rabbit.url}
    theirs = oracle.run_theirs(DIFF_SCRIPT, env={**env, "EXCHANGE": f"theirs-{uuid.uuid4().hex}"})
    ours = oracle.run_ours(DIFF_SCRIPT, env={**env, "EXCHANGE": f"ours-{uuid.uuid4().hex}"})
    theirs_ex, ours_ex = theirs.pop("properties"), ours.pop("properties")
    assert ours == theirs
    assert theirs["a_node_events"] == [["node_execution", "a"]]
    # The exchange names differ by design (one per side); everything else of the message is equal.
    assert [p[:3] for p in ours_ex] == [p[:3] for p in theirs_ex] and len(ours_ex) == 1
