"""Cost of one durable step at 10 and at 1,000 messages of history (SQLite).

    python bench/step_cost.py [--repeats 7] [--json bench/results/step_cost.json]

A step here is one node that appends one message, followed by the durable commit of the state and
that message. Per-step time = (run of 45 steps - run of 5 steps) / 40, each on a fresh thread
prefilled with the history, so loading the history (once per run) cancels out. Medians over the
repeats. The contract: the two figures stay within 1.3x of each other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer

SHORT, LONG = 5, 45


class BenchState(AgentState):
    remaining: int = 0


async def tick(state: BenchState) -> Message:
    state.remaining -= 1
    return Message.text_message("ok " * 20, role="assistant")


def route(state: BenchState) -> str:
    return "tick" if state.remaining > 0 else END


def build(cp: SqliteCheckpointer):
    g = StateGraph(BenchState)
    g.add_node("tick", tick)
    g.add_edge(START, "tick")
    g.add_conditional_edges("tick", route)
    return g.compile(checkpointer=cp)


async def prefill(cp: SqliteCheckpointer, thread: str, history: int) -> None:
    state = BenchState()
    for i in range(history):
        role = "user" if i % 2 == 0 else "assistant"
        state.context.append(Message.text_message(f"message {i} " + "lorem ipsum " * 8, role=role))
    await cp.aput_state({"thread_id": thread}, state)


async def timed_run(app, cp: SqliteCheckpointer, history: int, steps: int) -> float:
    thread = f"bench-{uuid.uuid4()}"
    await prefill(cp, thread, history)
    t0 = time.perf_counter()
    await app.ainvoke(
        {"messages": [Message.text_message("go")], "state": {"remaining": steps}},
        {"thread_id": thread, "recursion_limit": steps + 5},
    )
    return time.perf_counter() - t0


async def measure(history: int, repeats: int, synchronous: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        cp = SqliteCheckpointer(os.path.join(d, "bench.db"), synchronous=synchronous)
        app = build(cp)
        await timed_run(app, cp, history, SHORT)  # warm-up
        per_step = []
        for _ in range(repeats):
            short = await timed_run(app, cp, history, SHORT)
            long = await timed_run(app, cp, history, LONG)
            per_step.append((long - short) / (LONG - SHORT))
        return {"median_ms": statistics.median(per_step) * 1e3, "min_ms": min(per_step) * 1e3}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = {}
    for sync in ("full", "normal"):
        for history in (10, 1000):
            rows[f"{sync}/{history}"] = await measure(history, args.repeats, sync)
    print(f"{'synchronous':<12}{'history':>8}{'median ms/step':>16}{'min':>8}")
    for key, r in rows.items():
        sync, history = key.split("/")
        print(f"{sync:<12}{history:>8}{r['median_ms']:>16.3f}{r['min_ms']:>8.3f}")
    ratios = {s: rows[f"{s}/1000"]["median_ms"] / rows[f"{s}/10"]["median_ms"] for s in ("full", "normal")}
    for s, r in ratios.items():
        print(f"ratio 1000/10 messages ({s}): {r:.2f}x")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratios": ratios, "python": platform.python_version(),
                       "repeats": args.repeats}, f, indent=2)


if __name__ == "__main__":
    asyncio.run(main())
