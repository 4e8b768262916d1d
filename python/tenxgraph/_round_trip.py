"""Which fields of a model a load restores to their declared type, for ``_core.dump_walk``.

A state or a message is stored as JSON and a load validates that JSON back into the model. Where
a field declares a concrete type (``int``, ``tuple[int, int]``, ``datetime``, a model), the load
gives back that type; where it declares ``Any`` (or ``dict[str, Any]``, a bare ``list``, no
annotation), it gives back plain JSON values: a tuple there comes back a list, an int key a str,
a datetime its text, a model a dict. The walk reads this per class to tell whether a run's state
would come back from a load as it is (``tenxgraph._live_states`` keeps it only then).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

__all__ = ["model_shape"]

# Containers whose unparametrised form means "of Any".
_BARE = (dict, list, tuple, set, frozenset)


def model_shape(
    cls: type[BaseModel],
) -> tuple[frozenset[str], bool, dict[str, tuple[type, ...] | list[tuple[type, ...]]] | None]:
    """(the names of ``cls``'s fields declared loosely; whether an instance of ``cls`` may come
    back from its JSON as another value: a field is ``exclude=True``, or the class writes a value
    its load does not read back as it was, a custom serializer (``field_serializer``,
    ``model_serializer``, ``PlainSerializer`` / ``WrapSerializer``), or an alias a load does not
    accept by the field's name; field name -> the classes a load gives back there, for the other
    fields whose annotation is plain classes only or a sequence of them (``_exact_spec``), None when
    there are none).
    Called once per class by the walk, which keeps the answer.

    The plain classes: ``str``, ``float``, ``Point``, ``Point | None``, ``Annotated[int, ...]``.
    A value of another type there (a str enum in a ``str`` field, a bool in an ``int`` one, an
    int in a ``float`` one, a subclass of the declared model) is written as the declared type and
    comes back as it. Other annotations (dicts, fixed-length tuples, Literal, unions with generics)
    are not listed: the walk checks nothing for them."""
    fields = getattr(cls, "__pydantic_fields__", None) or {}
    loose = frozenset(name for name, info in fields.items() if _loose(info.annotation, 0))
    excludes = any(bool(info.exclude) for info in fields.values()) or _rewrites(cls, fields)
    exact = {name: spec for name, info in fields.items()
             if name not in loose and (spec := _exact_spec(info.annotation))}
    return loose, excludes, exact or None


def _exact_spec(tp: Any) -> tuple[type, ...] | list[tuple[type, ...]] | None:
    """What the walk checks of a field's value: a tuple of plain classes (the value's exact
    class is one of them), or, for a sequence of plain classes (``list[Point]``,
    ``tuple[int, ...]``, ``set[str]``), ``[container classes, item classes]``: a load gives
    back the declared container with each item as the declared class, so a subclass of the
    model in a ``list[Point]`` (or a tuple in a ``list`` field) comes back changed."""
    if typing.get_origin(tp) is typing.Annotated:
        return _exact_spec(typing.get_args(tp)[0])
    members = [m for m in (typing.get_args(tp) if _is_union(tp) else (tp,)) if m is not type(None)]
    if len(members) == 1:
        origin = typing.get_origin(members[0])
        args = typing.get_args(members[0])
        if origin in _SEQUENCES and args:
            if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
                return None  # a fixed-length tuple: its positions have types of their own
            items = _plain_classes(args[0])
            return [(origin,), items] if items else None
    return _plain_classes(tp)


# Sequences a load gives back as that container.
_SEQUENCES = (list, tuple, set, frozenset)


def _rewrites(cls: type[BaseModel], fields: dict[str, Any]) -> bool:
    decorators = getattr(cls, "__pydantic_decorators__", None)
    if decorators is not None:
        # The engine's own (Message's parsed_content serializer keeps what a load reads back).
        found = [*decorators.field_serializers.values(), *decorators.model_serializers.values()]
        if any(not _ours(d) for d in found):
            return True
    config = getattr(cls, "model_config", {}) or {}
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    for name, info in fields.items():
        alias = info.validation_alias if info.validation_alias is not None else info.alias
        if alias is not None and alias != name and not by_name and not cls.__module__.startswith("tenxgraph."):
            return True  # dumped by name, loaded by alias only: the load drops the value
        if any(_is_serializer(m) for m in info.metadata) or _annotation_serializes(info.annotation, 0):
            return True
    return False


def _ours(decorator: Any) -> bool:
    func = getattr(decorator, "func", None)
    func = getattr(func, "__func__", func)
    return str(getattr(func, "__module__", "") or "").startswith("tenxgraph.")


def _is_serializer(m: Any) -> bool:
    return type(m).__name__ in ("PlainSerializer", "WrapSerializer")


def _annotation_serializes(tp: Any, depth: int) -> bool:
    """A serializer inside the annotation (``list[Annotated[str, PlainSerializer(...)]]``)."""
    if depth > 20:
        return False
    if typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        if any(_is_serializer(m) for m in args[1:]):
            return True
        return _annotation_serializes(args[0], depth + 1)
    return any(_annotation_serializes(a, depth + 1) for a in typing.get_args(tp))


def _loose(tp: Any, depth: int) -> bool:
    """Whether some value this annotation admits comes back from JSON as plain JSON values
    rather than the type declared. Unknown shapes count as loose: that only costs a load."""
    if depth > 20 or tp is None or tp is Any or tp is object or tp is BaseModel:
        return True
    if isinstance(tp, (str, typing.ForwardRef, typing.TypeVar)):
        return True
    if tp in _BARE:
        return True
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _loose(args[0], depth + 1)
    if origin is typing.Literal:
        return False
    if origin is not None and not args and origin in _BARE:
        return True
    return any(_loose(a, depth + 1) for a in args if a is not Ellipsis and a is not type(None))


def _plain_classes(tp: Any) -> tuple[type, ...] | None:
    if typing.get_origin(tp) is typing.Annotated:
        return _plain_classes(typing.get_args(tp)[0])
    members = typing.get_args(tp) if _is_union(tp) else (tp,)
    out: list[type] = []
    for m in members:
        if m is type(None):
            continue
        if not isinstance(m, type) or typing.get_origin(m) is not None or getattr(m, "__parameters__", ()):
            return None  # a generic, a Literal, a nested union: not checked
        out.append(m)
    return tuple(out) or None


def _is_union(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin is typing.Union or origin is types.UnionType
