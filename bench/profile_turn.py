"""Profile tenxgraph turns (the benchmark's turn) at a given history size, with py-spy or perf
attached only while the timed turns run (not during the preload).

    .venv-bench/bin/pip install py-spy
    .venv-bench/bin/python bench/profile_turn.py --backend memory --history 1000 --turns 150 --py-spy /tmp/h1000.svg
    .venv-bench/bin/python bench/profile_turn.py --backend postgres --dsn DSN --turns 800 --perf /tmp/pg.data
    perf report -i /tmp/pg.data --no-children --sort comm,dso

py-spy sees only threads that hold a Python thread state (the asyncio loop, and tokio workers
while they run Python); perf sees everything, Rust and the kernel included, but no Python frames.
--py-spy-format raw writes collapsed stacks for your own aggregation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare_common as cc  # noqa: E402
from compare_tenx import TenxDriver  # noqa: E402


def attach(args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    pid = str(os.getpid())
    if args.py_spy:
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        cmd = [spy, "record", "--pid", pid, *(["--native"] if args.native else []), "--threads", "-r", "400",
               "-f", args.py_spy_format, "-o", args.py_spy]
    elif args.perf:
        cmd = ["perf", "record", "-F", "999", "-g", "-p", pid, "-o", args.perf]
    else:
        return None
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # let it attach before the timed turns
    return proc


async def main(args: argparse.Namespace) -> None:
    d = TenxDriver(args.backend, args.dsn, args.pool)
    await d.open()
    for _ in range(5):
        await d.turn(cc.new_thread("warm"))
    tids = []
    for _ in range(args.turns):
        tid = cc.new_thread()
        if args.history:
            await d.preload(tid, args.history)
        tids.append(tid)
    prof = attach(args)
    lat: list[float] = []
    cpu0 = cc.Cpu.own()
    for tid in tids:
        await cc.run_thread(d, tid, args.per_thread, lat)
    cpu = (cc.Cpu.own() - cpu0) / len(lat) * 1e3
    if prof is not None:
        prof.send_signal(signal.SIGINT)  # both write their output on SIGINT
        prof.wait(timeout=120)
    await d.close()
    s = cc.summary(lat)
    print(f"{args.backend}, history {args.history}: {s['n']} turns, median {s['median_ms']:.2f} ms, "
          f"mean {s['mean_ms']:.2f} ms, CPU {cpu:.2f} ms/turn (profiler overhead included when attached)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["memory", "sqlite", "postgres"], default="memory")
    p.add_argument("--dsn", default=os.environ.get("TENXGRAPH_TEST_PG_DSN"))
    p.add_argument("--pool", type=int, default=10)
    p.add_argument("--history", type=int, default=10, help="messages preloaded into each thread")
    p.add_argument("--turns", type=int, default=300, help="threads, each fresh (preloaded with --history)")
    p.add_argument("--per-thread", type=int, default=1,
                   help="turns on each thread: 10 profiles the benchmark's K=10 figure, 1 a thread's first turn")
    p.add_argument("--py-spy", default=None, help="output file (flamegraph SVG by default)")
    p.add_argument("--py-spy-format", default="flamegraph", choices=["flamegraph", "raw", "speedscope"])
    p.add_argument("--native", action="store_true",
                   help="py-spy also unwinds native frames (Rust, C): far slower, and it stalls a busy process")
    p.add_argument("--perf", default=None, help="perf.data output")
    asyncio.run(main(p.parse_args()))
