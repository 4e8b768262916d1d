"""Argument parsing, dispatch and exit codes of the ``tenxgraph`` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, TextIO

from tenxgraph.cli import views
from tenxgraph.cli.commands import COMMANDS, STATUSES, Io, parse_since
from tenxgraph.cli.connect import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_STORE,
    EXIT_USAGE,
    CliError,
    open_store,
    redact,
    target_from_args,
)
from tenxgraph.utils.redact import RedactingStream

__all__ = ["EXIT_BROKEN_PIPE", "build_parser", "main"]

# What a shell reports for a writer killed by SIGPIPE (128 + 13), which is what `cat` would give.
EXIT_BROKEN_PIPE = 141


_I64_MAX = 2**63 - 1


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value > _I64_MAX:
        # The stores count in 64 bits: past that, an OverflowError ended the command.
        raise argparse.ArgumentTypeError(f"expected a positive integer below 2**63, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number of seconds, got {text!r}")
    return value


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _age(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``7d`` -> seconds (>= 0)."""
    raw = text.strip().lower()
    unit = _UNITS.get(raw[-1:], None)
    number = raw[:-1] if unit is not None else raw
    try:
        value = float(number) * (unit or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an age such as 90s, 30m, 2h or 7d, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected an age >= 0, got {text!r}")
    return value


def _since(text: str) -> Any:
    try:
        return parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the command. SUPPRESS: an option given only before the
    command is not reset by the command's parser."""
    p = argparse.ArgumentParser(add_help=False)
    s = argparse.SUPPRESS
    store = p.add_argument_group("store (one of)")
    store.add_argument("--sqlite", metavar="PATH", default=s, help="a SqliteCheckpointer database file")
    store.add_argument("--dsn", metavar="URL", default=s,
                       help="a PostgreSQL URL (default: $TENXGRAPH_DSN); its password is never printed")
    store.add_argument("--config", metavar="FILE", default=s,
                       help="a 10xgraph.json whose checkpointer to use (default: ./10xgraph.json if present)")
    pg = p.add_argument_group("postgres")
    pg.add_argument("--schema", default=s, help="schema of the tables (default: public)")
    pg.add_argument("--redis-url", metavar="URL", default=s, help="the Redis the application uses, if any")
    pg.add_argument("--connect-timeout", metavar="SECONDS", type=_positive_float, default=s,
                    help="per connection attempt (default: 5)")
    pg.add_argument("--id-type", choices=("string", "int", "bigint"), default=s,
                    help="the thread and message id type the database was created with (default: string)")
    pg.add_argument("--user-id-type", choices=("string", "int", "bigint"), default=s,
                    help="the user id type the database was created with (default: string)")
    out = p.add_argument_group("output")
    out.add_argument("--json", dest="as_json", action="store_true", default=s, help="JSON on stdout, for scripts")
    out.add_argument("--progress", dest="progress", action="store_true", default=s,
                     help="progress lines on stderr (default: when stderr is a terminal)")
    out.add_argument("--no-progress", dest="progress", action="store_false", default=s)
    out.add_argument("-v", "--verbose", action="store_true", default=s,
                     help="show the runtime's own log lines (INFO and above) on stderr")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The ``tenxgraph`` argument parser: the common store options (``--dsn``, ``--sqlite``,
    ``--config``, ``--json``, ...) accepted before or after the subcommand."""
    common = _common()
    # Its own copy of the options: set_defaults() below changes the defaults of the parser's
    # actions, and the commands' copies must keep SUPPRESS.
    parser = argparse.ArgumentParser(
        prog="tenxgraph", parents=[_common()],
        description="Inspect and operate the threads of a tenxgraph checkpointer.",
        epilog="Exit codes: 0 ok, 1 failed, 2 usage, 3 thread or call not found, "
               "4 store unreachable or invalid, 5 bad 10xgraph.json.",
    )
    parser.set_defaults(sqlite=None, dsn=None, config=None, schema="public", redis_url=None, connect_timeout=5.0,
                        id_type="string", user_id_type="string",
                        as_json=False, progress=None, verbose=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    threads = sub.add_parser("threads", help="list threads, show one, or print its messages")
    tsub = threads.add_subparsers(dest="action", required=True, metavar="ACTION")
    tl = tsub.add_parser("list", parents=[common], help="threads, most recently updated first")
    tl.add_argument("--user", help="only threads of this user")
    tl.add_argument("--status", choices=STATUSES, help="only threads whose latest state has this status")
    tl.add_argument("--since", type=_since, metavar="WHEN", help="updated since: an age (30m, 2h, 7d) or an ISO date")
    tl.add_argument("--limit", type=_positive_int, default=50, help="at most this many (default: 50)")
    ts = tsub.add_parser("show", parents=[common],
                         help="status, current node, step, version history, pending interrupt, lease")
    ts.add_argument("thread")
    tm = tsub.add_parser("messages", parents=[common], help="the thread's messages, oldest first")
    tm.add_argument("thread")
    tm.add_argument("--limit", type=_positive_int, help="only the last N")

    lg = sub.add_parser("ledger", parents=[common], help="the thread's recorded tool calls, or one call's result")
    lg.add_argument("thread")
    lg.add_argument("--call", metavar="KEY", help="print this call's recorded result (ledger key or tool_call_id)")

    sub.add_parser("migrate", parents=[common], help="apply schema migrations and print the schema version")

    pr = sub.add_parser("prune", parents=[common],
                        help="retention: old state versions, completed threads, old ledger rows of completed threads")
    pr.add_argument("--keep-versions", type=_positive_int, metavar="N", help="keep at most N state versions per thread")
    pr.add_argument("--older-than", type=_age, metavar="AGE",
                    help="delete completed threads not updated for AGE (90s, 30m, 2h, 7d), with messages and ledger")
    pr.add_argument("--ledger-ttl", type=_age, metavar="AGE",
                    help="delete ledger rows of completed threads recorded more than AGE ago")
    pr.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")

    st = sub.add_parser("stop", parents=[common], help="ask the thread's running run to stop")
    st.add_argument("thread")
    st.add_argument("--user", help="the run's user_id (default: the thread's owner)")

    rc = sub.add_parser("recover", parents=[common],
                        help="resume every thread whose run died (running, no live lease holder); needs the graph")
    rc.add_argument("--graph", metavar="MODULE:ATTR",
                    help="a compiled graph, or a factory() / factory(checkpointer) (default: the graph of 10xgraph.json)")
    rc.add_argument("--concurrency", type=_positive_int, default=4, help="resumes at once (default: 4)")
    rc.add_argument("--limit", type=_positive_int, help="look at no more than N running threads")
    return parser


async def _run(args: argparse.Namespace, io: Io) -> int:
    if args.command == "recover":  # the store comes with the graph
        from tenxgraph.cli.recover import recover_command

        return await recover_command(args, io)
    # An argument that is not valid UTF-8 arrives with lone surrogates (surrogateescape): refused
    # as every other entry point refuses such an id (STORAGE_CONFIG_002), before the store opens.
    from tenxgraph import _core

    for attr, field in (("thread", "thread_id"), ("user", "user_id")):
        if isinstance(getattr(args, attr, None), str):
            setattr(args, attr, _core.text_id(field, getattr(args, attr)))
    target = target_from_args(args, creating=args.command == "migrate")
    args.target_label = target.label
    cp = open_store(target)
    try:
        return await COMMANDS[(args.command, getattr(args, "action", None))](cp, args, io)
    finally:
        try:
            await asyncio.wait_for(cp.arelease(), timeout=5)
        except Exception:  # noqa: BLE001 - closing must not hide the command's own outcome
            pass


class _Redacting(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def _setup_logging(verbose: bool, err: TextIO) -> None:
    """The command reports failures itself; the runtime's log lines (retries, the exception log
    of a constructed error) are shown only with --verbose. A process whose logging is already
    configured (main() called from an application or a test) is left as it is."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(err)
    handler.setFormatter(_Redacting("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.CRITICAL)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Runs the CLI and returns its exit code (never raises for a command's failure: it prints
    ``tenxgraph: error: ...`` and returns the code). Everything written to ``out``/``err`` (stdout
    and stderr by default) passes ``redact`` first; a closed pipe (``| head``) ends it quietly."""
    # Everything the command writes passes `redact`, whatever path wrote it: results, errors,
    # argparse's usage messages (which echo arguments), warnings and log lines.
    out_r = RedactingStream(out or sys.stdout)
    err_r = RedactingStream(err or sys.stderr)
    try:
        try:
            with contextlib.redirect_stdout(out_r), contextlib.redirect_stderr(err_r):  # type: ignore[type-var]
                return _main(argv, out_r, err_r)  # type: ignore[arg-type]
        finally:
            try:
                out_r.flush()
            finally:
                err_r.flush()
    except BrokenPipeError:
        # The reader went away (`tenxgraph ... | head`): stop quietly, as Unix tools do, instead of
        # a traceback; stdout is pointed at /dev/null so the interpreter's own flush at exit
        # cannot raise again.
        _detach_stdout()
        return EXIT_BROKEN_PIPE


def _detach_stdout() -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _main(argv: Sequence[str] | None, out: TextIO, err: TextIO) -> int:
    args = build_parser().parse_args(argv)
    progress = args.progress if args.progress is not None else err.isatty()
    io = Io(out, err, args.as_json, progress)
    _setup_logging(args.verbose, err)

    def fail(message: str, code: int) -> int:
        err.write(f"tenxgraph: error: {redact(message)}\n")
        return code

    from tenxgraph.core.exceptions import StorageError, TransientStorageError

    try:
        return asyncio.run(_run(args, io))
    except CliError as exc:
        return fail(str(exc), exc.exit_code)
    except views.ThreadNotFound as exc:
        return fail(str(exc), EXIT_NOT_FOUND)
    except TransientStorageError as exc:
        return fail(f"the store is unreachable: {exc}", EXIT_STORE)
    except StorageError as exc:
        return fail(str(exc), EXIT_FAILED)
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except BrokenPipeError:
        raise  # not an error of the command: main() ends quietly
    except Exception as exc:  # noqa: BLE001 - an uncaught exception's traceback would skip redaction
        if args.verbose:
            traceback.print_exc(file=err)
        return fail(f"unexpected {type(exc).__name__}: {exc}", EXIT_FAILED)
