"""A quick look at tenxgraph's turn while iterating (not the benchmark of record: that is
bench/run_compare.sh). Median turn at K=10 over a few threads, and the turn after a turn at 10 and
1,000 messages of history, on one backend; `k10_cpu_per_turn_ms` is the process's CPU time
(all threads) over the K=10 turns divided by their number.

    python bench/quick_turn.py --backend memory
    python bench/quick_turn.py --backend postgres --dsn "$TENXGRAPH_TEST_PG_DSN"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_common import history_turns, new_thread  # noqa: E402
from compare_tenx import TenxDriver  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    d = TenxDriver(args.backend, args.dsn, 10)
    await d.open()
    for _ in range(5):  # warm up
        await d.turn(new_thread("w"))
    k10: list[float] = []
    cpu0 = time.process_time()  # every thread of the process: the asyncio loop and tokio's
    for _ in range(args.threads):
        tid = new_thread()
        for _ in range(10):
            t0 = time.perf_counter()
            await d.turn(tid)
            k10.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    out = {"k10_median_ms": statistics.median(k10) * 1e3, "k10_cpu_per_turn_ms": cpu / len(k10) * 1e3}
    for h in () if args.k10_only else (10, 1000):
        cold, warm = await history_turns(d, h, args.repeats)
        out[f"h{h}_first_ms"] = statistics.median(cold) * 1e3
        out[f"h{h}_next_ms"] = statistics.median(warm) * 1e3
    await d.close()
    print(" ".join(f"{k}={v:.2f}" for k, v in out.items()))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="memory", choices=["memory", "sqlite", "postgres"])
    p.add_argument("--dsn", default=os.environ.get("TENXGRAPH_TEST_PG_DSN"))
    p.add_argument("--threads", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--k10-only", action="store_true", help="skip the history turns")
    asyncio.run(main(p.parse_args()))
