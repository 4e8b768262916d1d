"""The commands. Each returns an exit code and writes its result to ``out`` (a table, or JSON with
``--json``); progress and notes go to ``err``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any, TextIO

from tenxgraph.cli import views
from tenxgraph.cli.connect import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE, CliError
from tenxgraph.cli.render import cell, emit_json, table
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.storage.checkpointer.native_checkpointer import stop_token

__all__ = ["COMMANDS", "parse_since"]

STATUSES = ("running", "completed", "error", "interrupted_before", "interrupted_after")


class Io:
    def __init__(self, out: TextIO, err: TextIO, as_json: bool, progress: bool) -> None:
        self.out, self.err, self.as_json, self.progress = out, err, as_json, progress

    def note(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``30m``, ``2h``, ``7d`` (ago), or an ISO date/time (UTC unless it names a zone)."""
    now = now or datetime.now(timezone.utc)
    units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    t = text.strip()
    if t[-1:] in units and t[:-1].replace(".", "", 1).isdigit():
        try:
            return now - timedelta(**{units[t[-1]]: float(t[:-1])})
        except OverflowError:
            # An age before the calendar's first day (1000000d) means every thread: it was a
            # traceback.
            return datetime.min.replace(tzinfo=timezone.utc)
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"--since {text!r}: expected an age like 30m, 2h, 7d or a date like 2026-11-30T12:00") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


async def threads_list(cp: BaseCheckpointer, args: Any, io: Io) -> int:
    def progress(scanned: int, matched: int) -> None:
        if io.progress:
            io.note(f"... scanned {scanned} threads, {matched} match")

    rows = [t async for t in views.iter_threads(
        cp, user=args.user, status=args.status, since=args.since, limit=args.limit, progress=progress)]
    if io.as_json:
        emit_json(rows, io.out)
    else:
        cols = [("thread_id", "THREAD"), ("user_id", "USER"), ("status", "STATUS"), ("current_node", "NODE"),
                ("step", "STEP"), ("version", "VERSION"), ("updated_at", "UPDATED")]
        io.out.write(table([r.model_dump() for r in rows], cols, {"thread_id": 40}) + "\n")
        if not rows:
            io.note("no threads match")
    return 0


def _lease_line(lease: views.LeaseView | None) -> str:
    if lease is None:
        return "none"
    where = f", {lease.host} pid {lease.pid}" if lease.host else ""
    return f"{lease.holder} (token {lease.token}{where}, expires in {lease.expires_in:.1f}s)"


async def threads_show(cp: BaseCheckpointer, args: Any, io: Io) -> int:
    d = await views.thread_detail(cp, args.thread)
    if io.as_json:
        emit_json(d, io.out)
        return 0
    fields = [
        ("thread", d.thread_id), ("user", d.user_id), ("name", d.name), ("status", d.status or "no state"),
        ("current node", d.current_node), ("step", d.step), ("version", d.version),
        ("created", d.created_at), ("updated", d.updated_at), ("lease", _lease_line(d.lease)),
    ]
    if d.error:
        fields.append(("error", d.error))
    # A running thread's reason is the engine's own mark (routing_pending), not a pause.
    if d.interrupt_reason and d.status != "running":
        fields.append(("interrupt", d.interrupt_reason))
    if d.pending_interrupt:
        fields.append(("pending interrupt", json.dumps(d.pending_interrupt, ensure_ascii=False)))
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        io.out.write(f"{k.ljust(width)}  {v if isinstance(v, str) else cell(v)}\n")
    io.out.write("\nversions (newest first):\n")
    cols = [("version", "VERSION"), ("created_at", "CREATED"), ("status", "STATUS"), ("current_node", "NODE"),
            ("step", "STEP")]
    io.out.write(table([v.model_dump() for v in d.versions], cols) + "\n")
    return 0


async def threads_messages(cp: BaseCheckpointer, args: Any, io: Io) -> int:
    rows = await views.message_rows(cp, args.thread, args.limit)
    if io.as_json:
        emit_json([r.data for r in rows], io.out)
        return 0
    cols = [("message_id", "MESSAGE"), ("role", "ROLE"), ("text", "TEXT"), ("tool_calls", "TOOL CALLS")]
    io.out.write(table([r.model_dump() for r in rows], cols, {"message_id": 36, "text": 60, "tool_calls": 40}) + "\n")
    return 0


async def ledger(cp: BaseCheckpointer, args: Any, io: Io) -> int:
    if args.call is not None:
        try:
            key, result = await views.ledger_result(cp, args.thread, args.call)
        except KeyError as exc:
            raise CliError(str(exc.args[0]), EXIT_NOT_FOUND) from None
        value = views.ledger_value(result)
        if io.as_json:
            emit_json({"key": key, **value.model_dump()}, io.out)
            return 0
        if value.status != "completed":
            io.out.write(f"{value.status}: no result recorded\n")
            return 0
        out = value.result
        io.out.write((out if isinstance(out, str) else json.dumps(out, indent=2, ensure_ascii=False)) + "\n")
        if value.is_error:
            io.note("the tool's result is an error")
        if value.state is not None:
            io.note(f"the call also updated the state: {json.dumps(value.state, ensure_ascii=False)}")
        return 0
    rows = await views.ledger_rows(cp, args.thread)
    if io.as_json:
        emit_json(rows, io.out)
        return 0
    cols = [("key", "KEY"), ("tool", "TOOL"), ("status", "STATUS"), ("recorded_at", "RECORDED"),
            ("result_bytes", "RESULT BYTES")]
    io.out.write(table([r.model_dump() for r in rows], cols) + "\n")
    if not rows:
        io.note(f"no ledger rows for thread {args.thread!r}")
    return 0


async def migrate(cp: BaseCheckpointer, args: Any, io: Io) -> int:
    if io.progress:
        io.note("applying schema migrations ...")
    await cp.asetup()
    version = await cp._native.schema_version()
    if io.as_json:
        emit_json({"schema_version": version, "store": args.target_label}, io.out)
    else:
        io.out.write(f"schema version {version} ({args.target_label}): up to date\n")
    return 0


async def stop(cp: BaseCheckpointer, args: Any, io: Io) -> int:
    # The lease before the state, as stop() reads them: a turn that starts after this read is
    # never the one stopped.
    owner = await views.thread_owner(cp, args.thread)
    token = await stop_token(cp._native, args.thread, owner)
    detail = await views.thread_detail(cp, args.thread)
    user = args.user or detail.user_id
    if user != detail.user_id and getattr(cp, "enforce_user_isolation", False):
        # The stop key names the run's user; with users isolated only the owner's run can hold
        # the thread, so another user's key would be read by no run while we said "stopped"
        # (red-team, session 35).
        raise CliError(f"thread {args.thread!r} belongs to user {detail.user_id!r}, and with users isolated only "
                       f"its owner's run can hold it: --user {user!r} would stop nothing (leave --user out)",
                       EXIT_USAGE)
    running = detail.status == "running"
    if running:
        await cp.arequest_stop({"thread_id": args.thread, "user_id": user, "_stop_token": token})
    result = {"thread_id": args.thread, "user_id": user, "status": detail.status, "stop_requested": running}
    if io.as_json:
        emit_json(result, io.out)
    elif running:
        if user == detail.user_id:
            io.out.write(f"stop requested for the run on thread {args.thread!r} (running at node "
                         f"{detail.current_node!r}); it stops within about a second\n")
        else:
            io.out.write(f"stop requested for a run of user {user!r} on thread {args.thread!r} (owner "
                         f"{detail.user_id!r}, running at node {detail.current_node!r}): a run of that user stops "
                         "within about a second; the owner's own run does not read this request\n")
    else:
        io.out.write(f"thread {args.thread!r} is not running (status: {detail.status or 'no state'}); nothing to stop\n")
    return 0


async def prune(cp: BaseCheckpointer, args: Any, io: Io) -> int:
    if args.keep_versions is None and args.older_than is None and args.ledger_ttl is None:
        raise CliError("prune needs at least one rule: --keep-versions, --older-than or --ledger-ttl", EXIT_USAGE)
    if io.progress:
        io.note("pruning (threads that are not completed, or whose lease is held, are never touched) ...")
    report = await cp.aprune(keep_versions=args.keep_versions, finished_older_than=args.older_than,
                             ledger_ttl=args.ledger_ttl, dry_run=args.dry_run)
    if io.as_json:
        emit_json(report, io.out)
    else:
        verb = "would remove" if args.dry_run else "removed"
        io.out.write(f"{verb}: {report['state_versions']} state versions, {report['threads']} completed threads, "
                     f"{report['ledger_rows']} ledger rows, {report['cache_entries']} expired cache entries\n")
    if not report.get("legacy_unchecked"):
        return 0
    # Left, and not safe to prune unasked: a cron job must see it (exit 1), as recover's "not listed".
    if not io.as_json:
        io.out.write("kept: completed threads 10xGraph wrote last, their Redis not given (--redis-url) or not "
                     "answering (its entries may hold a run under way)\n")
    return EXIT_FAILED


COMMANDS = {
    ("threads", "list"): threads_list,
    ("threads", "show"): threads_show,
    ("threads", "messages"): threads_messages,
    ("ledger", None): ledger,
    ("migrate", None): migrate,
    ("stop", None): stop,
    ("prune", None): prune,
}
