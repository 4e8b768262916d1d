"""A None in a field whose type does not allow it, refused before it is stored.

Assignments to a pydantic model are not validated, and pydantic's serializer writes such a None
as ``null`` without a warning, so the load-back check that guards the other wrong-typed values
(``_state_codec._loadable``, run only when the serializer warned) never ran: the state was
stored, and every later load of the thread raised a raw ``ValidationError`` (helper red-team,
session 27: ``"state": {"note": None}`` on ``note: str``, ``aput_state`` of a state whose
``execution_meta`` is None). Checked by name and type per class, once; per commit a dict lookup
per field, nested models included.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from pydantic import BaseModel

__all__ = ["UnstorableValue", "refuse_required_nulls"]


class UnstorableValue(ValueError):
    """A value the stored form cannot hold, named by where it sits (the input update's check
    puts the key in front). ``error_code`` STORAGE_SERIALIZATION_001, as the other typed errors
    carry one (it had none)."""

    error_code = "STORAGE_SERIALIZATION_001"


# Caches keyed by a class keep it alive: a process that makes a state class per request kept
# every one (~22 KB each; 10xGraph 0.10 the same; soak red-team, session 35). Cleared when full:
# each entry is cheap to compute again.
CLASS_CACHE_SIZE = 256

# Per model class: [(field, type name, model class the field holds or None)].
_PLANS: dict[type, list[tuple[str, str, type[BaseModel] | None]]] = {}
_UNIONS = (typing.Union, types.UnionType)
_QUALIFIED = re.compile(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)")  # typing.List, pkg.mod.Class -> the last name


def _allows_none(tp: Any) -> bool:
    """Whether a field of type ``tp`` may hold None. Only plain classes and their generics
    (``str``, ``list[Message]``, a model) are taken to refuse it; anything this cannot read
    (a TypeVar, a NewType, a type alias object) is left unchecked, as before."""
    if tp is None or tp is type(None) or tp is Any or tp is object:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _allows_none(typing.get_args(tp)[0])
    if origin in _UNIONS:
        return any(_allows_none(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return None in typing.get_args(tp)
    return not (isinstance(tp, type) or isinstance(origin, type))


def _model_in(tp: Any) -> type[BaseModel] | None:
    """The model class a field of type ``tp`` holds (``M`` or ``M | None``), else None."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if typing.get_origin(tp) in _UNIONS:
        models = [m for a in typing.get_args(tp) if (m := _model_in(a)) is not None]
        return models[0] if len(models) == 1 else None
    return None


def _plan(cls: type[BaseModel]) -> list[tuple[str, str, type[BaseModel] | None]]:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = []
        for name, f in cls.model_fields.items():
            tp = f.annotation
            checked = not _allows_none(tp)
            model = _model_in(tp)
            if checked or model is not None:
                plain = isinstance(tp, type) and not typing.get_args(tp)
                shown = tp.__name__ if plain else _QUALIFIED.sub(r"\1", str(tp))
                plan.append((name, shown if checked else "", model))
        if len(_PLANS) >= CLASS_CACHE_SIZE:
            _PLANS.clear()
        _PLANS[cls] = plan
    return plan


def refuse_required_nulls(model: BaseModel, what: str, *, skip: str | None = None, _path: str = "") -> None:
    """ValueError naming the first field of ``model`` (or of a model it holds) that is None
    where its type does not allow None; ``skip``: a top-level field left out."""
    values = model.__dict__
    for name, shown, nested in _plan(type(model)):
        if name == skip:
            continue
        value = values.get(name)
        if value is None:
            if shown:
                raise UnstorableValue(f"{what} cannot be stored: field {_path}{name} is None, which its type "
                                      f"({shown}) does not allow, so it would not load back; nothing of it was stored")
        elif nested is not None and isinstance(value, BaseModel):
            refuse_required_nulls(value, what, _path=f"{_path}{name}.")
