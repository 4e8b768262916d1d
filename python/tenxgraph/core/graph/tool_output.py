"""What a tool returned, as the output of its ToolResultBlock: JSON data the store keeps and
reads back exactly, or else its text form. Never raises: the tool already ran."""

from __future__ import annotations

import dataclasses
import math
import reprlib
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from tenxgraph._state_codec import CORE_INT_MAX, CORE_INT_MIN
from tenxgraph.logs import run_logger

_log = run_logger("tenxgraph.graph.tool_node")

# How deep a tool result may nest and still be kept as JSON. The core's JSON parser stops at 128
# levels, and a result sits a few levels down in what is stored (ledger envelope, message, state
# document, cache entry); deeper results are kept as their str().
MAX_RESULT_DEPTH = 100


def _json_safe(value: Any) -> Any:
    """``value`` as plain JSON data; unknown objects inside become their str()."""
    return to_jsonable_python(value, fallback=str)


_PLAIN, _CONVERT, _TEXT = 0, 1, 2


def _json_verdict(value: Any) -> int:
    """Whether ``value`` can be stored as JSON and read back equal: ``_PLAIN`` (it is JSON data
    already), ``_CONVERT`` (it holds objects that pydantic turns into JSON, e.g. datetimes) or
    ``_TEXT`` (nesting past MAX_RESULT_DEPTH, NaN/inf, a non-str key, which JSON would rename or
    fold into another key, or an int past 64 bits, which would come back as a float). A cycle
    counts as too deep. Iterative: a deep value must not exhaust the Python stack here."""
    verdict = _PLAIN
    # Containers to look into, with their depth; scalars are checked where they are found, so
    # the common case (a flat dict of strings and numbers) never touches the stack.
    stack: list[tuple[Any, int]] = [((value,), -1)]
    while stack:
        container, depth = stack.pop()
        if depth >= MAX_RESULT_DEPTH:
            return _TEXT
        if type(container) is dict:
            for key in container:
                if type(key) is not str:
                    return _TEXT
            children: Any = container.values()
        else:
            children = container
        for child in children:
            kind = type(child)
            if kind is str or kind is bool or child is None:
                continue
            if kind is int:
                if not CORE_INT_MIN <= child <= CORE_INT_MAX:
                    return _TEXT
            elif kind is float:
                if not math.isfinite(child):
                    return _TEXT
            elif kind is dict or kind is list or kind is tuple:
                stack.append((child, depth + 1))
            else:
                verdict = _CONVERT
    return verdict


# str() of a value too deep for the interpreter's recursion limit fails; a shortened repr does
# not (reprlib stops at maxlevel).
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 20
_SHORT_REPR.maxdict = _SHORT_REPR.maxlist = _SHORT_REPR.maxtuple = _SHORT_REPR.maxset = 100
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = _SHORT_REPR.maxlong = 2000


def holds_as_json(value: Any) -> bool:
    """Whether ``value`` (plain JSON data) is stored and read back exactly: see _json_verdict."""
    return _json_verdict(value) == _PLAIN


def _as_text(result: Any) -> str:
    """The documented form of a result JSON cannot hold: its str()."""
    try:
        return str(result)
    except Exception:  # noqa: BLE001 - e.g. RecursionError: still an answer, not a failure
        try:
            return _SHORT_REPR.repr(result)
        except Exception:  # noqa: BLE001
            return f"<{type(result).__name__} result that has no text form>"


def _as_json(result: Any) -> Any:
    """``result`` as JSON data the store keeps exactly, or None when it cannot be."""
    if isinstance(result, BaseModel):
        output: Any = result.model_dump(mode="json")
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        output = _json_safe(dataclasses.asdict(result))
    else:
        verdict = _json_verdict(result)
        if verdict == _TEXT:
            return None
        output = _json_safe(result)  # a copy: the tool may keep changing its own object
        if verdict == _PLAIN:
            return output
    return output if _json_verdict(output) == _PLAIN else None


def _normalise_output(result: Any) -> Any:
    """A tool's return value as a ToolResultBlock output that is always JSON the store keeps
    exactly: JSON data as such, anything else as its str(). Never raises: the tool already ran,
    and its answer must reach the model as the success it was."""
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    if isinstance(result, BaseModel | dict | list | tuple) or (
        dataclasses.is_dataclass(result) and not isinstance(result, type)
    ):
        try:
            output = _as_json(result)
        except Exception:  # noqa: BLE001 - what pydantic cannot dump: the text form
            output = None
        if output is not None:
            return output
        _log.info("tool result kept as its str(): JSON cannot hold it as it is", extra={"event": "tool_result_as_text"})
    return _as_text(result)


# 10xGraph 0.10's reading of a returned dict's own verdict on itself (facts of its API: these
# words, compared lower-cased).
_OK_WORDS = frozenset({"completed", "success", "ok", "done", "true", "1"})
_FAIL_WORDS = frozenset({"failed", "failure", "error", "false", "0"})
_ERROR_WORDS = frozenset({"true", "1", "yes", "error", "failed", "failure"})


def _says(value: Any, words: frozenset[str]) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in words


def _reports_error(data: dict[str, Any]) -> bool:
    """Whether a returned dict says it failed, as 10xGraph reads it: ``is_error`` (else
    ``error``) when present, else ``success``; a ``status`` of a failure word fails it too. Unlike
    10xGraph, the keys stay in the output: it deleted them, so ``{"error": "not found"}`` reached
    the model as ``{}``."""
    flag = data["is_error"] if "is_error" in data else data.get("error")
    if flag is not None:
        failed = _says(flag, _ERROR_WORDS)
    elif data.get("success") is not None:
        failed = not _says(data["success"], _OK_WORDS)
    else:
        failed = False
    status = data.get("status")
    return failed or (status is not None and str(status).lower() in _FAIL_WORDS)


def _fields(result: Any) -> dict[str, Any] | None:
    """The dict 10xGraph makes of a returned object: a dict itself, a model's or a dataclass's
    dump; None for anything else."""
    if isinstance(result, dict):
        return result
    if isinstance(result, BaseModel):
        dumped = result.model_dump(mode="json")
        return dumped if isinstance(dumped, dict) else None
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    # 10xGraph also took any other object's __dict__ ([{}] for most, its text lost): such an
    # object stays its str() here, which is what the model can read.
    return None


def shape_plain_result(result: Any) -> tuple[Any, bool]:
    """A tool's plain return value (not a ToolResult or a Message) as 10xGraph 0.10 hands it to
    the model, with whether it reports a failure: a str as it is; a dict (or a model's or a
    dataclass's fields) as a one-item list of it, read by ``_reports_error``; a list
    item by item, each item not a dict as ``{"content": item}``; anything else (None, a number, a
    tuple) as its str(). Then ``_normalise_output`` keeps the store exact."""
    if isinstance(result, str):
        return result, False
    try:
        fields = _fields(result)
    except Exception:  # noqa: BLE001 - a dump that fails: the text form, as for any such value
        fields = None
    if fields is not None:
        return _normalise_output([fields]), _reports_error(fields)
    if isinstance(result, list):
        return _normalise_output([item if isinstance(item, dict) else {"content": item} for item in result]), False
    return _as_text(result), False
