"""Graphs and publishers shared by the publisher tests (ours and the OpenTelemetry one)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from tenxgraph.core.graph import StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.runtime.publisher import BasePublisher, EventModel
from tenxgraph.utils import END

GUARD = 120.0  # seconds; reached only if something hangs, which is the failure


class Recorder(BasePublisher):
    """Keeps a copy of each event as it arrives (a copy: what the publisher saw at that moment)."""

    def __init__(self) -> None:
        super().__init__({})
        self.events: list[EventModel] = []
        self.closed = False

    async def publish(self, event: EventModel) -> None:
        self.events.append(event.model_copy(deep=True))

    async def close(self) -> None:
        self.closed = True

    def sync_close(self) -> None:
        self.closed = True

    def seq(self) -> list[tuple[str, str, str]]:
        return [(str(e.event), str(e.event_type), e.node_name) for e in self.events]


class Hung(BasePublisher):
    """A publisher whose publish (and close) wait on an event nobody sets."""

    def __init__(self) -> None:
        super().__init__({})
        self.calls = 0
        self.never: asyncio.Event | None = None

    async def publish(self, event: EventModel) -> None:
        self.calls += 1
        self.never = self.never or asyncio.Event()
        await self.never.wait()

    async def close(self) -> None:
        await asyncio.Event().wait()

    def sync_close(self) -> None:
        pass


class Failing(BasePublisher):
    def __init__(self) -> None:
        super().__init__({})
        self.calls = 0

    async def publish(self, event: EventModel) -> None:
        self.calls += 1
        raise RuntimeError("broker down")

    async def close(self) -> None:
        raise RuntimeError("broker down")

    def sync_close(self) -> None:
        raise RuntimeError("broker down")


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def model(state: AgentState) -> list[Message]:
    if state.context[-1].role == "tool":
        return [Message.text_message("sum is " + state.context[-1].text(), role="assistant")]
    return [Message(role="assistant", content=[], tools_calls=[
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}}])]


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def tool_state_graph(publisher: Any = None) -> Any:
    """model -> tools (one ``add`` call) -> model, not compiled yet."""
    g = StateGraph(AgentState, publisher=publisher)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([add]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g


def tool_graph(publisher: Any = None, **compile_kw: Any) -> Any:
    return tool_state_graph(publisher).compile(**compile_kw)


class Gate:
    """A node that reports it started and then waits until the test lets it go (asyncio events)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.go = asyncio.Event()

    async def node(self, state: AgentState) -> list[Message]:
        self.started.set()
        await self.go.wait()
        return [Message.text_message("second", role="assistant")]


def two_step_graph(publisher: Any, gate: Gate, checkpointer: Any) -> Any:
    """first -> second (the gate) -> END."""
    g = StateGraph(AgentState, publisher=publisher)
    g.add_node("first", lambda state: [Message.text_message("first", role="assistant")])
    g.add_node("second", gate.node)
    g.set_entry_point("first")
    g.add_edge("first", "second")
    g.add_edge("second", END)
    return g.compile(checkpointer=checkpointer)


async def until(pred: Any, what: str) -> None:
    """Polls ``pred`` until true; fails after GUARD seconds."""
    deadline = time.monotonic() + GUARD
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
