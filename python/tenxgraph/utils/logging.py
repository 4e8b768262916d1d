"""Logging helpers under 10xGraph's names (``tenxgraph.utils.logging``): the library logger,
best-effort secret masking, correlation fields and a JSON formatter.

The correlation fields are the ones every tenxgraph run already puts on its records
(``tenxgraph.logs``: ``thread_id``, ``run_id``, ``node``, ...); ``set_log_context`` adds to them for
the current context, so a user's own log lines inside a node carry them too.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from tenxgraph.logs import _current

__all__ = [
    "CorrelationFilter",
    "JsonFormatter",
    "SecretRedactionFilter",
    "bind_log_context_from_config",
    "get_log_context",
    "install_secret_redaction",
    "logger",
    "mask_secrets",
    "set_log_context",
    "setup_structured_logging",
]

logger = logging.getLogger("tenxgraph")
if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
    logger.addHandler(logging.NullHandler())  # a library never configures output by itself

_REDACTED = "***REDACTED***"
_CORRELATION_FIELDS = ("run_id", "thread_id", "user_id", "node")

# Known credential shapes first, then "name=value" secrets and signed-URL parameters, where only the
# value goes so a reader still sees which setting it was.
_PATTERNS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"), _REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), _REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), _REDACTED),
    (re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,}"), _REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), _REDACTED),
    (re.compile(r"(?i)\bBearer\s+[A-Za-z0-9._~+/=-]+"), "Bearer " + _REDACTED),
    (re.compile(r"""(?i)\b(api[_-]?key|access[_-]?token|secret|password)(["']?\s*[:=]\s*["']?)([^\s"',&}]{4,})"""),
     lambda m: m.group(1) + m.group(2) + _REDACTED),
    (re.compile(r"(?i)([?&](?:token|sig|signature|x-amz-signature|x-goog-signature|key|password)=)([^&\s]+)"),
     lambda m: m.group(1) + _REDACTED),
]


def mask_secrets(text: str) -> str:
    """``text`` with credential-looking parts replaced by ``***REDACTED***``. A safety net, not a
    guarantee: it may miss a secret or mask a harmless string."""
    if not text:
        return text
    # Connection URLs and password= as the CLI masks them: a URL's password holding '@' or a
    # space, or one without a user (redis://:pw@host), leaked in part or whole with a rule of
    # its own here (red-team, session 31).
    from tenxgraph.utils.redact import redact

    text = redact(text, _REDACTED)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


class SecretRedactionFilter(logging.Filter):
    """Masks secrets in a record's message. On a handler it covers every logger that propagates
    there (a filter on a logger sees only that logger's own records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is logging's problem, not ours
            return True
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True


def install_secret_redaction(logger_name: str = "tenxgraph") -> SecretRedactionFilter:
    """Adds one SecretRedactionFilter to the logger and to its current handlers; returns it."""
    target = logging.getLogger(logger_name)
    redactor = SecretRedactionFilter()
    target.addFilter(redactor)
    for handler in target.handlers:
        handler.addFilter(redactor)
    return redactor


def get_log_context() -> dict[str, str]:
    """The correlation fields in scope (only those set)."""
    return {k: v for k, v in _current.get().items() if k in _CORRELATION_FIELDS}


def set_log_context(run_id: str | None = None, thread_id: str | None = None, user_id: str | None = None,
                    node: str | None = None) -> None:
    """Sets correlation fields for the rest of the current context (and tasks started from it)."""
    merged = dict(_current.get())
    merged.update({k: str(v) for k, v in (("run_id", run_id), ("thread_id", thread_id), ("user_id", user_id),
                                          ("node", node)) if v is not None})
    _current.set(merged)


def bind_log_context_from_config(config: dict[str, Any]) -> None:
    """``set_log_context`` with the ``run_id``, ``thread_id`` and ``user_id`` of a run config
    (absent keys are left as they are)."""
    set_log_context(run_id=config.get("run_id"), thread_id=config.get("thread_id"), user_id=config.get("user_id"))


class CorrelationFilter(logging.Filter):
    """Puts the correlation fields on every record (None where not set), for any formatter."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _current.get()
        for name in _CORRELATION_FIELDS:
            if not hasattr(record, name):
                setattr(record, name, context.get(name))
        return True


_STANDARD_KEYS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, logger, message, the correlation fields that
    are set, the exception, and whatever ``extra=`` added (where JSON can carry it)."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "timestamp": self.formatTime(record, self.datefmt),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _CORRELATION_FIELDS:
            if getattr(record, name, None) is not None:
                payload[name] = getattr(record, name)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        for key, value in vars(record).items():
            if key in _STANDARD_KEYS or key in payload or key in _CORRELATION_FIELDS:
                continue
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
            payload[key] = value
        return json.dumps(payload, default=str)


def setup_structured_logging(level: int = logging.INFO, json_format: bool = True, redact_secrets: bool = True,
                             logger_name: str = "tenxgraph") -> logging.Handler:
    """Opt-in production logging: a stream handler on ``logger_name`` with the correlation
    fields, JSON lines (or a text format naming the fields) and secret masking. Returns it."""
    target = logging.getLogger(logger_name)
    target.setLevel(level)
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.setFormatter(JsonFormatter() if json_format else logging.Formatter(
        "[%(asctime)s] %(levelname)s %(name)s [run=%(run_id)s thread=%(thread_id)s node=%(node)s]: %(message)s"))
    handler.addFilter(CorrelationFilter())
    if redact_secrets:
        handler.addFilter(SecretRedactionFilter())
    target.addHandler(handler)
    return handler
