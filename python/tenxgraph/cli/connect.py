"""Which store the CLI talks to: ``--sqlite PATH``, ``--dsn`` (or ``$TENXGRAPH_DSN``), or the
checkpointer named by ``10xgraph.json`` (``--config``, default ``./10xgraph.json``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tenxgraph.utils.redact import redact
from tenxgraph.config import CONFIG_FILE, load_config
from tenxgraph.storage.checkpointer import BaseCheckpointer, PgCheckpointer, SqliteCheckpointer

__all__ = ["CliError", "Target", "open_store", "redact"]

DSN_ENV = "TENXGRAPH_DSN"

# Exit codes (also in docs/cli.md).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_STORE = 4
EXIT_CONFIG = 5


class CliError(Exception):
    """A failure with a message for the user and the exit code it maps to."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/*")


def _not_a_url(dsn: str) -> str:
    """The usage error for a --dsn that is not a postgresql:// URL. It names the scheme it saw
    and nothing after it: in a value that is not a URL, no rule can tell where a password is."""
    seen = _SCHEME.match(dsn)
    got = f"a value starting {seen.group(0)!r}" if seen else "a value that is not a URL (key=value DSNs are not accepted)"
    return f"--dsn must be a postgresql:// URL (postgresql://USER@HOST:PORT/DB, the password after USER:), got {got}"


class Target:
    """The chosen store, described without secrets."""

    def __init__(self, kind: str, label: str, opener: Any) -> None:
        self.kind = kind
        self.label = label
        self._opener = opener

    def open(self) -> BaseCheckpointer:
        """Opens the checkpointer this target names (SQLite, Postgres or a config's); raises what opening
        raises (``open_store`` turns that into a redacted ``CliError``)."""
        return self._opener()


def target_from_args(args: Any, *, creating: bool = False) -> Target:
    """Resolves the store options; ``creating`` (``migrate``) allows a new SQLite file."""
    dsn = args.dsn if args.dsn is not None else (os.environ.get(DSN_ENV) if not (args.sqlite or args.config) else None)
    given = [name for name, v in (("--dsn", dsn), ("--sqlite", args.sqlite), ("--config", args.config)) if v]
    if len(given) > 1:
        raise CliError(f"give one of --dsn, --sqlite, --config (got {', '.join(given)})", EXIT_USAGE)
    if args.sqlite:
        path = Path(args.sqlite)
        if not creating and not path.is_file():
            raise CliError(f"no SQLite database at {path} (`tenxgraph migrate --sqlite {path}` creates one)",
                           EXIT_STORE)
        return Target("sqlite", f"sqlite:{path}", lambda: SqliteCheckpointer(path))
    if dsn:
        if not dsn.startswith(("postgres://", "postgresql://")):
            raise CliError(_not_a_url(dsn), EXIT_USAGE)
        return Target("postgres", redact(dsn), lambda: PgCheckpointer(
            dsn, redis_url=args.redis_url, schema=args.schema, enforce_user_isolation=False,
            pool_config={"max_size": 2, "timeout": args.connect_timeout},
            id_type=args.id_type, user_id_type=args.user_id_type,
        ))
    config_path = Path(args.config) if args.config else Path.cwd() / CONFIG_FILE
    if not args.config and not config_path.is_file():
        raise CliError(f"no store given: pass --sqlite PATH or --dsn URL (or ${DSN_ENV}), or --config FILE, "
                       f"or run where {CONFIG_FILE} is", EXIT_USAGE)

    def from_config() -> BaseCheckpointer:
        return load_config(config_path).load_checkpointer()

    return Target("config", f"{config_path} (checkpointer)", from_config)


def open_store(target: Target) -> BaseCheckpointer:
    """Opens (and, as every checkpointer does on open, migrates) the store; failures become a
    CliError whose text has no password in it."""
    from tenxgraph.config import ConfigError
    from tenxgraph.core.exceptions import StorageError

    try:
        cp = target.open()
        cp.setup()  # checkpointers open on first use: the CLI wants the failure here
        return cp
    except ConfigError as exc:
        raise CliError(redact(str(exc)), EXIT_CONFIG) from None
    except (StorageError, ValueError, TypeError, OSError) as exc:
        raise CliError(f"cannot open {target.label}: {redact(str(exc))}", EXIT_STORE) from None
