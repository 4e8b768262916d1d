"""A thread's state built from its stored text in one validation, without the cyclic GC paying
for it.

A long thread's load makes tens of thousands of container objects (messages, blocks, their dicts
and lists), none of them garbage. With the collector on, the young generations fill over and over
during the validation; with it merely paused, the first allocation after re-enabling collects
them all at once, and since they then survive into the oldest generation they also count towards
the next full collection, a pass over every object of the process. Profiled at 1,000 messages
that was as much time as the validation itself.

``gc.freeze()`` followed by ``gc.unfreeze()`` files every tracked object in the oldest generation
without a pass over any of them: that is where the loaded state would end up anyway, and it is
still collected there by full collections. Garbage cycles made before the load are collected
first (``gc.collect(0)``, the young generation only: a few hundred objects at most), so those are
not delayed. A process that froze objects of its own (``gc.get_freeze_count() > 0``, e.g. a
pre-fork server keeping its pages shared) is left as it is: unfreezing would release its objects,
so there the collector is only paused around the validation.

The validation itself runs on a copy of the state class's schema in which ``Message.content``
has no ``mode="before"`` validator (the one that turns a plain string into a ``TextBlock``).
From JSON, that Python function made pydantic-core build every message's content as Python
objects first and then validate those objects again: about a quarter of a cold load's time at
1,000 messages (issue 16). A stored state's content is always a list of blocks (it is a dump);
text the copy refuses (content stored as a string by hand, a field a user's validator rejects) is
validated again the usual way, so what loads and the errors a caller sees are the class's own.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import SchemaValidator

from tenxgraph.core.state.message import Message

__all__ = ["validate_stored_state"]

S = TypeVar("S", bound=BaseModel)

# Per state class: the validator of its stored text, or None where the class's schema has no
# Message content validator to leave out (its own validator is then used).
_stored_validators: weakref.WeakKeyDictionary[type, SchemaValidator | None] = weakref.WeakKeyDictionary()


def _is_text_to_block(node: dict[str, Any]) -> bool:
    fn = node.get("function", {}).get("function") if node.get("type") == "function-before" else None
    return fn is not None and getattr(fn, "__func__", None) is getattr(Message._text_to_block, "__func__", ())


def _without_text_to_block(node: Any, models: set[type]) -> tuple[Any, int]:
    """The schema ``node`` with each Message content validator replaced by the schema it wraps
    (copied where changed, shared elsewhere), and how many were replaced; ``models`` gets the
    model classes whose schemas were copied."""
    if isinstance(node, dict):
        if _is_text_to_block(node):
            inner, n = _without_text_to_block(node["schema"], models)
            return inner, n + 1
        out, total = {}, 0
        for key, value in node.items():
            out[key], n = _without_text_to_block(value, models)
            total += n
        if total and node.get("type") == "model":
            models.add(node["cls"])
        return (out, total) if total else (node, 0)
    if isinstance(node, (list, tuple)):
        parts = [_without_text_to_block(v, models) for v in node]
        total = sum(n for _, n in parts)
        return (type(node)(v for v, _ in parts), total) if total else (node, 0)
    return node, 0


def _stored_validator(state_type: type[BaseModel]) -> SchemaValidator | None:
    try:
        return _stored_validators[state_type]
    except KeyError:
        pass
    validator = None
    models: set[type] = set()
    try:
        schema, replaced = _without_text_to_block(state_type.__pydantic_core_schema__, models)
        if replaced:
            validator = _build(schema, models)
    except Exception:  # a schema this copy cannot be made of: the class's own validator serves
        validator = None
    _stored_validators[state_type] = validator
    return validator


def _build(schema: Any, models: set[type]) -> SchemaValidator | None:
    """A validator of ``schema`` built from the schema itself. pydantic-core reuses a model
    class's own validator for its schema where the class is complete (``__pydantic_complete__``
    in its ``__dict__``), which would bring the content validator back: the classes on the way
    to ``Message`` are marked incomplete while it builds. A build that reused one anyway (another
    pydantic-core) is not used: loads then go as before."""
    marked = [cls for cls in models if cls.__dict__.get("__pydantic_complete__") is True]
    for cls in marked:
        cls.__pydantic_complete__ = False  # type: ignore[attr-defined]
    try:
        validator = SchemaValidator(schema)
    finally:
        for cls in marked:
            cls.__pydantic_complete__ = True  # type: ignore[attr-defined]
    try:
        validator.validate_python({"context": [{"role": "user", "content": "s"}]})
    except ValidationError as exc:
        # The content validator is gone: a string is no list any more.
        gone = any(e["loc"][-1:] == ("content",) and e["type"] == "list_type" for e in exc.errors())
        return validator if gone else None
    except Exception:
        return None
    return None


def validate_stored_state(state_type: type[S], text: bytes | str) -> S:
    """``state_type.model_validate_json(text)`` with the load's objects filed in the oldest GC
    generation (see the module notes). The collector is enabled again on every exit, an
    exception included, exactly when it was enabled on entry."""
    enabled = gc.isenabled()
    if enabled:
        gc.collect(0)
    gc.disable()
    try:
        fast = _stored_validator(state_type)
        try:
            state = fast.validate_json(text) if fast is not None else state_type.model_validate_json(text)
        except ValidationError:
            state = state_type.model_validate_json(text)
        if enabled and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        return state
    finally:
        if enabled:
            gc.enable()
