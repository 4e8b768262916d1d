"""The stored form of a state: its JSON dump plus a class header under ``STATE_META_KEY``.

Both the run (which writes steps) and the checkpointers (which read and write whole states) use
it, so it lives below both: a checkpointer must not import the run to learn its own format.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pydantic_core
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from tenxgraph import _core
from tenxgraph._required_nulls import CLASS_CACHE_SIZE, UnstorableValue, refuse_required_nulls
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message

__all__ = ["STATE_META_KEY", "STORED_DEPTH", "core_refuses", "encode_message", "encode_message_shaped", "encode_state", "encode_state_meta",
           "encode_state_shaped", "encode_state_text", "refuse_nonfinite"]

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
        raise UnstorableValue(f"{what} cannot be stored: it would not load back ({exc.error_count()} "
                              f"invalid field(s)): {exc}") from None


def refuse_nonfinite(value: Any, what: str, *, skip: str | None = None, exact_ints: bool = False) -> bool:
    """ValueError naming the first NaN or infinite float in ``value`` (``skip``: a top-level
    field left out). pydantic-core writes such a float as ``null`` in most places (a field typed
    ``float``, in the model or in a nested model, dataclass or list: each model instance is
    written by its own class's serializer, whatever config the caller's has) and as a token no
    JSON parser takes in others (a value typed ``Any``). A ``null`` stored in place of the float
    is a silent change, so every stored form looks first (``_core.dump_walk``, a walk in
    Rust) and is refused by name, as the engine refuses any text that is not JSON. Returns
    whether a load of the value's JSON would give back something else (``reshaped``, the same
    walk: see ``tenxgraph._round_trip``).

    ``exact_ints`` (a state's fields): an int past 64 bits is refused too. The engine parses a
    state, and its JSON numbers turn such an int into a float: a node's 2**70 + 1 was stored as
    1.1805916207174113e+21, without a word (a message is stored as its text and keeps it)."""
    found, reshaped = _core.dump_walk(value, skip, exact_ints)
    if found is not None:
        path, text = found
        if text == _INT_PAST_64:
            raise UnstorableValue(f"{what} cannot be stored: {path} is an integer past 64 bits, which a state's "
                                  "JSON does not keep exactly (it would come back a float); store it as a str. "
                                  "Nothing of it was stored")
        raise UnstorableValue(f"{what} is not valid JSON: {path} is {text}, which JSON cannot hold; "
                              "nothing of it was stored")
    return reshaped


_INT_PAST_64 = "an integer past 64 bits"  # dump_walk's text for such a find


# The ints the core's JSON numbers hold exactly (i64 and u64); past them its parser refuses the
# text ("number out of range") or a value would come back a float.
CORE_INT_MIN, CORE_INT_MAX = -(2**63), 2**64 - 1


# The levels of nesting a stored JSON document may have: the stores refuse deeper text at its
# commit (src/store/types.rs, LOAD_DEPTH), since no load could read it back.
STORED_DEPTH = 127


def core_refuses(value: Any, room: int = STORED_DEPTH) -> str | None:
    """What in ``value`` the core's JSON parser refuses although pydantic writes it: an int past
    64 bits ("number out of range"), a lone surrogate in a text or key, or nesting past ``room``
    levels (what is left of the stored document's depth where the value goes); None when
    nothing. Iterative, so a value nested past the interpreter's recursion limit is named here
    rather than raising RecursionError from the next copy or dump; bounded by the values
    themselves (a cycle is pydantic's to refuse)."""
    todo, seen = [(value, 0)], 0
    while todo and seen < 100_000:
        v, depth = todo.pop()
        seen += 1
        if isinstance(v, bool):
            continue
        if isinstance(v, int) and not CORE_INT_MIN <= v <= CORE_INT_MAX:
            return "an integer past 64 bits"
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "a lone surrogate in a text"
        elif isinstance(v, (dict, list, tuple, set, frozenset)):
            if depth == room:
                return f"nesting deeper than the {room} levels a stored value may have here"
            if isinstance(v, dict):
                if _keys_fold(v):
                    return "two keys that JSON writes as one (such as 1 and '1')"
                todo.extend((k, depth + 1) for k in v)
                todo.extend((x, depth + 1) for x in v.values())
            else:
                todo.extend((x, depth + 1) for x in v)
    return None


def _keys_fold(d: dict[Any, Any]) -> bool:
    """Whether two keys of ``d`` are one key in its JSON (pydantic writes ``1`` as ``"1"``): the
    stored dict would keep only the last, while the run went on with both."""
    if all(type(k) is str for k in d):
        return False
    try:
        return len(json.loads(pydantic_core.to_json(dict.fromkeys(d)))) < len(d)
    except Exception:  # noqa: BLE001 - a key JSON cannot write at all: the encoding refuses it
        return False


def check_state_update(prototype: AgentState, update: dict[str, Any]) -> None:
    """ValueError when an input ``"state"`` update holds a value its state could not store (NaN,
    an object JSON cannot hold), found before the run starts, as the input commit would find it
    (keys that are not fields are ignored there, and here)."""
    fields = type(prototype).model_fields
    for key, value in update.items():
        if key not in fields:
            continue
        found = core_refuses(value, room=STORED_DEPTH - 1)  # a field of the stored state
        if found is not None:
            raise ValueError(f"input 'state' key {key!r} cannot be stored: it holds {found}; nothing of it was "
                             "stored")
        try:
            encode_state(prototype.model_copy(update={key: value}), with_context=False)
        except UnstorableValue as exc:
            raise ValueError(f"input 'state' key {key!r}: {exc}") from None
        except (PydanticSerializationError, ValueError, RecursionError) as exc:
            if isinstance(exc, RecursionError) or "depth" in str(exc):
                raise ValueError(f"input 'state' key {key!r} is nested too deep to store; nothing of it was "
                                 "stored") from None
            if isinstance(exc, PydanticSerializationError):
                raise ValueError(f"input 'state' key {key!r} cannot be stored as JSON: {exc}; nothing of it "
                                 "was stored") from None
            raise  # NaN or an infinity, named by its path


def encode_state(state: AgentState, *, with_context: bool) -> dict[str, Any]:
    """The stored form of a state: its JSON dump plus the class header. Steps store the context
    as message rows, so they leave it out. ValueError for a state that would not load back or
    that holds NaN or an infinity."""
    refuse_nonfinite(state, "the state", skip=None if with_context else "context", exact_ints=not with_context)
    refuse_required_nulls(state, f"the state ({type(state).__name__})")
    data = _state_dict(state, with_context)
    # What the core's parser refuses although pydantic writes it (a lone surrogate, an int past
    # 64 bits), named here: from the parser it read "not valid JSON: unexpected end of hex
    # escape". Not on a step's path (encode_state_shaped): a run's values are checked as they
    # come in.
    found = core_refuses(data)
    if found is not None:
        raise UnstorableValue(f"the state ({type(state).__name__}) cannot be stored: it holds {found}; nothing "
                              "of it was stored")
    return data


def _not_utf8(what: str, exc: UnicodeDecodeError) -> UnstorableValue:
    # pydantic writes bytes as UTF-8 text and let the codec's own error through, untyped and
    # without naming what held them.
    return UnstorableValue(f"{what} cannot be stored as JSON: it holds bytes that are not UTF-8 text "
                           f"({exc.reason} at byte {exc.start}); nothing of it was stored")


def _state_dict(state: AgentState, with_context: bool) -> dict[str, Any]:
    """``encode_state`` after its NaN check: the dict dump, checked to load back when pydantic
    warned about it."""
    exclude = None if with_context else {"context"}
    try:
        data = state.model_dump(mode="json", exclude=exclude, warnings=_STRICT)
    except UnicodeDecodeError as exc:
        raise _not_utf8(f"the state ({type(state).__name__})", exc) from None
    except PydanticSerializationError:
        data = state.model_dump(mode="json", exclude=exclude, warnings=False)
        _loadable(type(state), data, f"the state ({type(state).__name__})")
    data[STATE_META_KEY] = encode_state_meta(state)
    return data


_CONTEXT = {"context"}
_HEADERS: dict[type, str] = {}


def encode_state_text(state: AgentState) -> str:
    """``json.dumps(encode_state(state, with_context=False))`` in one pass: pydantic-core's
    JSON of the state with the class header spliced in. About 5% of a memory turn's instructions
    went to the dump to Python objects and the second pass over them. The same refusals:
    ``refuse_nonfinite`` first, the dict dump's load-back check for a dump pydantic warned about."""
    return encode_state_shaped(state)[0]


def encode_state_shaped(state: AgentState) -> tuple[str, bool]:
    """``encode_state_text`` and whether a load of that text would give back another state
    than ``state`` (a value the model declares loosely that JSON does not keep, or a field
    holding a value of another type than declared, which pydantic warned about)."""
    reshaped = refuse_nonfinite(state, "the state", skip="context", exact_ints=True)
    refuse_required_nulls(state, f"the state ({type(state).__name__})")
    try:
        body = state.__pydantic_serializer__.to_json(state, exclude=_CONTEXT, warnings=_STRICT).decode()
    except UnicodeDecodeError as exc:
        raise _not_utf8(f"the state ({type(state).__name__})", exc) from None
    except PydanticSerializationError:  # already walked: the dict dump and its load-back check
        return json.dumps(_state_dict(state, with_context=False)), True
    cls = type(state)
    header = _HEADERS.get(cls)
    if header is None:
        if len(_HEADERS) >= CLASS_CACHE_SIZE:
            _HEADERS.clear()  # see CLASS_CACHE_SIZE
        header = _HEADERS[cls] = json.dumps({STATE_META_KEY: encode_state_meta(state)})[1:]
    # body is a JSON object: its closing brace gives way to the header's key.
    return body[:-1] + ("," if len(body) > 2 else "") + header, reshaped


def encode_message(message: Message) -> str:
    """A message's stored JSON; ValueError for one that would not load back (e.g. ``tools_calls``
    assigned something that is not a list of dicts) or that holds NaN or an infinity."""
    return encode_message_shaped(message)[0]


def encode_message_shaped(message: Message) -> tuple[str, bool]:
    """``encode_message`` and whether a load of that text would give back another message (as
    ``encode_state_shaped``)."""
    reshaped = refuse_nonfinite(message, f"message {message.message_id} ({message.role})")
    refuse_required_nulls(message, f"message {message.message_id} ({message.role})")
    try:  # model_dump_json without its Python wrapper
        return message.__pydantic_serializer__.to_json(message, warnings=_STRICT).decode(), reshaped
    except UnicodeDecodeError as exc:
        raise _not_utf8(f"message {message.message_id} ({message.role})", exc) from None
    except PydanticSerializationError:
        try:
            text = message.model_dump_json(warnings=False)
        except PydanticSerializationError as exc:  # a lone surrogate in a text, say: typed like the rest
            raise ValueError(f"message {message.message_id} ({message.role}) cannot be stored as JSON: {exc}; "
                             "nothing of it was stored") from None
        _loadable(type(message), text, f"message {message.message_id} ({message.role})")
        return text, True
