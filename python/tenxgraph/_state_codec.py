"""The stored form of a state: its JSON dump plus a class header under ``STATE_META_KEY``.

Both the run (which writes steps) and the checkpointers (which read and write whole states) use
it, so it lives below both: a checkpointer must not import the run to learn its own format.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any, get_args

import pydantic
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, SchemaSerializer

from tenxgraph import _core
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message

__all__ = ["STATE_META_KEY", "encode_message", "encode_state", "encode_state_meta", "encode_state_text"]

# pydantic >= 2.7 turns its serializer warnings into an error on request; older ones keep warning
# (and store what they dumped, as before).
_STRICT: Any = "error" if tuple(int(p) for p in pydantic.VERSION.split(".")[:2]) >= (2, 7) else True

# The stores read it (the write mark lives in it), so the key is theirs.
STATE_META_KEY: str = _core.STATE_META_KEY


def encode_state_meta(state: AgentState) -> dict[str, Any]:
    """The header a stored state carries: the format version and the state's class name."""
    return {"format": 1, "class": type(state).__name__}


def _loadable(model: type[BaseModel], data: Any, what: str) -> None:
    """A dump pydantic warned about (a field assigned a value of another type: assignments are
    not validated) is stored only when it loads back; else ValueError, so the run ends like a
    node that raised instead of leaving a thread no load can read."""
    try:
        model.model_validate_json(data) if isinstance(data, str) else model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{what} cannot be stored: it would not load back ({exc.error_count()} "
                         f"invalid field(s)): {exc}") from None


def encode_state(state: AgentState, *, with_context: bool) -> dict[str, Any]:
    """The stored form of a state: its JSON dump plus the class header. Steps store the context
    as message rows, so they leave it out. ValueError for a state that would not load back."""
    exclude = None if with_context else {"context"}
    try:
        data = state.model_dump(mode="json", exclude=exclude, warnings=_STRICT)
    except PydanticSerializationError:
        data = state.model_dump(mode="json", exclude=exclude, warnings=False)
        _loadable(type(state), data, f"the state ({type(state).__name__})")
    data[STATE_META_KEY] = encode_state_meta(state)
    return data


def encode_state_text(state: AgentState) -> str:
    """``json.dumps(encode_state(state, with_context=False))`` in one pass where that writes the
    same values: the state's JSON written by pydantic-core with NaN and infinities as tokens
    (see ``_nan_visible``), the class header appended to it. About 5% of a memory turn's
    instructions went to the dump to Python objects and the second pass over them.

    Only for a class with no ``float`` outside ``context`` (``_one_dump``): pydantic-core writes
    a field typed ``float`` (nested models, dataclasses, ``list[float]`` included) as ``null``
    for NaN whatever its serializer's config, so such a class keeps the two passes, where
    ``json.dumps`` writes the token the engine refuses. Values typed ``Any`` follow the config."""
    cls = type(state)
    if not _one_dump(cls):
        return json.dumps(encode_state(state, with_context=False))
    try:
        body = _nan_visible(cls).to_json(state, exclude={"context"}, warnings=_STRICT)
    except PydanticSerializationError:
        return json.dumps(encode_state(state, with_context=False))  # checks it loads back
    header = _HEADERS.get(cls)
    if header is None:
        header = _HEADERS[cls] = json.dumps({STATE_META_KEY: encode_state_meta(state)})[1:].encode()
    # body is a JSON object: its closing brace gives way to the header's key.
    return (body[:-1] + (b"," if len(body) > 2 else b"") + header).decode()


_HEADERS: dict[type, bytes] = {}
_ONE_DUMPS: dict[type, bool] = {}


def _one_dump(cls: type[BaseModel]) -> bool:
    """No ``float`` schema reachable from ``cls``'s fields other than ``context`` (definitions
    followed); decided once per class."""
    ok = _ONE_DUMPS.get(cls)
    if ok is None:
        ok = _ONE_DUMPS[cls] = not _schema_has_float(cls.__pydantic_core_schema__, skip_field="context")
    return ok


def _schema_has_float(schema: Any, *, skip_field: str) -> bool:
    defs: dict[str, Any] = {}
    stack: list[Any] = [schema]
    while stack:  # every definition, wherever it sits
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "definitions":
                defs.update((d["ref"], d) for d in node.get("definitions", []) if isinstance(d, dict) and "ref" in d)
            if "ref" in node:
                defs.setdefault(node["ref"], node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    top = schema.get("schema") if schema.get("type") == "definitions" else schema
    fields = top.get("schema", {}).get("fields", {}) if top.get("type") == "model" else None
    if not isinstance(fields, dict):
        return True  # not the plain model layout: keep the two passes
    seen: set[str] = set()
    stack = [f for name, f in fields.items() if name != skip_field]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = node.get("type")
            if kind in ("float", "complex"):
                return True
            if kind == "definition-ref":
                ref = node.get("schema_ref")
                if ref not in defs:
                    return True
                if ref not in seen:
                    seen.add(ref)
                    stack.append(defs[ref])
            stack.extend(v for k, v in node.items() if k not in ("metadata", "ref"))
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return False


_NAN_VISIBLE: dict[type, SchemaSerializer] = {}


def _nan_visible(cls: type[BaseModel]) -> SchemaSerializer:
    """``cls``'s JSON serializer with NaN and infinities written as the tokens ``NaN`` /
    ``Infinity``, which are not JSON, instead of pydantic's default ``null``. The engine's JSON
    check then refuses such a message as it refuses such a state; with ``null`` a float in a
    message's metadata, raw payload or tool-call arguments was stored changed, silently. The
    user's own ``model_dump_json`` keeps pydantic's default: only the copy made here differs."""
    ser = _NAN_VISIBLE.get(cls)
    if ser is None:
        schema = copy.deepcopy(cls.__pydantic_core_schema__)
        stack: list[Any] = [schema]
        while stack:  # every model in it (blocks, usages) carries its own config
            node = stack.pop()
            if isinstance(node, dict):
                if node.get("type") == "model" and isinstance(node.get("config"), dict):
                    node["config"]["ser_json_inf_nan"] = "constants"
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        ser = _NAN_VISIBLE[cls] = SchemaSerializer(schema, {"ser_json_inf_nan": "constants"})
    return ser


_FLOAT_FIELDS: dict[type, tuple[str, ...]] = {}


def _mentions_float(annotation: Any) -> bool:
    """``float`` anywhere in the annotation: ``float | None``, ``list[float]``,
    ``dict[str, tuple[float, ...]]``."""
    return annotation is float or any(_mentions_float(a) for a in get_args(annotation))


def _nonfinite_in(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_nonfinite_in(v) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_nonfinite_in(v) for v in value)
    return False


def _typed_nonfinite(message: Message) -> bool:
    """A NaN or infinity in a field of the message itself typed with ``float`` (``timestamp``,
    a subclass's ``float``, ``list[float]``, ``dict[str, float]``...). ``_nan_visible`` does not
    reach those: the outermost model instance is written by its class's own serializer
    (pydantic-core 2.50), whose float fields write such a value as ``null`` whatever config the
    outer serializer has. Nested models (an image block's
    ``bbox``) and inferred values (``metadata``, ``raw``, tool-call arguments) do follow it:
    ``tests_py/test_bad_input_catalogue.py`` checks all three."""
    cls = type(message)
    names = _FLOAT_FIELDS.get(cls)
    if names is None:
        names = _FLOAT_FIELDS[cls] = tuple(n for n, f in cls.model_fields.items() if _mentions_float(f.annotation))
    return any(_nonfinite_in(getattr(message, name, None)) for name in names)


def encode_message(message: Message) -> str:
    """A message's stored JSON; ValueError for one that would not load back (e.g. ``tools_calls``
    assigned something that is not a list of dicts). A NaN or infinite float is written as a
    token no JSON parser takes, so the store refuses it (see ``_nan_visible`` and
    ``_typed_nonfinite``)."""
    if _typed_nonfinite(message):
        # The dict dump keeps the float and json.dumps writes the token the engine refuses.
        return json.dumps(message.model_dump(mode="json", warnings=False))
    ser = _nan_visible(type(message))
    try:
        return ser.to_json(message, warnings=_STRICT).decode()
    except PydanticSerializationError:
        text = ser.to_json(message, warnings=False).decode()
        _loadable(type(message), text, f"message {message.message_id} ({message.role})")
        return text
