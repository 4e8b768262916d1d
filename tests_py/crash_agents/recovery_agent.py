"""A recovering worker for tests_py/test_recovery.py: the lease agent's support graph (three
tools per "charge order N" turn, effects counted in $TENXGRAPH_EFFECTS), compiled with
``recover_on_start`` so entering ``async with app`` starts a recovery pass.

    recovery_agent.py worker DB BARRIER_DIR INDEX WORKERS CONCURRENCY
        Opens DB (SQLite path or postgresql:// DSN), meets the other WORKERS at a file barrier,
        then recovers; prints one JSON line {"pid", "report"}.

``RECOVERY_MODEL_SLEEP`` (s) slows every model call, so two workers' resumes overlap.
``build`` / ``build_broken`` are also factories for the crash kit and ``tenxgraph recover``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tests_py.crash_agents import lease_agent
from tests_py.crash_agents.lease_agent import charge_tool, lookup_order, open_db, send_receipt
from tests_py.kit_agents.support import route


async def slow_model(state: AgentState) -> Message:
    await asyncio.sleep(float(os.environ.get("RECOVERY_MODEL_SLEEP", "0")))
    return await lease_agent.model(state)


def build(checkpointer: Any, **compile_kw: Any) -> Any:
    graph = StateGraph(AgentState)
    graph.add_node("model", slow_model)
    graph.add_node("tools", ToolNode([lookup_order, charge_tool("idempotent"), send_receipt]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer, **compile_kw)


def _meet(barrier: Path, index: int, workers: int) -> None:
    (barrier / f"ready.{index}").touch()
    deadline = time.monotonic() + 60
    while not all((barrier / f"ready.{i}").exists() for i in range(workers)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker {index}: the other workers never reached the barrier")
        time.sleep(0.001)


async def worker(db: str, barrier: Path, index: int, workers: int, concurrency: int) -> dict[str, Any]:
    cp = open_db(db)
    await cp.aget_state({"thread_id": "warm-up"})  # connected (and migrated) before the race
    _meet(barrier, index, workers)
    async with build(cp, recover_on_start={"concurrency": concurrency}) as app:
        assert app.recovery is not None
        report = await app.recovery
    return {"pid": os.getpid(), "report": report.model_dump(mode="json")}


def main(argv: list[str]) -> None:
    if argv[0] != "worker":
        raise SystemExit(f"unknown mode {argv[0]!r}")
    db, barrier, index, workers, concurrency = argv[1:6]
    out = asyncio.run(worker(db, Path(barrier), int(index), int(workers), int(concurrency)))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])


def build_broken(checkpointer: Any) -> Any:
    """The same topology whose tool node always fails: a resume of a thread that died before
    its tools ran raises NodeError (``tenxgraph recover`` exits 1)."""

    async def tools(state: AgentState) -> Message:
        raise RuntimeError("the payment provider is down")

    graph = StateGraph(AgentState)
    graph.add_node("model", slow_model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)
