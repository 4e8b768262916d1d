"""Which fields of a model a load restores to their declared type, for ``_core.dump_walk``.

A state or a message is stored as JSON and a load validates that JSON back into the model. Where
a field declares a concrete type (``int``, ``tuple[int, int]``, ``datetime``, a model), the load
gives back that type; where it declares ``Any`` (or ``dict[str, Any]``, a bare ``list``, no
annotation), it gives back plain JSON values: a tuple there comes back a list, an int key a str,
a datetime its text, a model a dict. The walk reads this per class to tell whether a run's state
would come back from a load as it is (``tenxgraph._live_states`` keeps it only then).
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

__all__ = ["model_shape"]

# Containers whose unparametrised form means "of Any".
_BARE = (dict, list, tuple, set, frozenset)


def model_shape(cls: type[BaseModel]) -> tuple[frozenset[str], bool]:
    """(the names of ``cls``'s fields declared loosely, whether a field is ``exclude=True``).
    Called once per class by the walk, which keeps the answer."""
    fields = getattr(cls, "__pydantic_fields__", None) or {}
    loose = frozenset(name for name, info in fields.items() if _loose(info.annotation, 0))
    excludes = any(bool(info.exclude) for info in fields.values())
    return loose, excludes


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
