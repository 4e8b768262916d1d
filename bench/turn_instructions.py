"""Instructions per turn, counted by valgrind (callgrind), for A/B comparisons that the shared
machine's noise cannot blur: wall-clock medians of two identical runs here differ by up to 2x,
instruction counts by well under 1%.

    .venv-bench/bin/python bench/turn_instructions.py --backend memory
    PYTHONPATH=/tmp/ab/base .venv-bench/bin/python bench/turn_instructions.py   # another build

It runs the benchmark's turn (bench/compare_tenx.py: threads of 10 turns) in two child processes
under callgrind, one with ``--turns`` more turns than the other, and divides the difference of
their instruction counts by that number: start-up, imports and the warm-up turns cancel out. The
count covers every instruction of the process (Python, pydantic-core, the Rust core, libc), not
the time a cache miss or a system call costs; on Postgres the server's work is not counted at all.
Use it to compare builds, and the benchmark (bench/run_compare.sh) for speed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

CHILD = """
import asyncio, os, sys
sys.path.insert(0, {bench!r})
import compare_common as cc
from compare_tenx import TenxDriver

async def main(n, backend):
    d = TenxDriver(backend, os.environ.get("TENXGRAPH_TEST_PG_DSN"), 10)
    await d.open()
    for _ in range(n // 10):
        tid = cc.new_thread("ins")
        for _ in range(10):
            await d.turn(tid)
    await d.close()

asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
"""


def instructions(turns: int, backend: str) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    bench = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable, "-c",
             CHILD.format(bench=bench), str(turns), backend],
            capture_output=True, text=True, check=True)
    m = re.search(r"Collected : (\d+)", out.stderr)
    if m is None:
        raise SystemExit(f"no instruction count in callgrind's output:\n{out.stderr[-2000:]}")
    return int(m.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["memory", "sqlite", "postgres"], default="memory")
    p.add_argument("--warm", type=int, default=120, help="turns of the shorter run (a multiple of 10)")
    p.add_argument("--turns", type=int, default=100, help="extra turns of the longer run (a multiple of 10)")
    args = p.parse_args()
    short = instructions(args.warm, args.backend)
    long = instructions(args.warm + args.turns, args.backend)
    per_turn = (long - short) / args.turns
    print(f"{args.backend}: {per_turn / 1e6:.3f} M instructions per turn "
          f"({args.warm} turns: {short:,}; {args.warm + args.turns}: {long:,})")


if __name__ == "__main__":
    main()
