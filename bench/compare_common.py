"""Shared by the processes of bench/compare.py: the turn's script, timing, statistics, memory and
PostgreSQL counters. Standard library only, so every virtual environment can import it.

One turn = a user message -> model -> tools (three calls in one assistant message) -> model -> END.
"""

from __future__ import annotations

import asyncio
import glob
import os
import resource
import shutil
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

USER_TEXT = "Please charge my saved card for order 4821 and email me the receipt."
CALLS_TEXT = "Let me take care of that."
DONE_TEXT = "Done: charged and emailed."
ORDER = "4821"
# (call id, tool name, arguments) of the scripted model's assistant message.
TOOL_CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("call_1", "lookup_order", {"order_id": ORDER}),
    ("call_2", "charge_card", {"order_id": ORDER, "amount_cents": 12900}),
    ("call_3", "send_receipt", {"order_id": ORDER}),
]


async def lookup_order(order_id: str) -> str:
    """Look up an order by id."""
    return f"order {order_id}: 1 x headphones, 129.00 USD, card on file"


async def charge_card(order_id: str, amount_cents: int) -> str:
    """Charge the customer's saved card for an order."""
    return f"charged {amount_cents / 100:.2f} USD for order {order_id}"


async def send_receipt(order_id: str) -> str:
    """Email the receipt for an order."""
    return f"receipt for order {order_id} sent"


TOOLS = [lookup_order, charge_card, send_receipt]


async def noop(i: int) -> str:
    """Does nothing."""
    return "ok"


async def direct_calls(n: int) -> float:
    """Seconds to call ``n`` no-op tool coroutines directly (subtracted from the runtime's cost)."""
    t0 = time.perf_counter()
    await asyncio.gather(*(noop(i) for i in range(n)))
    return time.perf_counter() - t0


class Driver(Protocol):
    """One runtime on one backend, as the scenarios see it."""

    messages_per_turn: int

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def turn(self, thread_id: str) -> None: ...
    async def preload(self, thread_id: str, n_messages: int) -> None: ...
    async def message_count(self, thread_id: str) -> int: ...
    async def noop_turn(self, n_tools: int) -> float | None: ...


def new_thread(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


# --------------------------------------------------------------------------- statistics


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in seconds)
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": ms[min(len(ms) - 1, int(0.9 * len(ms)))],
        "min_ms": ms[0],
        "max_ms": ms[-1],
    }


# --------------------------------------------------------------------------- memory


def peak_rss_mb() -> float:
    """Peak resident set of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_now_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def machine_load() -> dict[str, float]:
    """Load average and CPU / IO pressure (a shared machine: a busy neighbour shows here; IO
    pressure is what slows fsync, and so every durable commit)."""
    out: dict[str, float] = {}
    try:
        out["loadavg_1m"] = os.getloadavg()[0]
        for kind in ("cpu", "io"):
            with open(f"/proc/pressure/{kind}") as f:
                out[f"{kind}_pressure_some_avg10"] = float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        pass
    return out


# --------------------------------------------------------------------------- CPU accounting


class Cpu:
    """CPU seconds used by this process (all threads, the runtime's Rust workers included) and by
    the PostgreSQL server (every process under its postmaster: backends, WAL writer, ...)."""

    _TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self, dsn: str | None) -> None:
        self.postmaster: int | None = None
        if dsn:
            try:
                data_dir = psql(dsn, "SELECT current_setting('data_directory')")
                with open(os.path.join(data_dir, "postmaster.pid")) as f:
                    self.postmaster = int(f.readline())
            except (OSError, RuntimeError, ValueError):
                self.postmaster = None  # not our machine, or not readable: client side only

    @staticmethod
    def own() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def server(self) -> float | None:
        if self.postmaster is None:
            return None
        total = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(pid) == self.postmaster or int(fields[1]) == self.postmaster:
                total += int(fields[11]) + int(fields[12])  # utime + stime
        return total / self._TICK

    def mark(self) -> tuple[float, float | None]:
        return self.own(), self.server()

    def per_turn_ms(self, start: tuple[float, float | None], turns: int) -> dict[str, float | None]:
        own, server = self.mark()
        return {"client_ms": (own - start[0]) / turns * 1e3,
                "server_ms": None if server is None or start[1] is None else (server - start[1]) / turns * 1e3}


# --------------------------------------------------------------------------- scenarios


async def run_thread(driver: Driver, thread_id: str, k: int, out: list[float]) -> None:
    for _ in range(k):
        t0 = time.perf_counter()
        await driver.turn(thread_id)
        out.append(time.perf_counter() - t0)


async def verify(driver: Driver, thread_id: str, expected: int) -> None:
    got = await driver.message_count(thread_id)
    if got != expected:
        raise AssertionError(f"thread {thread_id}: {got} messages stored, expected {expected}")


async def short_turns(driver: Driver, cpu: Cpu, *, k: int, threads: int, warm: bool = True) -> dict[str, Any]:
    """``threads`` new threads of ``k`` turns, one thread at a time (after 3 warm-up turns when
    ``warm``): the K=k figure. compare.py runs it in rounds that alternate the runtimes, so that
    one slow moment of the machine (or one slow process) is one round of every runtime's
    figure, not the whole of one runtime's."""
    per = driver.messages_per_turn
    if warm:
        w = new_thread("warm")
        await run_thread(driver, w, 3, [])
        await verify(driver, w, 3 * per)
    short: list[float] = []
    mark = cpu.mark()
    tids = [new_thread() for _ in range(threads)]
    for tid in tids:
        await run_thread(driver, tid, k, short)
    cpu_short = cpu.per_turn_ms(mark, len(short))
    for tid in tids:
        await verify(driver, tid, k * per)
    return {"k_short": {"k": k, "threads": threads, **summary(short), "cpu": cpu_short,
                        "turns_ms": [t * 1e3 for t in short]}}


async def latency(driver: Driver, cpu: Cpu, *, k_short: int, short_threads: int, k_long: int, history: list[int],
                  history_repeats: int, overhead_repeats: int) -> dict[str, Any]:
    """1 thread at a time: turns at K=k_short and K=k_long, a turn at each history size, and the
    per-tool-call overhead."""
    per = driver.messages_per_turn
    warm = new_thread("warm")
    await run_thread(driver, warm, 3, [])
    await verify(driver, warm, 3 * per)

    short_result = await short_turns(driver, cpu, k=k_short, threads=short_threads, warm=False)

    long: list[float] = []
    tid = new_thread()
    await run_thread(driver, tid, k_long, long)
    await verify(driver, tid, k_long * per)
    k_long_summary = summary(long)
    k_long_summary["first10_mean_ms"] = summary(long[:10])["mean_ms"]
    k_long_summary["last10_mean_ms"] = summary(long[-10:])["mean_ms"]

    # At each history size, two turns in a row: the first is the thread's first turn in this
    # process ("history": it loads the whole thread), the second follows a turn this process ran
    # ("history_warm": a runtime that keeps the live state between turns skips the load).
    hist: dict[str, Any] = {}
    hist_warm: dict[str, Any] = {}
    for h in history:
        cold, warm = await history_turns(driver, h, history_repeats)
        hist[str(h)] = summary(cold)
        hist_warm[str(h)] = summary(warm)

    return {
        "k_short": short_result["k_short"],
        "k_long": {"k": k_long, **k_long_summary},
        "history": hist,
        "history_warm": hist_warm,
        "tool_overhead": await tool_overhead(driver, overhead_repeats),
    }


async def history_turns(driver: Driver, h: int, repeats: int) -> tuple[list[float], list[float]]:
    """``repeats`` threads preloaded to ``h`` messages, two timed turns each: the first turn in
    this process and the next one. Returns (first, next) in seconds; checks every thread after."""
    cold, warm = [], []
    for _ in range(repeats):
        tid = new_thread("h")
        await driver.preload(tid, h)
        for samples in (cold, warm):
            t0 = time.perf_counter()
            await driver.turn(tid)
            samples.append(time.perf_counter() - t0)
        await verify(driver, tid, h + 2 * driver.messages_per_turn)
    return cold, warm


async def tool_overhead(driver: Driver, repeats: int, few: int = 1, many: int = 21) -> dict[str, Any] | None:
    """(turn with 21 no-op tools - turn with 1) / 20, minus calling the 20 coroutines directly: the
    runtime's own cost per tool call, ledger included (bench/tool_overhead.py's method)."""
    if await driver.noop_turn(few) is None:
        return None
    for _ in range(2):
        await driver.noop_turn(few)
        await driver.noop_turn(many)
    per_call = []
    for _ in range(repeats):
        t_few = await driver.noop_turn(few)
        t_many = await driver.noop_turn(many)
        base = await direct_calls(many - few)
        assert t_few is not None and t_many is not None
        per_call.append((t_many - t_few - base) / (many - few))
    us = sorted(x * 1e6 for x in per_call)
    return {"median_us": statistics.median(us), "min_us": us[0], "repeats": repeats}


async def throughput(driver: Driver, cpu: Cpu, *, threads: int, k: int, repeats: int = 1) -> dict[str, Any]:
    """``threads`` threads at once, each running ``k`` turns in a row; ``repeats`` rounds on fresh
    threads, the median round reported (turns/s is one wall-clock figure per round)."""
    per = driver.messages_per_turn
    # Warm-up: open the pool's connections, fill caches.
    await asyncio.gather(*(driver.turn(new_thread("warm")) for _ in range(threads)))
    rounds = []
    for _ in range(repeats):
        tids = [new_thread() for _ in range(threads)]
        lat: list[float] = []
        mark = cpu.mark()
        t0 = time.perf_counter()
        await asyncio.gather(*(run_thread(driver, t, k, lat) for t in tids))
        wall = time.perf_counter() - t0
        cpu_used = cpu.per_turn_ms(mark, threads * k)
        for t in tids:
            await verify(driver, t, k * per)
        rounds.append({"wall_s": wall, "turns_per_s": threads * k / wall, "latency": summary(lat), "cpu": cpu_used})
    best = sorted(rounds, key=lambda r: r["turns_per_s"])[len(rounds) // 2]
    return {"threads": threads, "k": k, "turns": threads * k, "repeats": repeats, **best,
            "rounds_turns_per_s": [r["turns_per_s"] for r in rounds]}


# --------------------------------------------------------------------------- PostgreSQL counters


def _psql_binary() -> str:
    initdb = shutil.which("initdb")
    candidates = []
    if initdb:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(initdb)), "psql"))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"), reverse=True)
    candidates.append(shutil.which("psql") or "psql")
    return next(c for c in candidates if c == "psql" or os.path.exists(c))


def psql(dsn: str, sql: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    res = subprocess.run([_psql_binary(), "-X", "-Atq", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql],
                         env=env, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"psql failed running {sql!r}: {res.stderr.strip()}")
    return res.stdout.strip()


_COUNTERS = ("xact_commit", "tup_inserted", "tup_updated", "tup_deleted", "wal_records", "wal_sync", "wal_bytes")


def pg_counters(dsn: str) -> dict[str, float]:
    """This database's transaction and row counters and the server's WAL counters (PostgreSQL 14+).
    A backend publishes its counters when it exits (or after 10 s idle): close the pool first."""
    row = psql(dsn, "SELECT d.xact_commit, d.tup_inserted, d.tup_updated, d.tup_deleted, "
                    "w.wal_records, w.wal_sync, w.wal_bytes "
                    "FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()")
    return dict(zip(_COUNTERS, (float(x) for x in row.split("|")), strict=True))


async def count_per_turn(make: Callable[[], Driver], dsn: str, turns: int) -> dict[str, float]:
    """Per-turn database work: (a run of ``turns`` turns) - (open and close alone), each bracketed
    by closing the pool so every backend has published its counters. ``wal_sync`` is the number of
    WAL flushes, i.e. durable commits (one client, so no group commit)."""

    async def session(n: int) -> dict[str, float]:
        before = pg_counters(dsn)
        d = make()
        await d.open()
        tid = new_thread("count")
        for _ in range(n):
            await d.turn(tid)
        await d.close()
        await asyncio.sleep(0.3)
        after = pg_counters(dsn)
        return {k: after[k] - before[k] for k in _COUNTERS}

    warm = make()
    await warm.open()
    await warm.turn(new_thread("warm"))
    await warm.close()
    await asyncio.sleep(0.3)
    # The server's own background flushes (the WAL writer, autovacuum after the throughput runs)
    # land in a window now and then: one in a 20-turn window reads as 0.05 commits per turn. The
    # median of three bracketed measurements keeps the runtime's figure and drops a stray one; a
    # commit the runtime makes on some turns only would still show in every window.
    diffs = []
    for _ in range(3):
        empty = await session(0)
        full = await session(turns)
        diffs.append({k: (full[k] - empty[k]) / turns for k in _COUNTERS})
    return {k: statistics.median(d[k] for d in diffs) for k in _COUNTERS}

