"""One process of bench/compare.py: one runtime on one backend, one scenario. Writes its result as
JSON to --out (peak RSS included: each process measures only itself).

    python bench/compare_child.py --system tenx --backend postgres --scenario latency --dsn DSN --out r.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare_common as cc  # noqa: E402


def make_driver(args: argparse.Namespace) -> Any:
    if args.system == "tenx":
        from compare_tenx import TenxDriver

        return TenxDriver(args.backend, args.dsn, args.pool)
    if args.system == "langgraph":
        from compare_langgraph import LangGraphDriver

        return LangGraphDriver(args.backend, args.dsn, args.pool)
    if args.system == "xgraph":
        from compare_xgraph import XGraphDriver

        return XGraphDriver(args.backend, args.dsn, args.pool)
    if args.system == "floor":
        from compare_floor import FloorDriver

        return FloorDriver(args.backend, args.dsn, args.pool, args.floor_commits)
    raise ValueError(args.system)


def versions(system: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    names = {"tenx": ["10xgraph", "pydantic"], "langgraph": ["langgraph", "langgraph-checkpoint",
             "langgraph-checkpoint-postgres", "langchain-core", "psycopg", "psycopg-pool"],
             "xgraph": ["10xgraph", "pydantic", "asyncpg", "redis", "injectq"],
             "floor": ["psycopg", "psycopg-pool"]}[system]
    out = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            pass
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rss_start = cc.rss_now_mb()
    driver = make_driver(args)
    rss_imported = cc.rss_now_mb()
    result: dict[str, Any] = {"system": args.system, "backend": args.backend, "scenario": args.scenario,
                              "versions": versions(args.system), "pool": args.pool}
    cpu = cc.Cpu(args.dsn)
    load_before = cc.machine_load()
    t0 = time.perf_counter()
    if args.scenario == "count":
        result["per_turn"] = await cc.count_per_turn(lambda: make_driver(args), args.dsn, args.turns)
    else:
        await driver.open()
        try:
            if args.scenario == "latency":
                result.update(await cc.latency(
                    driver, cpu, k_short=args.k, short_threads=args.short_threads, k_long=args.k_long,
                    history=[int(h) for h in args.history.split(",")], history_repeats=args.repeats,
                    overhead_repeats=args.repeats,
                ))  # fmt: skip
            elif args.scenario == "short":
                result.update(await cc.short_turns(driver, cpu, k=args.k, threads=args.short_threads))
            elif args.scenario == "throughput":
                result.update(await cc.throughput(driver, cpu, threads=args.threads, k=args.k, repeats=args.tput_repeats))
            else:
                raise ValueError(args.scenario)
        finally:
            await driver.close()
    result["elapsed_s"] = time.perf_counter() - t0
    result["machine_load"] = {"before": load_before, "after": cc.machine_load()}
    result["rss_mb"] = {"start": rss_start, "after_import": rss_imported, "peak": cc.peak_rss_mb()}
    if args.system == "tenx":
        from compare_tenx import runtime_counters

        result["runtime_counters"] = runtime_counters()
    return result


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--system", choices=["tenx", "langgraph", "xgraph", "floor"], required=True)
    p.add_argument("--backend", choices=["memory", "sqlite", "postgres"], required=True)
    p.add_argument("--scenario", choices=["latency", "short", "throughput", "count"], required=True)
    p.add_argument("--dsn", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--pool", type=int, default=10)
    p.add_argument("--k", type=int, default=10, help="turns per thread (latency: the short run)")
    p.add_argument("--short-threads", type=int, default=5, help="threads run one after another at K=--k")
    p.add_argument("--k-long", type=int, default=200)
    p.add_argument("--history", default="10,100,1000")
    p.add_argument("--repeats", type=int, default=7, help="history and tool-overhead repeats")
    p.add_argument("--threads", type=int, default=16, help="throughput: concurrent threads")
    p.add_argument("--tput-repeats", type=int, default=3, help="throughput: rounds (the median is reported)")
    p.add_argument("--turns", type=int, default=20, help="count: turns counted")
    p.add_argument("--floor-commits", type=int, default=6)
    a = p.parse_args()
    res = asyncio.run(main(a))
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
    os.replace(tmp, a.out)
