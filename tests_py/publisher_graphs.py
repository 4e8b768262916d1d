"""Graphs and publishers shared by the publisher tests (ours and the OpenTelemetry one)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tenxgraph.core.graph import StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.runtime.publisher import BasePublisher, EventModel
from tenxgraph.utils import END


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


def tool_graph(publisher: Any = None, **compile_kw: Any) -> Any:
    g = StateGraph(AgentState, publisher=publisher)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([add]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(**compile_kw)
