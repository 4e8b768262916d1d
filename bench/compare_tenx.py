"""tenxgraph's side of bench/compare.py: the turn as a tenxgraph graph, on InMemory, SQLite or
PostgreSQL. Every node is durably checkpointed (tenxgraph's default)."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from typing import Any

from compare_common import CALLS_TEXT, DONE_TEXT, TOOL_CALLS, TOOLS, USER_TEXT, new_thread, noop
from tenxgraph import END, START, AgentState, Message, StateGraph, ToolNode
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, PgCheckpointer, SqliteCheckpointer


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def build(cp: Any, calls: list[dict[str, Any]], tools: list[Any], **graph_kwargs: Any) -> Any:
    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message(CALLS_TEXT, role="assistant")
            msg.tools_calls = calls
            return msg
        return Message.text_message(DONE_TEXT, role="assistant")

    def route(state: AgentState) -> str:
        return "tools" if state.context[-1].tools_calls else END

    g = StateGraph(AgentState, **graph_kwargs)
    g.add_node("model", model)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


class TenxDriver:
    messages_per_turn = 6  # user, assistant with 3 calls, 3 tool results, assistant

    def __init__(self, backend: str, dsn: str | None, pool: int) -> None:
        self.backend, self.dsn, self.pool = backend, dsn, pool
        self._dir = tempfile.mkdtemp(prefix="tenx-compare-")
        self._noop_apps: dict[int, Any] = {}
        self._pattern: list[dict[str, Any]] | None = None

    def _config(self, thread_id: str) -> dict[str, Any]:
        return {"thread_id": thread_id}

    def _checkpointer(self) -> Any:
        if self.backend == "memory":
            return InMemoryCheckpointer()
        if self.backend == "sqlite":  # synchronous="full" (the default): every commit fsynced
            return SqliteCheckpointer(os.path.join(self._dir, "bench.db"))
        if self.backend == "postgres":
            return PgCheckpointer(self.dsn, pool_config={"max_size": self.pool})
        raise ValueError(self.backend)

    async def open(self) -> None:
        self.cp = self._checkpointer()
        self.app = self._build([_call(*c) for c in TOOL_CALLS], TOOLS)

    def _build(self, calls: list[dict[str, Any]], tools: list[Any]) -> Any:
        return build(self.cp, calls, tools)

    async def close(self) -> None:
        await self.cp.arelease()

    async def turn(self, thread_id: str) -> None:
        await self.app.ainvoke({"messages": [Message.text_message(USER_TEXT)]}, self._config(thread_id))

    async def message_count(self, thread_id: str) -> int:
        state = await self.cp.aget_state(self._config(thread_id))
        if state is None:
            return 0
        if state.context and state.context[-1].text() != DONE_TEXT:
            raise AssertionError(f"last message is {state.context[-1].text()!r}")
        return len(state.context)

    async def _turn_pattern(self) -> list[dict[str, Any]]:
        """The six messages of one real turn (run once on a scratch in-memory store)."""
        if self._pattern is None:
            cp = InMemoryCheckpointer()
            app = build(cp, [_call(*c) for c in TOOL_CALLS], TOOLS)
            await app.ainvoke({"messages": [Message.text_message(USER_TEXT)]}, self._config("pattern"))
            state = await cp.aget_state(self._config("pattern"))
            self._pattern = [m.model_dump(mode="json") for m in state.context]
        return self._pattern

    async def preload(self, thread_id: str, n_messages: int) -> None:
        """A thread with ``n_messages`` of history: whole turns like the benchmark's, after a few
        plain user/assistant messages to reach the exact count; written with aput_state."""
        pattern = await self._turn_pattern()
        turns, pad = divmod(n_messages, len(pattern))
        msgs = [Message.text_message(f"earlier message {i}", role="user" if i % 2 == 0 else "assistant")
                for i in range(pad)]
        for _ in range(turns):
            msgs += [Message.model_validate({**m, "message_id": str(uuid.uuid4())}) for m in pattern]
        state = AgentState()
        state.context = msgs
        await self.cp.aput_state(self._config(thread_id), state)

    async def noop_turn(self, n_tools: int) -> float:
        app = self._noop_apps.get(n_tools)
        if app is None:
            calls = [_call(f"call_{i}", "noop", {"i": i}) for i in range(n_tools)]
            app = self._noop_apps[n_tools] = self._build(calls, [noop])
        t0 = time.perf_counter()
        await app.ainvoke({"messages": [Message.text_message("go")]}, self._config(new_thread("noop")))
        return time.perf_counter() - t0


def runtime_counters() -> dict[str, float]:
    from tenxgraph import metrics

    return metrics.snapshot()
