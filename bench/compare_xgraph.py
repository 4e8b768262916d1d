"""10xGraph 0.10's side of bench/compare.py: the same graph as compare_tenx.py (the public API is
the same, which is the point), run by the real 10xGraph 0.10.0 in its own Python 3.12 venv, on its
``InMemoryCheckpointer`` or its ``PgCheckpointer`` (which needs Redis: TENXGRAPH_TEST_REDIS_URL)."""

from __future__ import annotations

import os
from typing import Any

from compare_common import TOOL_CALLS, TOOLS, USER_TEXT, new_thread
from compare_tenx import TenxDriver, _call, build
from tenxgraph import Message
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, PgCheckpointer


class XGraphDriver(TenxDriver):
    def _config(self, thread_id: str) -> dict[str, Any]:
        # 10xGraph's PgCheckpointer refuses a config without a user_id.
        return {"thread_id": thread_id, "user_id": "bench"}

    def _checkpointer(self) -> Any:
        if self.backend == "memory":
            return InMemoryCheckpointer()
        if self.backend == "postgres":
            redis_url = os.environ.get("TENXGRAPH_TEST_REDIS_URL")
            if not redis_url:
                raise RuntimeError("10xGraph's PgCheckpointer needs Redis: set TENXGRAPH_TEST_REDIS_URL")
            return PgCheckpointer(postgres_dsn=self.dsn, redis_url=redis_url,
                                  pool_config={"min_size": 1, "max_size": self.pool})
        raise ValueError(f"10xGraph 0.10 has no {self.backend} backend in this benchmark")

    async def open(self) -> None:
        self.cp = self._checkpointer()
        if self.backend == "postgres":
            await self.cp.asetup()
        self.app = self._build([_call(*c) for c in TOOL_CALLS], TOOLS)

    def _build(self, calls: list[dict[str, Any]], tools: list[Any]) -> Any:
        # 10xGraph binds a graph's checkpointer in a dependency container, by default the
        # process-wide one, where the first binding wins: a second driver in this process (the
        # commit count opens three) would run on the first one's closed pool. A container per graph.
        from injectq import InjectQ

        return build(self.cp, calls, tools, container=InjectQ())

    async def _turn_pattern(self) -> list[dict[str, Any]]:
        # Run on this driver's own store (see _build): one graph fewer to bind.
        if self._pattern is None:
            # A thread id of its own: Redis outlives the fresh database each process gets, and a
            # cached "pattern" thread of an earlier process made 10xGraph refuse this one's first
            # write (StaleStateError, expected version 5, found 0).
            tid = new_thread("pattern")
            await self.app.ainvoke({"messages": [Message.text_message(USER_TEXT)]}, self._config(tid))
            state = await self.cp.aget_state(self._config(tid))
            self._pattern = [m.model_dump(mode="json") for m in state.context]
        return self._pattern
