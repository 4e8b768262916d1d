"""Cost of one durable step at 10 and at 1,000 messages of history: SQLite and PostgreSQL, next to
the floor (the same number of one-row commits by a plain client, pgbench, on the same server).

    python bench/step_cost.py [--repeats 7] [--json bench/results/step_cost.json] [--no-postgres]

PostgreSQL: TENXGRAPH_TEST_PG_DSN, or a throwaway server started here (tenxgraph.testing).

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
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer

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


async def measure(history: int, repeats: int, make_cp) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        cp = make_cp(d)
        app = build(cp)
        await timed_run(app, cp, history, SHORT)  # warm-up
        per_step = []
        for _ in range(repeats):
            short = await timed_run(app, cp, history, SHORT)
            long = await timed_run(app, cp, history, LONG)
            per_step.append((long - short) / (LONG - SHORT))
        return {"median_ms": statistics.median(per_step) * 1e3, "min_ms": min(per_step) * 1e3}


def pg_floor(server, seconds: float = 5.0) -> float:
    """Median-free pgbench latency (ms) of a one-row INSERT of a step-sized JSON row, autocommit."""
    import subprocess

    from tenxgraph.testing.services import find_pg_binary

    row = json.dumps({"state": "x" * 300, "message": "y" * 300})
    server.psql("CREATE TABLE IF NOT EXISTS bench_floor (id BIGSERIAL PRIMARY KEY, data JSONB NOT NULL)")
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(f"INSERT INTO bench_floor (data) VALUES ('{row}');\n")
        script = f.name
    os.chmod(script, 0o644)
    host, port, db = "127.0.0.1", str(server.port), server.dbname
    out = subprocess.run(
        [find_pg_binary("pgbench"), "-n", "-h", host, "-p", port, "-U", "postgres", "-c", "1", "-T", str(int(seconds)),
         "-f", script, db],
        capture_output=True, text=True, check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("latency average"))
    return float(line.split("=")[1].split()[0])


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None)
    p.add_argument("--no-postgres", action="store_true")
    args = p.parse_args()
    backends = {
        "sqlite full": lambda d: SqliteCheckpointer(os.path.join(d, "bench.db"), synchronous="full"),
        "sqlite normal": lambda d: SqliteCheckpointer(os.path.join(d, "bench.db"), synchronous="normal"),
    }
    server = None
    if not args.no_postgres:
        from tenxgraph.testing.services import start_postgres

        server = start_postgres()
        backends["postgres"] = lambda d: PgCheckpointer(server.dsn, schema=f"b_{uuid.uuid4().hex[:12]}")
    rows: dict[str, dict[str, float]] = {}
    try:
        for name, make in backends.items():
            for history in (10, 1000):
                rows[f"{name}/{history}"] = await measure(history, args.repeats, make)
        floor = pg_floor(server) if server is not None else None
    finally:
        if server is not None:
            server.stop()
    print(f"{'backend':<16}{'history':>8}{'median ms/step':>16}{'min':>8}")
    for key, r in rows.items():
        name, history = key.split("/")
        print(f"{name:<16}{history:>8}{r['median_ms']:>16.3f}{r['min_ms']:>8.3f}")
    ratios = {n: rows[f"{n}/1000"]["median_ms"] / rows[f"{n}/10"]["median_ms"] for n in backends}
    for n, r in ratios.items():
        print(f"ratio 1000/10 messages ({n}): {r:.2f}x")
    if floor is not None:
        print(f"floor: one-row INSERT commit by pgbench on the same server: {floor:.3f} ms "
              f"(postgres step at 10 msgs = {rows['postgres/10']['median_ms'] / floor:.2f}x floor)")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratios": ratios, "pg_floor_ms": floor, "python": platform.python_version(),
                       "repeats": args.repeats}, f, indent=2)


if __name__ == "__main__":
    asyncio.run(main())
