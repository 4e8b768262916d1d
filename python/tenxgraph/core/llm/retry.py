"""Retries and fallbacks of a model call: which errors are transient, and how long to wait.

The policy is 10xGraph's: the primary model is tried up to ``max_retries + 1`` times with
exponential back-off on transient errors (HTTP 429/500/502/503/529, timeouts, connection errors),
then each fallback model the same way; a permanent error (400, 401, ...) moves straight to the
next model. One difference: the SDK's own hidden retries are off (``max_retries=0`` on the
client unless you pass one), so ``retry_config`` is the whole policy and a test can count the
requests it causes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_RETRY_CONFIG", "CircuitBreaker", "RetryConfig", "backoff_delay", "is_retryable", "status_code"]


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """Retry and fallback settings of an ``Agent`` (10xGraph's fields and defaults).

    ``circuit_breaker_*``: after ``circuit_breaker_threshold`` failed cycles of one model in a
    row, skip it for ``circuit_breaker_reset_timeout`` seconds (then one trial), going straight
    to the next fallback."""

    max_retries: int = 3
    initial_delay: float = 1.0
    max_delay: float = 30.0
    backoff_factor: float = 2.0
    retryable_status_codes: frozenset[int] = field(default_factory=lambda: frozenset({429, 500, 502, 503, 529}))
    circuit_breaker_enabled: bool = False
    circuit_breaker_threshold: int = 5
    circuit_breaker_reset_timeout: float = 30.0

    def __post_init__(self) -> None:
        from tenxgraph.core.llm.errors import ModelConfigError

        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ModelConfigError(f"RetryConfig.max_retries must be an int >= 0, got {self.max_retries!r}",
                                   "LLM_CONFIG_003")
        for name in ("initial_delay", "max_delay", "backoff_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
                raise ModelConfigError(f"RetryConfig.{name} must be a number >= 0, got {value!r}", "LLM_CONFIG_003")


DEFAULT_RETRY_CONFIG = RetryConfig()


# An error event inside a stream that answered 200: the SDKs raise it with the stream's status
# (Anthropic's ``overloaded_error`` event) or none (OpenAI's ``server_error`` chunk), so the
# error's type says what HTTP status the same failure has before a stream starts.
_IN_STREAM_STATUS = {"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429, "server_error": 500,
                     "rate_limit_exceeded": 429, "service_unavailable": 503}


def _in_stream_status(exc: BaseException) -> int | None:
    body = getattr(exc, "body", None)
    kind = body.get("error", body) if isinstance(body, dict) else None
    kind = kind.get("type") if isinstance(kind, dict) else None
    if not isinstance(kind, str):
        kind = getattr(exc, "type", None)
    return _IN_STREAM_STATUS.get(kind) if isinstance(kind, str) else None


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of an SDK error, from its structured fields only (never its text). An
    error event inside a stream gets the status of the same failure outside one (529 for
    Anthropic's ``overloaded_error``): the stream's own 200 (or none) said nothing about it, and
    such an error was neither retried nor reported as the provider's."""
    values = [getattr(exc, "status_code", None), getattr(getattr(exc, "response", None), "status_code", None)]
    if type(exc).__module__.startswith("google."):
        values.append(getattr(exc, "code", None))  # google-genai's APIError carries the status as ``code``
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return (_in_stream_status(exc) or value) if value == 200 else value
    return _in_stream_status(exc)


def is_retryable(exc: BaseException, cfg: RetryConfig) -> bool:
    """Whether ``exc`` is transient under ``cfg``: an HTTP status in ``retryable_status_codes``, or,
    without a status, a connection error or timeout (by class or class name)."""
    status = status_code(exc)
    if status is not None:
        return status in cfg.retryable_status_codes
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    name = type(exc).__name__.lower()
    # "connect": httpx's ConnectError, which google-genai lets through, is not a ConnectionError.
    return any(word in name for word in ("timeout", "connect", "unavailable"))


def backoff_delay(exc: BaseException, cfg: RetryConfig, retry: int) -> float:
    """10xGraph's exponential delay; a server's ``Retry-After`` (seconds) wins, capped the same."""
    try:
        delay = cfg.initial_delay * (cfg.backoff_factor**retry)
    except OverflowError:  # 2.0 ** 1024, or a huge factor: past any max_delay
        delay = math.inf if cfg.initial_delay > 0 else 0.0
    if delay != delay:  # 0 * inf
        delay = 0.0
    headers = getattr(getattr(exc, "response", None), "headers", None)
    raw = headers.get("retry-after") if headers is not None else None
    if raw is not None:
        try:
            delay = float(raw)
        except ValueError:
            pass
    return max(0.0, min(delay, cfg.max_delay))


class CircuitBreaker:
    """Open after ``threshold`` consecutive failed cycles; half-open after ``reset_timeout``."""

    def __init__(self, threshold: int, reset_timeout: float) -> None:
        self.threshold = max(1, threshold)
        self.reset_timeout = reset_timeout
        self.failures = 0
        self.opened_at: float | None = None

    def allow(self) -> bool:
        """Whether a call may go to the model: closed, or open for at least ``reset_timeout`` (a trial).
        Not thread-safe: one breaker per agent on one loop."""
        if self.opened_at is None:
            return True
        return time.monotonic() - self.opened_at >= self.reset_timeout

    def retry_after(self) -> float:
        """Seconds until an open breaker allows a trial; 0 when closed."""
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.reset_timeout - (time.monotonic() - self.opened_at))

    def success(self) -> None:
        """Closes the breaker and forgets the failures."""
        self.failures, self.opened_at = 0, None

    def failure(self) -> None:
        """Counts one failed cycle; opens (or, half-open, re-opens) the breaker at ``threshold``."""
        self.failures += 1
        if self.opened_at is not None or self.failures >= self.threshold:
            self.opened_at = time.monotonic()


def describe(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {exc}"[:500], "status_code": status_code(exc)}
