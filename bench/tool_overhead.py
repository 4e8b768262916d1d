"""The runtime's own overhead per tool call, ledger lookup and record included.

    python bench/tool_overhead.py [--repeats 7] [--json bench/results/tool_overhead.json]

One turn = model -> tools -> model with N no-op async tools in one assistant message. The
overhead per call is (turn with 21 calls - turn with 1 call) / 20, minus the cost of calling the
20 tool coroutines directly in Python (measured in the same run). Each turn runs on a fresh thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer

FEW, MANY = 1, 21


async def noop(i: int) -> str:
    """Does nothing."""
    return "ok"


def build(cp, n: int):
    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            m = Message.text_message("calling", role="assistant")
            m.tools_calls = [
                {"id": f"call_{i}", "type": "function", "function": {"name": "noop", "arguments": json.dumps({"i": i})}}
                for i in range(n)
            ]
            return m
        return Message.text_message("done", role="assistant")

    g = StateGraph()
    g.add_node("model", model)
    g.add_node("tools", ToolNode([noop]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END)
    g.add_edge("tools", "model")
    return g.compile(checkpointer=cp)


async def turn(app) -> float:
    t0 = time.perf_counter()
    await app.ainvoke({"messages": [Message.text_message("go")]}, {"thread_id": str(uuid.uuid4())})
    return time.perf_counter() - t0


async def direct(n: int) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(noop(i) for i in range(n)))
    return time.perf_counter() - t0


async def measure(make_cp, repeats: int) -> dict[str, float]:
    cp = make_cp()
    few, many = build(cp, FEW), build(cp, MANY)
    for _ in range(3):
        await turn(few), await turn(many)
    per_call = []
    for _ in range(repeats):
        t_few, t_many = await turn(few), await turn(many)
        base = await direct(MANY - FEW)
        per_call.append((t_many - t_few - base) / (MANY - FEW))
    return {"median_us": statistics.median(per_call) * 1e6, "min_us": min(per_call) * 1e6}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    d = tempfile.mkdtemp(prefix="tenx-bench-")
    backends = {
        "memory": InMemoryCheckpointer,
        "sqlite (synchronous=normal)": lambda: SqliteCheckpointer(os.path.join(d, "n.db"), synchronous="normal"),
        "sqlite (synchronous=full)": lambda: SqliteCheckpointer(os.path.join(d, "f.db")),
    }
    rows = {name: await measure(make, args.repeats) for name, make in backends.items()}
    print(f"{'backend':<30}{'median us/call':>16}{'min':>10}")
    for name, r in rows.items():
        print(f"{name:<30}{r['median_us']:>16.1f}{r['min_us']:>10.1f}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "repeats": args.repeats}, f, indent=2)


if __name__ == "__main__":
    asyncio.run(main())
