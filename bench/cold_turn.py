"""The first turn of a thread in a process (a cold load: no live state, the whole thread is
read) against the turn after it, at 10 and 1,000 messages of history, on one backend. Reports
medians of wall time and of process CPU time per turn (`time.process_time()`: the asyncio loop
and tokio's threads), and the ratios first-at-1,000 / first-at-10. On a loaded machine the CPU
ratio is the steadier one. Not the benchmark of record (bench/run_compare.sh).

    python bench/cold_turn.py --backend memory --repeats 11
    python bench/cold_turn.py --backend postgres --dsn "$TENXGRAPH_TEST_PG_DSN"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_common import new_thread  # noqa: E402
from compare_tenx import TenxDriver  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    d = TenxDriver(args.backend, args.dsn, 10)
    await d.open()
    for _ in range(5):  # warm up
        await d.turn(new_thread("w"))
    sizes = (10, 1000)
    res: dict[int, dict[str, list[float]]] = {h: {"first": [], "first_cpu": [], "next": [], "next_cpu": []} for h in sizes}
    for _ in range(args.repeats):
        for h in sizes:  # interleaved, so both sizes see the same neighbours
            tid = new_thread("h")
            await d.preload(tid, h)
            for k in ("first", "next"):
                c0, t0 = time.process_time(), time.perf_counter()
                await d.turn(tid)
                res[h][k].append(time.perf_counter() - t0)
                res[h][k + "_cpu"].append(time.process_time() - c0)
    await d.close()
    out = {f"h{h}_{k}_ms": statistics.median(v) * 1e3 for h, r in res.items() for k, v in r.items()}
    out["ratio_wall"] = out["h1000_first_ms"] / out["h10_first_ms"]
    out["ratio_cpu"] = out["h1000_first_cpu_ms"] / out["h10_first_cpu_ms"]
    print(args.backend, " ".join(f"{k}={v:.2f}" for k, v in out.items()))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="memory", choices=["memory", "sqlite", "postgres"])
    p.add_argument("--dsn", default=os.environ.get("TENXGRAPH_TEST_PG_DSN"))
    p.add_argument("--repeats", type=int, default=11)
    asyncio.run(main(p.parse_args()))
