"""Where a turn's database time goes: statements per turn (pg_stat_statements), WAL flushes and
their time (pg_stat_wal with track_wal_io_timing), CPU of the runtime process and of the server.

    .venv-bench/bin/python bench/profile_pg.py [--turns 200] [--systems tenx,langgraph,floor] [--nested]

Starts its own throwaway PostgreSQL (tenxgraph.testing) with pg_stat_statements preloaded (the
benchmark's server runs without it, so its figures carry no tracking overhead). ``--nested`` also
counts the statements inside tenxgraph's plpgsql step function (their times overlap the caller's).
Runs in the bench venv (it needs tenxgraph, LangGraph and psycopg).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare_common as cc  # noqa: E402


def start_server_with_statements() -> Any:
    from tenxgraph.testing.services import find_pg_binary, start_postgres

    server = start_postgres(use_env=False)
    if server.external:
        raise SystemExit("this script needs a server of its own (it restarts it)")
    server.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    server.psql("ALTER SYSTEM SET track_wal_io_timing = on")
    cmd = [find_pg_binary("pg_ctl"), "-D", server.data_dir, "-l", server.log_path, "-w", "-m", "fast", "restart"]
    if os.geteuid() == 0:  # PostgreSQL runs as the postgres OS user (see tenxgraph.testing.services)
        cmd = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", "postgres", "--", *cmd]
    # No pipes: the restarted postmaster would hold them open and run() would never return.
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd="/")
    return server


def make(system: str, dsn: str) -> Any:
    if system == "tenx":
        from compare_tenx import TenxDriver

        return TenxDriver("postgres", dsn, 10)
    if system == "langgraph":
        from compare_langgraph import LangGraphDriver

        return LangGraphDriver("postgres", dsn, 10)
    from compare_floor import FloorDriver

    return FloorDriver("postgres", dsn, 10)


async def profile(system: str, dsn: str, turns: int, nested: bool) -> None:
    cc.psql(dsn, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    cc.psql(dsn, f"ALTER SYSTEM SET pg_stat_statements.track = '{'all' if nested else 'top'}'")
    cc.psql(dsn, "SELECT pg_reload_conf()")
    warm = make(system, dsn)
    await warm.open()
    for _ in range(5):
        await warm.turn(cc.new_thread("warm"))
    await warm.close()
    await asyncio.sleep(0.3)
    cc.psql(dsn, "SELECT pg_stat_statements_reset(), pg_stat_reset_shared('wal')")
    cpu = cc.Cpu(dsn)
    d = make(system, dsn)
    await d.open()
    lat: list[float] = []
    mark = cpu.mark()
    for _ in range(turns // 10):
        await cc.run_thread(d, cc.new_thread(), 10, lat)
    used = cpu.per_turn_ms(mark, len(lat))
    await d.close()
    await asyncio.sleep(0.3)
    n = len(lat)
    s = cc.summary(lat)
    print(f"\n== {system}: {n} turns (K=10), median {s['median_ms']:.2f} ms, mean {s['mean_ms']:.2f} ms; "
          f"CPU per turn: runtime process {used['client_ms']:.2f} ms, server {used['server_ms'] or 0:.2f} ms")
    wal = cc.psql(dsn, "SELECT wal_sync, wal_sync_time, wal_records, wal_bytes FROM pg_stat_wal").split("|")
    syncs = float(wal[0])
    print(f"   WAL: {syncs / n:.2f} flushes/turn, {float(wal[1]) / max(syncs, 1):.3f} ms per flush, "
          f"{float(wal[2]) / n:.1f} records/turn, {float(wal[3]) / n / 1024:.1f} KB/turn")
    rows = cc.psql(dsn, f"""
        SELECT calls, total_exec_time, toplevel, regexp_replace(query, '\\s+', ' ', 'g')
        FROM pg_stat_statements
        WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND query !~* 'pg_stat|CREATE |schema_version|advisory|client_connection_check|checkpoint_migrations'
        ORDER BY toplevel DESC, total_exec_time DESC""")
    top_calls = top_ms = 0.0
    print(f"   {'calls/turn':>10} {'ms/turn':>8} {'ms/call':>8}  statement")
    for line in rows.splitlines():
        calls, total, toplevel, query = line.split("|", 3)
        c, t = float(calls), float(total)
        if c / n < 0.05:
            continue
        if toplevel == "t":
            top_calls += c
            top_ms += t
        print(f"   {c / n:10.2f} {t / n:8.3f} {t / c:8.3f}  {'' if toplevel == 't' else '  (nested) '}{query[:96]}")
    print(f"   top-level: {top_calls / n:.1f} statements/turn (round trips), {top_ms / n:.2f} ms/turn executing")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--systems", default="tenx,langgraph,floor")
    p.add_argument("--nested", action="store_true")
    args = p.parse_args()
    server = start_server_with_statements()
    try:
        for system in args.systems.split(","):
            db = f"prof_{system}"
            server.psql(f'CREATE DATABASE "{db}"')
            await profile(system, server.dsn_for(db), args.turns, args.nested)
            time.sleep(0.2)
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
