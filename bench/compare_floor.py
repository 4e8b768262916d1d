"""The floor of bench/compare.py: what a plain client (psycopg 3, async, autocommit) pays for a
number of durable commits per turn, one transaction (one INSERT statement) each, with rows of the
sizes tenxgraph writes. No graph, no Python node, no tool: the cost of the database alone.

bench/compare.py runs it at the contract's minimum, 4 commits (``CONTRACT_COMMITS``): the input
(state row + the user message), the model step (state + the assistant message with three tool
calls), the tools step (state + three tool messages, the ledger rows in the same transaction) and
the final model step (state + the answer). ``--floor-commits`` above 4 splits the ledger rows into
transactions of their own, as tenxgraph writes them (the moment the tools return).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from compare_common import CALLS_TEXT, DONE_TEXT, ORDER, TOOL_CALLS, USER_TEXT

_SQL_INSERT = "INSERT INTO floor_rows (thread_id, data) SELECT %s, d::jsonb FROM unnest(%s::text[]) AS d"


def _text(role: str, text: str, **extra: Any) -> dict[str, Any]:
    # The shape tenxgraph stores a message in (tenxgraph.Message.model_dump(mode="json")).
    return {"message_id": str(uuid.uuid4()), "role": role,
            "content": [{"type": "text", "text": text, "annotations": []}], "delta": False,
            "tools_calls": extra.get("tools_calls"), "reasoning": None, "timestamp": time.time(),
            "metadata": {}, "usages": None, "raw": None, "parsed_content": None}


def _tool_result(call_id: str, name: str, args: dict[str, Any], output: str) -> dict[str, Any]:
    return {"message_id": str(uuid.uuid4()), "role": "tool",
            "content": [{"type": "tool_result", "call_id": call_id, "output": output, "is_error": False,
                         "status": "completed"}],
            "delta": False, "tools_calls": None, "reasoning": None, "timestamp": time.time(),
            "metadata": {"function_name": name, "function_argument": args, "tool_call_id": call_id},
            "usages": None, "raw": None, "parsed_content": None}


def _state(node: str, step: int, status: str) -> dict[str, Any]:
    return {"context_summary": None,
            "execution_meta": {"current_node": node, "step": step, "status": status, "interrupted_node": None,
                               "interrupt_reason": None, "interrupt_data": None, "thread_id": "t-0123456789abcdef",
                               "stop_current_execution": "none", "internal_data": {}},
            "__state_meta__": {"format": 1, "class": "AgentState"}}


def turn_commits(n_commits: int) -> list[list[str]]:
    """The rows of each commit of one turn, as JSON text."""
    calls = [{"id": c, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for c, n, a in TOOL_CALLS]
    outputs = [f"order {ORDER}: 1 x headphones, 129.00 USD, card on file", "charged 129.00 USD for order 4821",
               "receipt for order 4821 sent"]
    results = [_tool_result(c, n, a, o) for (c, n, a), o in zip(TOOL_CALLS, outputs, strict=True)]
    ledger = [{"__kind__": "message", "value": r} for r in results]
    tools_step = [_state("model", 2, "running"), *results]
    if n_commits <= 4:
        # The contract's minimum: the tool node's ledger rows commit with its step.
        return [[json.dumps(r) for r in rows] for rows in [
            [_state("model", 0, "running"), _text("user", USER_TEXT)],
            [_state("tools", 1, "running"), _text("assistant", CALLS_TEXT, tools_calls=calls)],
            [*tools_step, *ledger],
            [_state("__end__", 3, "completed"), _text("assistant", DONE_TEXT)],
        ]]
    n_ledger = max(1, n_commits - 4)
    # Ledger rows split like the group commit: the first result alone, then the rest together.
    ledger_groups = [ledger[:1], ledger[1:]] if n_ledger == 2 else [ledger[i::n_ledger] for i in range(n_ledger)]
    commits = [
        [_state("model", 0, "running"), _text("user", USER_TEXT)],
        [_state("tools", 1, "running"), _text("assistant", CALLS_TEXT, tools_calls=calls)],
        *ledger_groups,
        tools_step,
        [_state("__end__", 3, "completed"), _text("assistant", DONE_TEXT)],
    ]
    return [[json.dumps(r) for r in rows] for rows in commits if rows]


class FloorDriver:
    messages_per_turn = 6

    def __init__(self, backend: str, dsn: str | None, pool: int, n_commits: int = 6) -> None:
        if backend != "postgres":
            raise ValueError("the floor runs on PostgreSQL only")
        self.dsn, self.pool_size = dsn, pool
        self.commits = turn_commits(n_commits)
        self.pool: Any = None

    async def open(self) -> None:
        from psycopg_pool import AsyncConnectionPool

        self.pool = AsyncConnectionPool(self.dsn, min_size=1, max_size=self.pool_size, open=False,
                                        kwargs={"autocommit": True})
        await self.pool.open(wait=True)
        async with self.pool.connection() as c:
            await c.execute("CREATE TABLE IF NOT EXISTS floor_rows (id BIGSERIAL PRIMARY KEY, "
                            "thread_id TEXT NOT NULL, data JSONB NOT NULL)")
            await c.execute("CREATE INDEX IF NOT EXISTS floor_rows_thread ON floor_rows (thread_id, id)")

    async def close(self) -> None:
        await self.pool.close()

    async def turn(self, thread_id: str) -> None:
        for rows in self.commits:
            async with self.pool.connection() as c:  # autocommit: one statement, one transaction
                await c.execute(_SQL_INSERT, (thread_id, rows))

    async def message_count(self, thread_id: str) -> int:
        async with self.pool.connection() as c:
            cur = await c.execute("SELECT count(*) FROM floor_rows WHERE thread_id = %s AND data ? 'role'",
                                  (thread_id,))
            row = await cur.fetchone()
        return int(row[0])

    async def preload(self, thread_id: str, n_messages: int) -> None:
        rows = [json.dumps(_text("user" if i % 2 == 0 else "assistant", f"earlier message {i}"))
                for i in range(n_messages)]
        async with self.pool.connection() as c:
            await c.execute(_SQL_INSERT, (thread_id, rows))

    async def noop_turn(self, n_tools: int) -> None:
        return None  # no runtime, no overhead
