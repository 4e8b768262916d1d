"""tenxgraph next to LangGraph 1.2 and a plain-client floor, one turn of the support agent at a
time: latency (1 thread, K=10 and K=200), throughput (16 and 64 threads), cost of a turn at 10,
100 and 1,000 messages of history, per-tool-call overhead, peak RSS, database work per turn.

    bash bench/run_compare.sh            # everything: venv, wheel, Postgres, this script
    python bench/compare.py [--smoke] [--dsn DSN] [--tenx-python PY] [--langgraph-python PY]

Each (runtime, backend, scenario) runs in its own process (bench/compare_child.py), so peak RSS
is per process; each PostgreSQL process gets a fresh database on the same server. PostgreSQL:
--dsn, TENXGRAPH_TEST_PG_DSN, or a throwaway server started here (tenxgraph.testing). Prints one
table and writes it as JSON (bench/results/compare.json) and Markdown (compare.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.parse
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_common as cc  # noqa: E402

SYSTEMS = [  # (key, system, backend, column title)
    ("tenx/memory", "tenx", "memory", "tenxgraph InMemory"),
    ("tenx/sqlite", "tenx", "sqlite", "tenxgraph SQLite"),
    ("tenx/postgres", "tenx", "postgres", "tenxgraph Postgres"),
    ("langgraph/memory", "langgraph", "memory", "LangGraph InMemorySaver"),
    ("langgraph/postgres", "langgraph", "postgres", "LangGraph AsyncPostgresSaver"),
    ("xgraph/memory", "xgraph", "memory", "10xGraph 0.10 InMemory"),
    ("xgraph/postgres", "xgraph", "postgres", "10xGraph 0.10 Postgres+Redis"),
    ("floor/postgres", "floor", "postgres", "floor (psycopg, Postgres)"),
]

# The contract's minimum of durable commits for the benchmark's turn: the input, then one step per
# node (model, tools, model). The floor makes exactly these, whatever any runtime makes.
CONTRACT_COMMITS = 4

FULL = {"k": 10, "short_threads": 5, "k_long": 200, "history": "10,100,1000", "repeats": 7, "threads": [16, 64],
        "tput_repeats": 3, "count_turns": 20, "small_pool": 4, "short_rounds": 3}
SMOKE = {"k": 2, "short_threads": 1, "k_long": 4, "history": "10,100,1000", "repeats": 1, "threads": [2, 4],
         "tput_repeats": 1, "count_turns": 2, "small_pool": None, "short_rounds": 1}


def wait_quiet(max_wait: float = 20.0, window: float = 0.5, idle_share: float = 0.85) -> float:
    """Waits until the machine's CPUs were at least ``idle_share`` idle over two windows in a row,
    at most ``max_wait`` seconds; returns the seconds waited. What the child before left running
    (the server's writes after a DROP DATABASE, autovacuum) once doubled the CPU time of the next
    child's first 250 turns (the in-memory K=10 turn read 0.92 ms in the table, 0.44 ms alone)."""
    def snap() -> tuple[int, int]:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        return vals[3] + vals[4], sum(vals)  # idle + iowait, all

    t0 = time.perf_counter()
    quiet = 0
    prev = snap()
    while quiet < 2 and time.perf_counter() - t0 < max_wait:
        time.sleep(window)
        cur = snap()
        total = cur[1] - prev[1]
        quiet = quiet + 1 if total > 0 and (cur[0] - prev[0]) / total >= idle_share else 0
        prev = cur
    return time.perf_counter() - t0


def with_db(dsn: str, name: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


class Runner:
    def __init__(self, args: argparse.Namespace, dsn: str, cfg: dict[str, Any]) -> None:
        self.args, self.dsn, self.cfg = args, dsn, cfg
        self.results: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.tmp = os.path.join(HERE, "results", ".tmp")
        os.makedirs(self.tmp, exist_ok=True)

    def python_for(self, system: str) -> str | None:
        if system == "xgraph":
            return self.args.xgraph_python
        return self.args.tenx_python if system == "tenx" else self.args.langgraph_python

    def run(self, key: str, system: str, backend: str, scenario: str, **extra: Any) -> dict[str, Any] | None:
        rnd = extra.pop("round", None)
        label = (f"{key}/{scenario}" + (f"/{extra['threads']}" if "threads" in extra else "")
                 + (f"/pool{extra['pool']}" if "pool" in extra else "") + (f"/{rnd}" if rnd is not None else ""))
        out = os.path.join(self.tmp, label.replace("/", "_") + ".json")
        python = self.python_for(system)
        if python is None:
            self.skipped[label] = self.args.xgraph_missing or "no interpreter given"
            print(f"-- {label} not run: {self.skipped[label]}", flush=True)
            return None
        cmd = [python, os.path.join(HERE, "compare_child.py"), "--system", system, "--backend",
               backend, "--scenario", scenario, "--out", out, "--pool", str(self.args.pool),
               "--k", str(self.cfg["k"]), "--short-threads", str(self.cfg["short_threads"]),
               "--k-long", str(self.cfg["k_long"]), "--history", self.cfg["history"],
               "--repeats", str(self.cfg["repeats"]), "--turns", str(self.cfg["count_turns"]),
               "--tput-repeats", str(self.cfg["tput_repeats"])]
        for k, v in extra.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        db = None
        if backend == "postgres":
            db = "cmp_" + label.replace("/", "_").replace("-", "_")
            cc.psql(self.dsn, f'DROP DATABASE IF EXISTS "{db}"')
            cc.psql(self.dsn, f'CREATE DATABASE "{db}"')
            cmd += ["--dsn", with_db(self.dsn, db)]
        waited = wait_quiet() if os.path.exists("/proc/stat") else 0.0
        print(f"-- {label} (waited {waited:.1f}s for a quiet machine) ...", end=" ", flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.child_timeout)
            rc, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, stderr = -1, f"timed out after {self.args.child_timeout}s\n{e.stderr or ''}"
        finally:
            if db is not None:
                try:
                    cc.psql(self.dsn, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                except RuntimeError as e:
                    print(f"(could not drop {db}: {e})", end=" ")
        took = time.perf_counter() - t0
        if rc != 0 or not os.path.exists(out):
            tail = "\n".join(str(stderr).strip().splitlines()[-25:])
            self.errors[label] = f"exit {rc}: {tail}"
            print(f"FAILED ({took:.1f}s)\n{tail}", flush=True)
            return None
        with open(out) as f:
            res = json.load(f)
        os.unlink(out)
        self.results[label] = res
        print(f"{took:.1f}s", flush=True)
        return res

    def run_all(self) -> None:
        threads = self.cfg["threads"]
        # Database work per turn first, for every runtime on Postgres.
        floor_commits = self.floor_commits = CONTRACT_COMMITS
        self.run("tenx/postgres", "tenx", "postgres", "count")
        self.run("langgraph/postgres", "langgraph", "postgres", "count")
        self.run("xgraph/postgres", "xgraph", "postgres", "count")
        self.run("floor/postgres", "floor", "postgres", "count", floor_commits=floor_commits)
        # The K=10 turn, the figure most targets are judged on, in rounds that alternate the
        # runtimes (each round starting one runtime later): a slow stretch of the shared machine
        # lands in one round of several runtimes instead of in the one process that measured a
        # runtime (twice in session 27 a child read 1.26-1.51 ms for a turn that read 0.82-0.87
        # in every other process that day).
        picked = [sy for sy in SYSTEMS if not self.args.only or any(o in sy[0] for o in self.args.only.split(","))]
        for r in range(self.cfg.get("short_rounds") or 0):
            for key, system, backend, _ in picked[r % len(picked):] + picked[:r % len(picked)]:
                extra = {"floor_commits": floor_commits} if system == "floor" else {}
                self.run(key, system, backend, "short", round=r, **extra)
        for key, system, backend, _ in SYSTEMS:
            if self.args.only and not any(o in key for o in self.args.only.split(",")):
                continue
            extra = {"floor_commits": floor_commits} if system == "floor" else {}
            self.run(key, system, backend, "latency", **extra)
            for n in threads:
                self.run(key, system, backend, "throughput", threads=n, **extra)
            # The widest run again with a small pool (session 20): on this 2-core machine more than
            # ~6 busy server connections sent tenxgraph's commits into a convoy (docs/benchmark-
            # profile.md); the other runtimes' figures do not move with the pool.
            small = self.cfg.get("small_pool")
            if small and backend == "postgres" and small != self.args.pool:
                self.run(key, system, backend, "throughput", threads=threads[-1], pool=small, **extra)


# --------------------------------------------------------------------------- the table


def fmt(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def get(d: Any, *path: Any) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def k10(results: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The K=10 figure of ``key``: every turn of its rounds (``{key}/short/N``) pooled, with the
    median of each round and the median of the rounds' CPU per turn; without rounds (an older
    result file), the latency child's own K=10 turns."""
    rounds = sorted((k for k in results if k.startswith(f"{key}/short/")), key=lambda k: int(k.rsplit("/", 1)[1]))
    if not rounds:
        return get(results.get(f"{key}/latency"), "k_short")
    turns = [t for k in rounds for t in get(results[k], "k_short", "turns_ms") or []]
    out: dict[str, Any] = cc.summary([t / 1e3 for t in turns])
    out["round_medians_ms"] = [get(results[k], "k_short", "median_ms") for k in rounds]

    def median_of(field: str) -> float | None:
        vals = [v for k in rounds if (v := get(results[k], "k_short", "cpu", field)) is not None]
        return statistics.median(vals) if vals else None

    out["cpu"] = {"client_ms": median_of("client_ms"), "server_ms": median_of("server_ms")}
    return out


def build_table(results: dict[str, Any], cfg: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    k, k_long = cfg["k"], cfg["k_long"]
    t16, t64 = cfg["threads"]
    hist = [int(h) for h in cfg["history"].split(",")]
    cols = [title for *_, title in SYSTEMS]
    rows: list[list[str]] = []

    def lat(key: str) -> dict[str, Any] | None:
        return results.get(f"{key}/latency")

    def row(name: str, f: Any) -> None:
        rows.append([name] + [f(key) for key, *_ in SYSTEMS])

    row(f"turn, 1 thread, K={k}: median ms (mean), all rounds",
        lambda key: f"{fmt(get(k10(results, key), 'median_ms'))} ({fmt(get(k10(results, key), 'mean_ms'))})"
        if k10(results, key) else "—")
    row(f"turn, 1 thread, K={k}: median ms of each round",
        lambda key: " / ".join(fmt(m) for m in get(k10(results, key), "round_medians_ms") or []) or "—")
    row(f"turn, 1 thread, K={k_long}: median ms (mean)",
        lambda key: f"{fmt(get(lat(key), 'k_long', 'median_ms'))} ({fmt(get(lat(key), 'k_long', 'mean_ms'))})"
        if lat(key) else "—")
    row(f"K={k_long}: mean of the first / last 10 turns, ms",
        lambda key: f"{fmt(get(lat(key), 'k_long', 'first10_mean_ms'))} / {fmt(get(lat(key), 'k_long', 'last10_mean_ms'))}"
        if lat(key) else "—")
    for n in (t16, t64):
        row(f"turns/s, {n} threads (K={k})",
            lambda key, n=n: fmt(get(results.get(f"{key}/throughput/{n}"), "turns_per_s"), 0))
    small = cfg.get("small_pool")
    if small:
        row(f"turns/s, {t64} threads (K={k}), a pool of {small} connections",
            lambda key: fmt(get(results.get(f"{key}/throughput/{t64}/pool{small}"), "turns_per_s"), 0))
    for h in hist:
        row(f"turn at {h:,} msgs of history: median ms, after a turn here (first turn here)",
            lambda key, h=h: f"{fmt(get(lat(key), 'history_warm', str(h), 'median_ms'))} "
                             f"({fmt(get(lat(key), 'history', str(h), 'median_ms'))})" if lat(key) else "—")
    lo, hi = str(hist[0]), str(hist[-1])

    def ratio(key: str, part: str) -> str:
        a, b = get(lat(key), part, lo, "median_ms"), get(lat(key), part, hi, "median_ms")
        return f"{b / a:.2f}x" if a and b else "—"

    row(f"turn cost at {int(hi):,} / {int(lo):,} msgs, after a turn here (first turn here)",
        lambda key: f"{ratio(key, 'history_warm')} ({ratio(key, 'history')})")

    def cpu(res: Any) -> str:
        c = get(res, "cpu")
        if not c:
            return "—"
        server = c.get("server_ms")
        return fmt(c["client_ms"]) + (f" / {fmt(server)}" if server is not None and server > 0.005 else "")

    row(f"CPU ms per turn, 1 thread (K={k}): runtime process / Postgres server (median of the rounds)",
        lambda key: cpu(k10(results, key)))
    row(f"CPU ms per turn, {t64} threads: runtime process / Postgres server",
        lambda key: cpu(results.get(f"{key}/throughput/{t64}")))
    row("tool-call overhead: median µs/call",
        lambda key: fmt(get(lat(key), "tool_overhead", "median_us"), 0))
    row(f"peak RSS MB: 1 thread / {t16} / {t64} threads",
        lambda key: " / ".join(fmt(get(results.get(s), "rss_mb", "peak"), 0)
                               for s in (f"{key}/latency", f"{key}/throughput/{t16}", f"{key}/throughput/{t64}")))

    def per_turn(key: str, field: str, scale: float = 1.0, digits: int = 1) -> str:
        v = get(results.get(f"{key}/count"), "per_turn", field)
        return fmt(v / scale, digits) if v is not None else "—"

    row("Postgres per turn: durable commits (WAL flushes)", lambda key: per_turn(key, "wal_sync"))
    row("Postgres per turn: transactions", lambda key: per_turn(key, "xact_commit"))
    row("Postgres per turn: rows inserted / WAL KB",
        lambda key: f"{per_turn(key, 'tup_inserted')} / {per_turn(key, 'wal_bytes', 1024)}"
        if results.get(f"{key}/count") else "—")
    return ["figure", *cols], rows


def evaluate_targets(results: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    t64 = cfg["threads"][-1]
    hist = [int(h) for h in cfg["history"].split(",")]

    def med(key: str, part: str) -> float | None:
        return get(results.get(f"{key}/latency"), part, "median_ms")

    out: list[dict[str, Any]] = []

    def target(name: str, value: float | None, goal: float, higher_is_better: bool, detail: str,
               absolute: bool = False) -> None:
        # absolute: the value is a count or a time, not a ratio; the table shows it against the goal.
        met = None if value is None else (value >= goal if higher_is_better else value <= goal)
        out.append({"target": name, "value": value, "goal": goal, "met": met, "detail": detail,
                    "absolute": absolute})

    def speedup(a: str, b: str, part: str) -> tuple[float | None, str]:
        if part == "k_short":
            x, y = get(k10(results, a), "median_ms"), get(k10(results, b), "median_ms")
        else:
            x, y = med(a, part), med(b, part)
        if x is None or y is None:
            return None, "missing"
        return x / y, f"{fmt(x)} ms / {fmt(y)} ms"

    k, k_long = cfg["k"], cfg["k_long"]
    v, d = speedup("langgraph/postgres", "tenx/postgres", "k_short")
    target(f"Postgres, 1 thread, K={k}: >= 3x faster than LangGraph (stretch 4x)", v, 3, True, d)
    v, d = speedup("tenx/postgres", "floor/postgres", "k_short")
    target(f"Postgres, 1 thread, K={k}: within 1.6x of the {CONTRACT_COMMITS}-commit floor", v, 1.6, False, d)
    v, d = speedup("xgraph/postgres", "tenx/postgres", "k_short")
    target(f"Postgres, 1 thread, K={k}: >= 12x faster than 10xGraph 0.10", v, 12, True, d)
    v, d = speedup("xgraph/postgres", "tenx/postgres", "k_long")
    target(f"Postgres, 1 thread, K={k_long}: >= 60x faster than 10xGraph 0.10", v, 60, True, d)
    a = get(results.get(f"tenx/postgres/throughput/{t64}"), "turns_per_s")
    b = get(results.get(f"langgraph/postgres/throughput/{t64}"), "turns_per_s")
    target(f"Postgres, {t64} threads: >= 5x LangGraph's turns/s", a / b if a and b else None, 5, True,
           f"{fmt(a, 0)} / {fmt(b, 0)} turns/s" if a and b else "missing")
    small = cfg.get("small_pool")
    if small:
        # Not the target (that is the row above, every runtime at the default pool): the
        # same comparison with every runtime at a pool of `small`.
        a = get(results.get(f"tenx/postgres/throughput/{t64}/pool{small}"), "turns_per_s")
        b = get(results.get(f"langgraph/postgres/throughput/{t64}/pool{small}"), "turns_per_s")
        target(f"(same, both with a pool of {small}) Postgres, {t64} threads: >= 5x LangGraph's turns/s",
               a / b if a and b else None, 5, True, f"{fmt(a, 0)} / {fmt(b, 0)} turns/s" if a and b else "missing")
    v, d = speedup("langgraph/memory", "tenx/memory", "k_short")
    target(f"InMemory, 1 thread, K={k}: >= 6x faster than InMemorySaver (stretch 10x)", v, 6, True, d)
    v, d = speedup("xgraph/memory", "tenx/memory", "k_short")
    target(f"InMemory, 1 thread, K={k}: >= 25x faster than 10xGraph's InMemoryCheckpointer", v, 25, True, d)
    commits = get(results.get("tenx/postgres/count"), "per_turn", "wal_sync")
    target(f"Postgres: durable commits per turn = {CONTRACT_COMMITS}", commits, CONTRACT_COMMITS, False,
           f"{fmt(commits, 1)} per turn" if commits is not None else "missing", absolute=True)
    cpu_ms = get(k10(results, "tenx/postgres"), "cpu", "client_ms")
    target("runtime CPU per turn, 1 thread, Postgres <= 1.2 ms", cpu_ms, 1.2, False,
           f"{fmt(cpu_ms)} ms" if cpu_ms is not None else "missing", absolute=True)
    for key, _, backend, title in SYSTEMS[:3]:
        # Judged on a turn that follows a turn of the same thread in this process (the steady
        # state of a conversation served by one worker); the first turn in a process, which loads
        # the whole thread, is shown next to it.
        h = get(results.get(f"{key}/latency"), "history_warm") or {}
        c = get(results.get(f"{key}/latency"), "history") or {}
        lo, hi = get(h, str(hist[0]), "median_ms"), get(h, str(hist[-1]), "median_ms")
        clo, chi = get(c, str(hist[0]), "median_ms"), get(c, str(hist[-1]), "median_ms")
        cold = f"; first turn in the process: {fmt(chi)} / {fmt(clo)} ms = {chi / clo:.2f}x" if clo and chi else ""
        target(f"History ({title}): turn at {hist[-1]:,} msgs <= 1.3x turn at {hist[0]:,}",
               hi / lo if lo and hi else None, 1.3, False,
               f"{fmt(hi)} ms / {fmt(lo)} ms{cold}" if lo and hi else "missing")
    for key, _, backend, title in SYSTEMS[:3]:
        # Issue 16's cold-load target: without sticky routing every turn can be a thread's first
        # in its process, so the first turn at the longest history is judged against the steady
        # turn at the shortest one.
        h = get(results.get(f"{key}/latency"), "history_warm") or {}
        c = get(results.get(f"{key}/latency"), "history") or {}
        lo, chi = get(h, str(hist[0]), "median_ms"), get(c, str(hist[-1]), "median_ms")
        target(f"First turn in a process ({title}): at {hist[-1]:,} msgs <= 2x a turn at {hist[0]:,}",
               chi / lo if lo and chi else None, 2, False,
               f"{fmt(chi)} ms / {fmt(lo)} ms" if lo and chi else "missing")
    a = get(results.get(f"tenx/postgres/throughput/{t64}"), "rss_mb", "peak")
    b = get(results.get(f"langgraph/postgres/throughput/{t64}"), "rss_mb", "peak")
    target(f"Peak RSS, {t64} threads (Postgres): tenxgraph below LangGraph", a / b if a and b else None, 1.0, False,
           f"{fmt(a, 0)} MB / {fmt(b, 0)} MB" if a and b else "missing")
    return out


def busiest_moment(results: dict[str, Any]) -> dict[str, float]:
    """The highest load average and CPU / IO pressure any child saw before or after its run."""
    worst: dict[str, float] = {}
    for r in results.values():
        for when in ("before", "after"):
            for k, v in (get(r, "machine_load", when) or {}).items():
                worst[k] = max(worst.get(k, 0.0), v)
    return worst


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def targets_markdown(targets: list[dict[str, Any]]) -> str:
    lines = ["| target | measured | ratio | met |", "|---|---|---|---|"]
    for t in targets:
        met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
        if t["value"] is None:
            ratio = "—"
        elif t.get("absolute"):
            ratio = f"{fmt(t['value'] / t['goal'])}x the goal"
        else:
            ratio = f"{fmt(t['value'])}x"
        lines.append(f"| {t['target']} | {t['detail']} | {ratio} | {met} |")
    return "\n".join(lines)


README_BEGIN = "<!-- compare:begin (bench/compare.py --update-readme writes this block) -->"
README_END = "<!-- compare:end -->"


def update_readme(table_md: str, targets_md: str, report: dict[str, Any]) -> None:
    path = os.path.join(os.path.dirname(HERE), "docs", "benchmarks.md")
    with open(path) as f:
        text = f.read()
    if README_BEGIN not in text or README_END not in text:
        print("docs/benchmarks.md has no compare markers: not updated", file=sys.stderr)
        return
    versions = {**(get(report, "results", "langgraph/postgres/latency", "versions") or {}),
                **(get(report, "results", "tenx/postgres/latency", "versions") or {})}
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("10xgraph", "langgraph",
                      "langgraph-checkpoint-postgres", "psycopg", "python"))
    load = report.get("machine_load_worst") or {}
    block = "\n".join([
        README_BEGIN,
        f"`{os.environ.get('BENCH_COMMAND') or 'python bench/compare.py ' + ' '.join(sys.argv[1:])}`: "
        f"run of {time.strftime('%Y-%m-%d')}, {report['machine']['cpus']} CPUs, PostgreSQL "
        f"{report['postgres']['server_version']}, {shown}; pool {report['pool']} connections for every "
        f"runtime; {report['elapsed_s']:.0f} s. Worst load seen by a process: load average "
        f"{load.get('loadavg_1m', float('nan')):.1f}, CPU pressure {load.get('cpu_pressure_some_avg10', float('nan')):.0f}%, "
        f"IO pressure {load.get('io_pressure_some_avg10', float('nan')):.0f}%.",
        "",
        table_md,
        "",
        targets_md,
        README_END,
    ])
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    with open(path, "w") as f:
        f.write(text[:start] + block + text[end:])
    print(f"updated {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="K=2, 2 and 4 threads, 1 repeat: checks it works")
    p.add_argument("--dsn", default=os.environ.get("TENXGRAPH_TEST_PG_DSN"))
    p.add_argument("--tenx-python", default=sys.executable)
    p.add_argument("--langgraph-python", default=sys.executable, help="also runs the floor (needs psycopg)")
    p.add_argument("--xgraph-python", default=None,
                   help="a Python 3.12+ with 10xgraph==0.10.0, asyncpg and redis (scripts/oracle_venv.py)")
    p.add_argument("--xgraph-missing", default=None, help="why --xgraph-python is not given (shown in the table)")
    p.add_argument("--pool", type=int, default=10, help="connection pool size of every runtime (tenxgraph's default)")
    p.add_argument("--out", default=None, help="JSON output (default bench/results/compare[_smoke].json)")
    p.add_argument("--only", default=None, help="comma-separated substrings of runtime keys (debugging)")
    p.add_argument("--child-timeout", type=float, default=900)
    p.add_argument("--update-readme", action="store_true",
                   help="replace the table between the compare markers in docs/benchmarks.md with this run's")
    args = p.parse_args()
    cfg = SMOKE if args.smoke else FULL
    out = args.out or os.path.join(HERE, "results", "compare_smoke.json" if args.smoke else "compare.json")

    server = None
    dsn = args.dsn
    if not dsn:
        from tenxgraph.testing.services import start_postgres

        server = start_postgres()
        dsn = server.dsn
    load = cc.machine_load()
    if load.get("loadavg_1m", 0) > 1.0:
        print(f"warning: the machine is busy ({load}): timings will be noisy", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        pg = dict(zip(["server_version", "fsync", "synchronous_commit", "shared_buffers", "wal_sync_method"],
                      cc.psql(dsn, "SELECT current_setting('server_version'), current_setting('fsync'), "
                                   "current_setting('synchronous_commit'), current_setting('shared_buffers'), "
                                   "current_setting('wal_sync_method')").split("|"), strict=True))
        runner = Runner(args, dsn, cfg)
        runner.run_all()
    finally:
        if server is not None:
            server.stop()
    total = time.perf_counter() - t0
    header, rows = build_table(runner.results, cfg)
    targets = evaluate_targets(runner.results, cfg)
    table_md, targets_md = markdown(header, rows), targets_markdown(targets)
    print()
    print(table_md)
    print()
    print(targets_md)
    busiest = busiest_moment(runner.results)
    print(f"\nfloor commits per turn: {runner.floor_commits}; pool size {args.pool}; children took {total:.0f}s; "
          f"machine load, worst seen by a child: {busiest}")
    report = {
        "mode": "smoke" if args.smoke else "full",
        "config": cfg,
        "pool": args.pool,
        "floor_commits_per_turn": runner.floor_commits,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "postgres": pg,
        "machine_load_at_start": load,
        "machine_load_worst": busiest,
        "elapsed_s": total,
        "table": {"header": header, "rows": rows},
        "targets": targets,
        "results": runner.results,
        "errors": runner.errors,
        "not_run": runner.skipped,
    }
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(table_md + "\n\n" + targets_md + "\n")
    for label, why in runner.skipped.items():
        print(f"not run: {label}: {why}")
    print(f"wrote {out}")
    if args.update_readme:
        update_readme(table_md, targets_md, report)
    if runner.errors:
        print(f"FAILED: {', '.join(runner.errors)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
