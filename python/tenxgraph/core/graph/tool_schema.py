"""OpenAI function schemas for local tools, restricted to a portable JSON Schema subset.

The ``parameters`` object goes verbatim to providers whose schema parsers are often weak,
so the output never uses ``$ref``, ``anyOf``, ``allOf`` or ``title``: nested models are
inlined by hand instead of taken from ``model_json_schema()``. Annotations outside the
subset raise :class:`UnsupportedToolParameterError` when the schema is built, because a
silent ``{"type": "string"}`` fallback makes the model send malformed arguments later.
``@tool(parameters=...)`` bypasses generation for anything the subset cannot express.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import inspect
import pathlib
import sys
import types
import typing
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python
from typing_extensions import is_typeddict

__all__ = [
    "INJECTABLE_PARAMS",
    "UnsupportedToolParameterError",
    "function_schema",
    "is_inject_default",
    "model_visible_params",
    "resolve_hints",
    "tool_name",
]

# Supplied by the runtime (or by DI), never by the model, so never advertised.
# ``idempotency_key`` is ours: the runtime derives it from the ledger key.
INJECTABLE_PARAMS: frozenset[str] = frozenset(
    {
        "tool_call_id",
        "state",
        "config",
        "emit",
        "generated_id",
        "context_manager",
        "publisher",
        "checkpointer",
        "store",
        "task_manager",
        "idempotency_key",
    }
)

_MAX_DEPTH = 8
_NO_DESCRIPTION = "No description provided."
_HELP = (
    "Supported: str, int, float, bool, datetime, date, time, UUID, Path, bytes, Decimal, "
    "Optional[X], list[X], dict, dict[str, X], Literal, Enum, pydantic models and "
    "dataclasses. Pass @tool(parameters={...}) to supply a schema by hand."
)

# Exact-type lookups on purpose: ``bool`` is an ``int`` and ``datetime`` is a ``date``,
# and a ``class Color(str, Enum)`` must reach the enum branch, not the str one.
_PRIMITIVES: dict[type, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}
_SCALARS: dict[type, dict[str, Any]] = {
    dt.datetime: {"type": "string", "format": "date-time"},
    dt.date: {"type": "string", "format": "date"},
    dt.time: {"type": "string", "format": "time"},
    uuid.UUID: {"type": "string", "format": "uuid"},
    bytes: {"type": "string"},
    decimal.Decimal: {"type": "number"},
}


class UnsupportedToolParameterError(TypeError):
    """A tool parameter's annotation has no portable JSON Schema.

    A TypeError subclass so ``except TypeError`` around tool registration still works.
    """


def tool_name(fn: Callable[..., Any]) -> str:
    """The name advertised to the model: ``@tool(name=...)``, else ``__name__``."""
    return getattr(fn, "_py_tool_name", None) or getattr(fn, "__name__", type(fn).__name__)


def is_inject_default(default: Any) -> bool:
    """An injectq ``Inject[...]`` default; matched by class name as injectq is optional."""
    return default is not inspect.Parameter.empty and "Inject" in type(default).__name__


def _hint_target(fn: Callable[..., Any]) -> Any:
    # partial and callable instances carry no annotations of their own.
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) and hasattr(fn, "__call__"):
        return fn.__call__
    return fn


def _hints_of(obj: Any, raw: dict[str, Any], globalns: dict[str, Any]) -> dict[str, Any]:
    """Resolve annotations in bulk; on failure one by one, leaving unresolvable ones as
    strings so an injected parameter's TYPE_CHECKING-only import does not poison the rest."""
    try:
        return typing.get_type_hints(obj, include_extras=True)
    except Exception:  # noqa: BLE001 - any resolution error means: go one by one
        pass
    resolved: dict[str, Any] = {}
    for key, annotation in raw.items():

        def holder() -> None:
            """A scratch function that carries just this one annotation."""

        holder.__annotations__ = {key: annotation}
        try:
            resolved[key] = typing.get_type_hints(holder, globalns, include_extras=True)[key]
        except Exception:  # noqa: BLE001
            resolved[key] = annotation if isinstance(annotation, str) else str(annotation)
    return resolved


def resolve_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Parameter annotations of ``fn``; a name that cannot be resolved stays a string."""
    target = _hint_target(fn)
    raw = dict(getattr(target, "__annotations__", None) or {})
    globalns = getattr(inspect.unwrap(target), "__globals__", {})
    return _hints_of(target, raw, globalns)


def model_visible_params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters the model fills: not variadic, not injectable, not ``Inject[...]``."""
    return [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p.name not in INJECTABLE_PARAMS
        and not is_inject_default(p.default)
    ]


def function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool schema ``{"type": "function", "function": {...}}`` of ``fn``."""
    name = tool_name(fn)
    description = (
        getattr(fn, "_py_tool_description", None) or inspect.getdoc(fn) or _NO_DESCRIPTION
    )
    override = getattr(fn, "_py_tool_parameters", None)
    parameters = override if override is not None else _parameters_schema(fn, name)
    function: dict[str, Any] = {
        "name": name,
        "description": description,
        "parameters": parameters,
    }
    capabilities = getattr(fn, "_py_tool_capabilities", None)
    if capabilities is not None:
        function["x-function-capabilities"] = capabilities
    return {"type": "function", "function": function}


def _parameters_schema(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    hints = resolve_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in model_visible_params(fn):
        annotation = hints.get(param.name, param.annotation)
        try:
            schema = _schema_for(annotation, (), 0)
        except UnsupportedToolParameterError as exc:
            raise UnsupportedToolParameterError(
                f"tool '{name}' ({getattr(fn, '__qualname__', name)}), "
                f"parameter '{param.name}': {exc}"
            ) from None
        schema = _with_default(schema, param.default)
        properties[param.name] = schema
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    return result


def _with_default(schema: dict[str, Any], default: Any) -> dict[str, Any]:
    if default is inspect.Parameter.empty or default is None:
        return schema
    try:
        return {**schema, "default": to_jsonable_python(default)}
    except Exception:  # noqa: BLE001 - a default with no JSON form is simply not advertised
        return schema


def _unwrap(annotation: Any) -> tuple[Any, str | None]:
    """Strip ``Annotated`` and ``NewType`` layers; keep a pydantic Field description."""
    description: str | None = None
    while True:
        if typing.get_origin(annotation) is Annotated:
            base, *extras = typing.get_args(annotation)
            for extra in extras:
                if isinstance(extra, FieldInfo) and extra.description:
                    description = extra.description
            annotation = base
        elif hasattr(annotation, "__supertype__"):
            annotation = annotation.__supertype__
        else:
            return annotation, description


def _schema_for(annotation: Any, seen: tuple[type, ...], depth: int) -> dict[str, Any]:
    annotation, description = _unwrap(annotation)
    schema = _schema_for_bare(annotation, seen, depth)
    return {**schema, "description": description} if description else schema


def _schema_for_bare(annotation: Any, seen: tuple[type, ...], depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        return {"type": "object"}
    if annotation in (inspect.Parameter.empty, Any):
        return {"type": "string"}
    if isinstance(annotation, str | typing.ForwardRef):
        raise UnsupportedToolParameterError(
            f"annotation {annotation!r} could not be resolved to a type (imported only under "
            "TYPE_CHECKING, or defined inside a function?). Define it at module scope."
        )
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:  # Optional[X] collapses to X
            return _schema_for(members[0], seen, depth)
        raise UnsupportedToolParameterError(
            f"union {annotation!r} has no portable schema (it would need anyOf). {_HELP}"
        )
    if origin is Literal:
        return _enum_schema(list(args))
    if annotation is list or origin is list:
        item = args[0] if args else Any
        return {"type": "array", "items": _schema_for(item, seen, depth + 1)}
    if annotation is dict or origin is dict:
        value = args[1] if len(args) == 2 else Any
        if value is Any:
            return {"type": "object"}
        return {"type": "object", "additionalProperties": _schema_for(value, seen, depth + 1)}
    if annotation in (set, frozenset, tuple) or origin in (set, frozenset, tuple):
        raise UnsupportedToolParameterError(
            f"{annotation!r} has no portable schema; use list[...] instead. {_HELP}"
        )
    if is_typeddict(annotation):
        raise UnsupportedToolParameterError(
            f"TypedDict {getattr(annotation, '__name__', annotation)!r} is not supported; "
            f"use a pydantic model or a dataclass. {_HELP}"
        )
    if isinstance(annotation, type) and origin is None:
        schema = _schema_for_class(annotation, seen, depth)
        if schema is not None:
            return schema
    raise UnsupportedToolParameterError(f"annotation {annotation!r} is not supported. {_HELP}")


def _schema_for_class(cls: type, seen: tuple[type, ...], depth: int) -> dict[str, Any] | None:
    if cls in _PRIMITIVES:
        return dict(_PRIMITIVES[cls])
    if cls in _SCALARS:
        return dict(_SCALARS[cls])
    if issubclass(cls, enum.Enum):
        return _enum_schema([member.value for member in cls])
    if issubclass(cls, BaseModel):
        return _object_schema(cls, _model_fields(cls), seen, depth)
    if dataclasses.is_dataclass(cls):
        return _object_schema(cls, _dataclass_fields(cls), seen, depth)
    if issubclass(cls, pathlib.PurePath):
        return {"type": "string"}
    for base in (bool, str, int, float):  # plain subclasses of a primitive
        if issubclass(cls, base):
            return dict(_PRIMITIVES[base])
    return None


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    # Typed from the member values, so an IntEnum is not advertised as strings.
    for json_type, check in (
        ("string", lambda v: isinstance(v, str)),
        ("boolean", lambda v: isinstance(v, bool)),
        ("integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
        ("number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    ):
        if values and all(check(v) for v in values):
            return {"type": json_type, "enum": values}
    return {"enum": values}


# One field of an object: (json key, annotation, required, default, description).
_Field = tuple[str, Any, bool, Any, str | None]


def _model_fields(model: type[BaseModel]) -> list[_Field]:
    fields: list[_Field] = []
    for name, info in model.model_fields.items():
        required = info.is_required()
        # A default_factory is not called at schema time: the field is optional, no default.
        default = (
            inspect.Parameter.empty
            if required or info.default_factory is not None
            else info.default
        )
        fields.append((info.alias or name, info.annotation, required, default, info.description))
    return fields


def _dataclass_fields(cls: type) -> list[_Field]:
    # Field.type is a raw string under `from __future__ import annotations`.
    raw = {f.name: f.type for f in dataclasses.fields(cls)}
    globalns = getattr(sys.modules.get(cls.__module__), "__dict__", {})
    hints = _hints_of(cls, raw, globalns)
    fields: list[_Field] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        has_default = f.default is not dataclasses.MISSING
        has_factory = f.default_factory is not dataclasses.MISSING
        default = f.default if has_default else inspect.Parameter.empty
        required = not (has_default or has_factory)
        fields.append((f.name, hints.get(f.name, f.type), required, default, None))
    return fields


def _object_schema(
    owner: type, fields: list[_Field], seen: tuple[type, ...], depth: int
) -> dict[str, Any]:
    if owner in seen:
        return {"type": "object"}  # a cycle: no $ref to point back with, so cut it here
    seen = (*seen, owner)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for key, annotation, is_required, default, description in fields:
        try:
            schema = _schema_for(annotation, seen, depth + 1)
        except UnsupportedToolParameterError as exc:
            raise UnsupportedToolParameterError(f"field '{owner.__name__}.{key}': {exc}") from None
        schema = _with_default(schema, default)
        if description:
            schema = {**schema, "description": description}
        properties[key] = schema
        if is_required:
            required.append(key)
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    return result
