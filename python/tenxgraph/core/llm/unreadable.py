"""Replies the provider's SDK itself could not parse, told apart from every other failure.

An SDK that is handed a 200 whose body is not JSON, not text, or shorter than its length, or an
event stream cut in the middle of an event, lets a decoding error of its parser or of its HTTP
library through (``json.JSONDecodeError``, ``UnicodeDecodeError``, google-genai's
``UnknownApiResponseError``, httpx's ``RemoteProtocolError`` for a body cut short). Those are the
same failure as a reply our adapters cannot read: an ``UnreadableReplyError``, retried as a
dropped connection, then ``LLM_PROVIDER_005``.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Any, Callable, TypeVar

from pydantic import ValidationError

from tenxgraph.core.llm.errors import UnreadableReplyError

F = TypeVar("F", bound=Callable[..., Any])

# What reading a reply of an unexpected shape raises: a field that is null, a string where a list
# was, an id that is an int where our models want a string.
_SHAPE_ERRORS = (AttributeError, TypeError, KeyError, IndexError, ValidationError)

__all__ = ["as_unreadable", "reads_reply"]

# httpx / h11's words for a body that ended before its content-length or last chunk; the same
# class also says "Server disconnected without sending a response", a dropped connection.
_CUT_BODY = ("message body", "incomplete")


def _is_decode_failure(exc: BaseException) -> bool:
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return True
    cls = type(exc)
    if cls.__module__.startswith("google.genai") and cls.__name__ == "UnknownApiResponseError":
        return True
    if cls.__module__.startswith(("httpx", "httpcore")) and cls.__name__ in ("RemoteProtocolError", "DecodingError"):
        text = str(exc).lower()
        return cls.__name__ == "DecodingError" or any(w in text for w in _CUT_BODY)
    return False


def as_unreadable(exc: BaseException) -> BaseException:
    """``exc`` itself, or, when it (or an error it was raised from) is a decoding failure of
    the SDK's reply, an ``UnreadableReplyError`` whose ``__cause__`` is ``exc``. Never raises."""
    if isinstance(exc, UnreadableReplyError):
        return exc
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if _is_decode_failure(cur):
            out = UnreadableReplyError(f"the provider's reply could not be read by its SDK: "
                                       f"{type(cur).__name__}: {str(cur)[:200]}")
            out.__cause__ = exc
            return out
        cur = cur.__cause__ or cur.__context__
    return exc


def reads_reply(what: str) -> Callable[[F], F]:
    """Marks a function that turns a provider's reply into a ``Message``: a reply of a shape it
    cannot read (``message: null``, ``choices`` a string, a tool call without a name) is an
    ``UnreadableReplyError`` (retried, then ``LLM_PROVIDER_005``) instead of a bare
    ``AttributeError`` or ``TypeError`` without a code."""

    def wrap(fn: F) -> F:
        def unreadable(exc: BaseException) -> UnreadableReplyError:
            out = UnreadableReplyError(f"{what} could not be read: {type(exc).__name__}: {str(exc)[:200]}")
            out.__cause__ = exc
            return out

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def areading(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except _SHAPE_ERRORS as exc:
                    raise unreadable(exc) from exc

            return areading  # type: ignore[return-value]

        @functools.wraps(fn)
        def reading(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except _SHAPE_ERRORS as exc:
                raise unreadable(exc) from exc

        return reading  # type: ignore[return-value]

    return wrap
