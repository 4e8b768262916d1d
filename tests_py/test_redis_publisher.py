"""RedisPublisher against a real Redis: the wire format (10xGraph 0.10's channel / stream names
and payload), the same on both libraries, and that a Redis that stops or hangs mid-run costs
events, never a step."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid

import pytest

from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.runtime.publisher import (
    CompositePublisher,
    KafkaPublisher,
    PublisherUnavailableError,
    RabbitMQPublisher,
    RedisPublisher,
)
from tenxgraph.runtime.publisher.publish import outbox_for
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.testing.services import redis_command, start_redis
from tenxgraph.utils import END
from tests_py.publisher_graphs import GUARD, Gate, Recorder, tool_graph, two_step_graph, until

redis_asyncio = pytest.importorskip("redis.asyncio")

async def _stream_payloads(url: str, stream: str) -> list[tuple[list[bytes], dict]]:
    client = redis_asyncio.Redis.from_url(url)
    try:
        entries = await client.xrange(stream)
    finally:
        await client.aclose()
    return [(sorted(fields), json.loads(fields[b"data"])) for _id, fields in entries]


def _seq(payloads: list[dict]) -> list[tuple[str, str, str]]:
    return [(p["event"], p["event_type"], p["node_name"]) for p in payloads]


@pytest.mark.asyncio
async def test_stream_mode_writes_one_entry_per_event_in_order(tenx_redis) -> None:
    stream = f"events-{uuid.uuid4().hex}"
    rec = Recorder()
    redis_pub = RedisPublisher({"url": tenx_redis.url, "mode": "stream", "stream": stream})
    app = tool_graph(CompositePublisher([rec, redis_pub]), checkpointer=InMemoryCheckpointer())
    out = await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("add")]},
                                             {"thread_id": "t-stream"}), GUARD)
    assert out["messages"][-1].text() == "sum is 3"
    await app.aclose()  # delivers what is queued, then closes the publishers
    entries = await _stream_payloads(tenx_redis.url, stream)
    assert {tuple(keys) for keys, _ in entries} == {(b"data",)}
    payloads = [p for _, p in entries]
    assert _seq(payloads) == rec.seq() and len(payloads) == 15
    assert payloads == [e.model_dump(mode="json") for e in rec.events]
    assert all(p["thread_id"] == "t-stream" for p in payloads)
    assert redis_pub._is_closed  # closed by aclose(): publishing again is refused
    with pytest.raises(RuntimeError, match="closed"):
        await redis_pub.publish(rec.events[0])


@pytest.mark.asyncio
async def test_stream_maxlen_trims(tenx_redis) -> None:
    stream = f"events-{uuid.uuid4().hex}"
    pub = RedisPublisher({"url": tenx_redis.url, "mode": "stream", "stream": stream, "maxlen": 1})
    rec = Recorder()
    app = tool_graph(CompositePublisher([rec, pub]), checkpointer=InMemoryCheckpointer())
    for i in range(20):
        await app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": f"t{i}"})
    await app.aclose()
    # "~ maxlen" trims whole radix-tree nodes: far fewer than the 300 events remain.
    assert len(rec.events) == 300
    assert int(redis_command(tenx_redis.port, "XLEN", stream).split(b"\r\n")[0][1:]) < 300


@pytest.mark.asyncio
async def test_pubsub_mode_publishes_to_the_default_channel(tenx_redis) -> None:
    sub = redis_asyncio.Redis.from_url(tenx_redis.url)
    ps = sub.pubsub()
    await ps.subscribe("tenxgraph.events")
    await ps.get_message(timeout=5)  # the subscribe confirmation
    rec = Recorder()
    pub = RedisPublisher({"url": tenx_redis.url})
    app = tool_graph(CompositePublisher([rec, pub]), checkpointer=InMemoryCheckpointer())
    await app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": "t-pubsub"})
    await app.aclose()
    got: list[dict] = []
    deadline = time.monotonic() + GUARD
    while len(got) < len(rec.events) and time.monotonic() < deadline:
        msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1)
        if msg is not None:
            assert msg["channel"] == b"tenxgraph.events"
            got.append(json.loads(msg["data"]))
    await ps.aclose()
    await sub.aclose()
    assert _seq(got) == rec.seq()


@pytest.mark.asyncio
async def test_redis_stopped_mid_run_costs_events_not_steps() -> None:
    server = start_redis(use_env=False)  # our own: this test stops it
    stream = "events"
    pub = RedisPublisher({"url": server.url, "mode": "stream", "stream": stream,
                          "socket_timeout": 2.0, "socket_connect_timeout": 2.0})
    box = outbox_for(pub)
    gate = Gate()
    cp: InMemoryCheckpointer[AgentState] = InMemoryCheckpointer()
    app = two_step_graph(pub, gate, cp)
    try:
        run = asyncio.ensure_future(app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": "t"}))
        await asyncio.wait_for(gate.started.wait(), GUARD)
        # The events before "second" started reach Redis while it is up.
        await until(lambda: box.delivered_count >= 4, "the first events to be delivered")
        before = box.delivered_count
        server.stop()
        gate.go.set()
        out = await asyncio.wait_for(run, GUARD)
        assert [m.text() for m in out["messages"]] == ["go", "first", "second"]
        state = await cp.aget_state({"thread_id": "t"})
        assert state is not None
        assert state.execution_meta.status == "completed"
        assert [m.text() for m in state.context] == ["go", "first", "second"]
        assert await box.flush(GUARD)
        # At most a reply already on its way when Redis stopped is counted delivered.
        assert box.failed_count + box.timed_out_count >= 1 and box.dropped_count == 0
        assert before <= box.delivered_count <= before + 1
    finally:
        server.stop()
        await app.aclose()


@pytest.mark.asyncio
async def test_a_hung_redis_does_not_hold_up_the_run() -> None:
    server = start_redis(use_env=False)
    pub = RedisPublisher({"url": server.url, "mode": "stream", "stream": "events",
                          "socket_timeout": 1.0, "socket_connect_timeout": 1.0})
    box = outbox_for(pub)
    app = tool_graph(pub, checkpointer=InMemoryCheckpointer())
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)  # accepts connections (kernel backlog), never answers
    try:
        out = await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("add")]},
                                                 {"thread_id": "t"}), GUARD)
        assert out["messages"][-1].text() == "sum is 3"
        assert box.delivered_count == 0
        assert await box.flush(GUARD)
        assert box.failed_count + box.timed_out_count == 15
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.stop()
        await app.aclose()


def _publisher_threads() -> int:
    import threading

    return sum(t.name == "tenxgraph-redis-publisher" for t in threading.enumerate())


def test_one_publisher_serves_runs_on_many_event_loops_and_close_stops_it(tenx_redis) -> None:
    # Each asyncio.run is a loop of its own, as each sync invoke is.
    stream = f"events-{uuid.uuid4().hex}"
    pub = RedisPublisher({"url": tenx_redis.url, "mode": "stream", "stream": stream})
    app = tool_graph(pub, checkpointer=InMemoryCheckpointer())
    before = _publisher_threads()

    async def one(i: int) -> None:
        await app.ainvoke({"messages": [Message.text_message("add")]}, {"thread_id": f"loop-{i}"})
        assert await outbox_for(pub).flush(GUARD)

    for i in range(3):
        asyncio.run(one(i))
    assert _publisher_threads() == before + 1
    assert outbox_for(pub).delivered_count == 45 and outbox_for(pub).failed_count == 0
    xlen = redis_command(tenx_redis.port, "XLEN", stream)
    assert xlen.startswith(b":45")
    pub.sync_close()
    assert _publisher_threads() == before
    pub.sync_close()  # idempotent


def test_constructor_defaults_and_bad_config() -> None:
    pub = RedisPublisher()
    assert (pub.url, pub.mode, pub.channel, pub.stream, pub.maxlen, pub.encoding) == (
        "redis://localhost:6379/0", "pubsub", "tenxgraph.events", "tenxgraph.events", None, "utf-8")
    assert (pub.max_connections, pub.socket_timeout, pub.socket_connect_timeout, pub.socket_keepalive,
            pub.health_check_interval) == (10, 5.0, 5.0, True, 30)
    with pytest.raises(ValueError, match="mode"):
        RedisPublisher({"mode": "streams"})
    with pytest.raises(ValueError, match="maxlen"):
        RedisPublisher({"mode": "stream", "maxlen": 0})


def test_without_the_redis_package_the_constructor_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)  # what an install without it looks like
    with pytest.raises(PublisherUnavailableError) as err:
        RedisPublisher({})
    assert err.value.error_code == "PUBLISHER_002" and "10xgraph[redis]" in str(err.value)
    assert isinstance(err.value, RuntimeError)


def test_the_kafka_publisher_we_do_not_implement_refuses_to_construct() -> None:
    with pytest.raises(PublisherUnavailableError) as err:
        KafkaPublisher({})
    assert err.value.error_code == "PUBLISHER_001" and "KafkaPublisher" in str(err.value)
    from tenxgraph.runtime import KafkaPublisher as K, RabbitMQPublisher as R, RedisPublisher as Rd

    assert (K, R, Rd) == (KafkaPublisher, RabbitMQPublisher, RedisPublisher)


DIFF_SCRIPT = r"""
import asyncio, json, os
import redis.asyncio as r
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.runtime.publisher import RedisPublisher

STREAM = os.environ["STREAM"]

async def main():
    d = RedisPublisher()
    defaults = [d.url, d.mode, d.channel, d.stream, d.maxlen, d.encoding, d.max_connections,
                d.socket_timeout, d.socket_connect_timeout, d.socket_keepalive, d.health_check_interval]
    pub = RedisPublisher({"url": os.environ["REDIS_URL"], "mode": "stream", "stream": STREAM})
    g = StateGraph(AgentState, publisher=pub)
    g.add_node("a", lambda state: [Message.text_message("A", role="assistant")])
    g.set_entry_point("a"); g.add_edge("a", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t1"})
    c = r.Redis.from_url(os.environ["REDIS_URL"])
    for _ in range(200):  # 10xGraph's publish tasks finish later than the run
        entries = await c.xrange(STREAM)
        if any(json.loads(f[b"data"])["node_name"] == "a" for _, f in entries):
            break
        await asyncio.sleep(0.05)
    payloads = [json.loads(f[b"data"]) for _, f in entries]
    emit({
        "defaults": defaults,
        "fields": sorted({k.decode() for _, f in entries for k in f}),
        "payload_keys": sorted({k for p in payloads for k in p}),
        "a_node_events": sorted({(p["event"], p["node_name"]) for p in payloads if p["node_name"] == "a"}),
        "thread_ids": sorted({p["thread_id"] for p in payloads}),
    })
    await c.aclose()

asyncio.run(main())
"""


def test_same_wire_format_as_10xgraph(oracle, tenx_redis) -> None:
    env = {"REDIS_URL": tenx_redis.url}
    theirs = oracle.run_theirs(DIFF_SCRIPT, env={**env, "STREAM": f"theirs-{uuid.uuid4().hex}"})
    ours = oracle.run_ours(DIFF_SCRIPT, env={**env, "STREAM": f"ours-{uuid.uuid4().hex}"})
    assert ours == theirs
    assert theirs["fields"] == ["data"] and theirs["a_node_events"] == [["node_execution", "a"]]
