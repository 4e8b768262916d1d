"""LangGraph's side of bench/compare.py: the same turn as a LangGraph graph (MessagesState,
langgraph.prebuilt.ToolNode), checkpointed by InMemorySaver or AsyncPostgresSaver, invoked with
``durability="sync"`` (every step's checkpoint written before the next step starts)."""

from __future__ import annotations

import time
from typing import Any

from compare_common import CALLS_TEXT, DONE_TEXT, TOOL_CALLS, TOOLS, USER_TEXT, new_thread, noop
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode


def _calls(spec: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{"name": name, "args": args, "id": cid, "type": "tool_call"} for cid, name, args in spec]


def build(saver: Any, calls: list[dict[str, Any]], tools: list[Any]) -> Any:
    async def model(state: MessagesState) -> dict[str, Any]:
        if isinstance(state["messages"][-1], HumanMessage):
            return {"messages": [AIMessage(content=CALLS_TEXT, tool_calls=calls)]}
        return {"messages": [AIMessage(content=DONE_TEXT)]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=saver)


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


class LangGraphDriver:
    messages_per_turn = 6

    def __init__(self, backend: str, dsn: str | None, pool: int) -> None:
        self.backend, self.dsn, self.pool_size = backend, dsn, pool
        self.pool: Any = None
        self._noop_apps: dict[int, Any] = {}

    async def open(self) -> None:
        if self.backend == "memory":
            self.saver: Any = InMemorySaver()
        elif self.backend == "postgres":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool

            # As LangGraph's docs set it up: autocommit, no server-side prepared statements.
            self.pool = AsyncConnectionPool(
                self.dsn, min_size=1, max_size=self.pool_size, open=False,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            )  # fmt: skip
            await self.pool.open(wait=True)
            self.saver = AsyncPostgresSaver(self.pool)
            await self.saver.setup()
        else:
            raise ValueError(self.backend)
        self.app = build(self.saver, _calls(TOOL_CALLS), TOOLS)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def turn(self, thread_id: str) -> None:
        await self.app.ainvoke({"messages": [HumanMessage(USER_TEXT)]}, _config(thread_id), durability="sync")

    async def message_count(self, thread_id: str) -> int:
        snap = await self.app.aget_state(_config(thread_id))
        msgs = snap.values.get("messages", [])
        if msgs and msgs[-1].content != DONE_TEXT:
            raise AssertionError(f"last message is {msgs[-1].content!r}")
        return len(msgs)

    async def preload(self, thread_id: str, n_messages: int) -> None:
        """``n_messages`` of history of the same shape as tenxgraph's preload, written as one
        checkpoint with ``aupdate_state`` (as if the model node had produced it: the thread ends)."""
        turns, pad = divmod(n_messages, self.messages_per_turn)
        msgs: list[Any] = [HumanMessage(f"earlier message {i}") if i % 2 == 0 else AIMessage(f"earlier message {i}")
                           for i in range(pad)]
        for _ in range(turns):
            msgs.append(HumanMessage(USER_TEXT))
            msgs.append(AIMessage(content=CALLS_TEXT, tool_calls=_calls(TOOL_CALLS)))
            for (cid, name, _), tool in zip(TOOL_CALLS, ("order 4821: 1 x headphones, 129.00 USD, card on file",
                                                          "charged 129.00 USD for order 4821",
                                                          "receipt for order 4821 sent"), strict=True):
                msgs.append(ToolMessage(content=tool, tool_call_id=cid, name=name))
            msgs.append(AIMessage(content=DONE_TEXT))
        await self.app.aupdate_state(_config(thread_id), {"messages": msgs}, as_node="model")

    async def noop_turn(self, n_tools: int) -> float:
        app = self._noop_apps.get(n_tools)
        if app is None:
            spec = [(f"call_{i}", "noop", {"i": i}) for i in range(n_tools)]
            app = self._noop_apps[n_tools] = build(self.saver, _calls(spec), [noop])
        t0 = time.perf_counter()
        await app.ainvoke({"messages": [HumanMessage("go")]}, _config(new_thread("noop")), durability="sync")
        return time.perf_counter() - t0
