"""How each parameter of a tool function is filled: from the model's arguments (validated by
its annotation), supplied by the runtime, or left to its default. Worked out once per tool."""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from tenxgraph.core.graph.tool_schema import INJECTABLE_PARAMS, is_inject_default, resolve_hints
from tenxgraph.logs import run_logger

_log = run_logger("tenxgraph.graph.tool_node")

# Injected by name from execute()'s own arguments; the other INJECTABLE_PARAMS are DI
# services this runtime does not provide, so they must carry a default.
_SUPPLIED = frozenset({"tool_call_id", "state", "config", "emit", "idempotency_key"})
_EMPTY = inspect.Parameter.empty


@dataclass(frozen=True)
class _Param:
    """How to fill one parameter, worked out once at registration."""

    name: str
    kind: inspect._ParameterKind
    default: Any
    source: str  # "supplied" | "skipped" | "model"
    adapter: TypeAdapter[Any] | None = None


def _adapter_for(annotation: Any) -> TypeAdapter[Any] | None:
    """A validator for model arguments, or None to pass the value through untouched."""
    if annotation is _EMPTY or isinstance(annotation, str):
        return None
    try:
        if isinstance(annotation, type) and (
            issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)
        ):
            return TypeAdapter(annotation)  # pydantic refuses a config for these
        # Models often send 42 for a str parameter; accept it rather than fail the call.
        return TypeAdapter(annotation, config=ConfigDict(coerce_numbers_to_str=True))
    except Exception:  # noqa: BLE001 - an annotation pydantic cannot validate: lenient
        _log.debug("no validator for annotation %r; arguments pass through", annotation)
        return None


def model_value(param: _Param, raw: Any, tool: str) -> Any:
    """The model's argument for ``param``, validated by its annotation. A string the annotation
    refuses is tried once more as JSON (weaker models send a nested object as its JSON text, as
    10xGraph accepts). Refused: a ``TypeError`` in 10xGraph's words, which the model reads
    (``Invalid argument 'p' for tool 't': field: why``), not pydantic's report with its URLs."""
    if param.adapter is None:
        return raw
    try:
        return param.adapter.validate_python(raw)
    except ValidationError as exc:
        refused = exc
    if isinstance(raw, str):
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = raw
        if not isinstance(decoded, str):
            try:
                return param.adapter.validate_python(decoded)
            except ValidationError:
                pass
    details = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or param.name}: {e['msg']}"
                        for e in refused.errors(include_url=False))
    raise TypeError(f"Invalid argument {param.name!r} for tool {tool!r}: {details}") from None


def _plan(fn: Callable[..., Any]) -> list[_Param]:
    hints = resolve_hints(fn)
    plan: list[_Param] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.VAR_KEYWORD:
            plan.append(_Param(p.name, p.kind, _EMPTY, "model"))
        elif p.name in _SUPPLIED:
            plan.append(_Param(p.name, p.kind, p.default, "supplied"))
        elif p.name in INJECTABLE_PARAMS or is_inject_default(p.default):
            plan.append(_Param(p.name, p.kind, p.default, "skipped"))
        else:
            annotation = hints.get(p.name, p.annotation)
            plan.append(_Param(p.name, p.kind, p.default, "model", _adapter_for(annotation)))
    return plan
