"""Structured log fields of runs.

Every log line about a run, from the Rust core or from Python, carries the run's fields as
attributes of the ``LogRecord`` (what ``extra=`` sets), so a JSON formatter or a log shipper
indexes them: ``thread_id``, ``run_id``, ``node`` (once the run is in a node), ``tool`` (lines
about one tool call), and where it applies ``event`` (a stable name to alert on), ``ledger_key``
and ``error``. Rust lines carry their values as strings.

The line to alert on: a tool call that finished but whose result could not be written to the
ledger (a replay may run it again) is logged at ERROR with the constant message
:data:`NOT_RECORDED_MESSAGE` and ``event == "tool_result_not_recorded"``
(:data:`NOT_RECORDED_EVENT`), from the logger ``tenxgraph.engine.tools`` (or ``tenxgraph.tools``
when the result itself cannot be serialised).

Plain-text logs: add :class:`RunFieldsDefaults` to the handler so a format string may name the
fields on every record, e.g.
``"%(levelname)s %(name)s [thread=%(thread_id)s run=%(run_id)s node=%(node)s tool=%(tool)s] %(message)s"``.

Rust lines follow the level of their Python logger (``tenxgraph.engine.*``, ``tenxgraph.store.*``,
``sqlx.*``), which is looked up once per logger; after changing levels at runtime call
:func:`reset_level_cache`.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

__all__ = [
    "NOT_RECORDED_EVENT",
    "NOT_RECORDED_MESSAGE",
    "RUN_FIELDS",
    "RunFieldsDefaults",
    "reset_level_cache",
]

RUN_FIELDS = ("thread_id", "run_id", "node", "tool", "event", "ledger_key")
NOT_RECORDED_EVENT = "tool_result_not_recorded"
# Must equal the message of the Rust line (src/engine/tools.rs, `not_recorded`).
NOT_RECORDED_MESSAGE = "tool call COMPLETED but could not be recorded; a replay of this node may run it again"

_current: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("tenxgraph_log_fields", default={})


class log_fields:  # noqa: N801  (used as a function: ``with log_fields(node=...):``)
    """Adds fields to every tenxgraph log line made in this context (and in tasks started from it).

    A class, not a ``@contextmanager`` generator: a run enters one per node and per tool call,
    and the generator's machinery was most of its cost."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any) -> None:
        self._fields = fields
        self._token: contextvars.Token[dict[str, str]] | None = None

    def __enter__(self) -> None:
        merged = dict(_current.get())
        for k, v in self._fields.items():
            if v is not None:
                merged[k] = v if type(v) is str else str(v)
        self._token = _current.set(merged)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None


class _RunFields(logging.Filter):
    """Copies the current run's fields onto records of one logger (explicit ``extra`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _current.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


_RUN_FIELDS_FILTER = _RunFields()


def run_logger(name: str) -> logging.Logger:
    """A logger whose records carry the fields of the run they were made in."""
    logger = logging.getLogger(name)
    if _RUN_FIELDS_FILTER not in logger.filters:
        logger.addFilter(_RUN_FIELDS_FILTER)
    return logger


class RunFieldsDefaults(logging.Filter):
    """A handler filter: sets each run field a record lacks to ``default``, so text formats can
    name them on records that are not about a run."""

    def __init__(self, default: str = "-") -> None:
        super().__init__()
        self.default = default

    def filter(self, record: logging.LogRecord) -> bool:
        for key in RUN_FIELDS:
            if not hasattr(record, key):
                setattr(record, key, self.default)
        return True


def reset_level_cache() -> None:
    """Makes Rust log lines follow Python logging levels changed after their first line."""
    from tenxgraph import _core

    _core.reset_log_cache()
