"""``tenxgraph recover``: one recovery pass (``CompiledGraph.arecover``) from the command line.

Resuming a thread runs its graph, so the command needs the graph, not just the store:

- ``--graph module:attr`` naming a compiled graph (it brings its own checkpointer), or a factory:
  ``factory()`` building graph and checkpointer itself, or ``factory(checkpointer)`` (the crash
  kit's convention) given the store named by ``--sqlite`` / ``--dsn`` / ``--config``;
- without ``--graph``: the ``graph`` of ``10xgraph.json`` (``--config``, default ./10xgraph.json).

Modules are imported with the current directory on ``sys.path``. Exit 0 when no resume failed,
1 when one did (the report lists it), 2 for usage, 5 for a bad ``10xgraph.json``.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

from tenxgraph.cli.connect import DSN_ENV, EXIT_CONFIG, EXIT_FAILED, EXIT_USAGE, CliError, open_store, target_from_args
from tenxgraph.cli.render import emit_json, table

__all__ = ["recover_command"]

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _import(path: str) -> Any:
    if not _IMPORT_PATH.match(path):
        raise CliError(f"--graph must be an import path like 'myapp.agent:app', got {path!r}", EXIT_USAGE)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    module_name, _, attr = path.partition(":")
    import importlib

    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module, reported as such
        raise CliError(f"--graph {path!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}",
                       EXIT_USAGE) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"--graph {path!r}: module {module_name!r} has no attribute {attr!r}", EXIT_USAGE)
        obj = getattr(obj, part)
    return obj


def _store_given(args: Any) -> bool:
    return bool(args.sqlite or args.dsn or args.config or os.environ.get(DSN_ENV))


def _required_params(fn: Any) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 0
    return sum(1 for p in sig.parameters.values()
               if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


async def _graph_from(args: Any) -> Any:
    from tenxgraph.config import CONFIG_FILE, ConfigError, load_config
    from tenxgraph.core.graph.compiled_graph import CompiledGraph

    if args.graph is None:
        path = Path(args.config) if args.config else Path.cwd() / CONFIG_FILE
        if not args.config and not path.is_file():
            raise CliError(f"recover needs the graph to resume threads with: pass --graph module:attr, or run "
                           f"where a {CONFIG_FILE} names it", EXIT_USAGE)
        if args.sqlite or args.dsn:
            raise CliError("--sqlite/--dsn need --graph naming a factory(checkpointer); the graph of "
                           f"{path} brings its own checkpointer", EXIT_USAGE)
        try:
            return load_config(path).load_graph()
        except ConfigError as exc:
            raise CliError(str(exc), EXIT_CONFIG) from None

    obj = _import(args.graph)
    if isinstance(obj, CompiledGraph):
        if args.sqlite or args.dsn or args.config:
            raise CliError(f"--graph {args.graph!r} is a compiled graph with its own checkpointer: drop the "
                           "store option (or name a factory(checkpointer) instead)", EXIT_USAGE)
        return obj
    if not callable(obj):
        raise CliError(f"--graph {args.graph!r} is a {type(obj).__name__}, not a compiled graph or a factory",
                       EXIT_USAGE)
    wants_store = _required_params(obj)
    if wants_store > 1:
        raise CliError(f"--graph {args.graph!r}: a factory takes no argument or one (the checkpointer)", EXIT_USAGE)
    if wants_store and not _store_given(args):
        raise CliError(f"--graph {args.graph!r} takes a checkpointer: give --sqlite, --dsn or --config", EXIT_USAGE)
    if not wants_store and (args.sqlite or args.dsn):
        raise CliError(f"--graph {args.graph!r} takes no checkpointer (it builds its own): drop --sqlite/--dsn",
                       EXIT_USAGE)
    store = open_store(target_from_args(args)) if wants_store else None
    made = obj(store) if wants_store else obj()
    if inspect.isawaitable(made):
        made = await made
    if not isinstance(made, CompiledGraph):
        raise CliError(f"--graph {args.graph!r} returned a {type(made).__name__}, not a compiled graph", EXIT_USAGE)
    if store is not None and getattr(made, "_checkpointer", None) is not store:
        # A factory that takes something else (a path) and builds its own store recovered
        # another database and reported "0 resumed" as a success (docs helper, session 41).
        raise CliError(f"--graph {args.graph!r} returned a graph that does not use the checkpointer it was given "
                       "(a factory(checkpointer) must compile with checkpointer=it)", EXIT_USAGE)
    return made


def _rows(report: Any) -> list[dict[str, Any]]:
    rows = [{"thread_id": r.thread_id, "user_id": r.user_id, "outcome": "resumed", "status": r.status, "detail": None}
            for r in report.resumed]
    for s in report.skipped:
        detail = f"held by run {s.holder_run_id}" if s.reason == "busy" else "finished meanwhile"
        rows.append({"thread_id": s.thread_id, "user_id": s.user_id, "outcome": f"skipped ({s.reason})",
                     "status": s.status, "detail": detail})
    # The error text of tenxgraph exceptions starts with their code already.
    rows += [{"thread_id": f.thread_id, "user_id": f.user_id, "outcome": "failed", "status": f.status,
              "detail": f"{f.error_type}: {f.error}"} for f in report.failed]
    return rows


async def recover_command(args: Any, io: Any) -> int:
    """``tenxgraph recover``: loads the graph named by the arguments, resumes its unfinished
    threads (``arecover``, at most ``--concurrency`` at once) and prints the report; the graph is
    closed even when recovery fails. Returns the exit code."""
    graph = await _graph_from(args)
    try:
        if io.progress:
            io.note(f"recovering (at most {args.concurrency} resumes at once) ...")
        report = await graph.arecover(concurrency=args.concurrency, limit=args.limit)
    finally:
        await graph.aclose()
    if io.as_json:
        emit_json(report, io.out)
    else:
        cols = [("thread_id", "THREAD"), ("user_id", "USER"), ("outcome", "OUTCOME"), ("status", "STATUS"),
                ("detail", "DETAIL")]
        rows = _rows(report)
        if rows:
            io.out.write(table(rows, cols, {"thread_id": 40, "detail": 100}) + "\n")
        io.out.write(f"{len(report.resumed)} resumed, {len(report.skipped)} skipped, {len(report.failed)} failed\n")
        for why in report.unlisted:
            io.out.write(f"not listed: {why}\n")
    return 0 if report.ok else EXIT_FAILED
