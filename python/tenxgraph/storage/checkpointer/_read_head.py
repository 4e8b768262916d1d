"""What a caller's config remembers of the state row it read or wrote last: its version (10xGraph's
``config["_checkpoint_version"]``) and its write mark (ours, ``config["_checkpoint_mark"]``).

A message written or deleted outside a run (``aput_messages``, ``adelete_message``) makes no new
version; it leaves a mark of its own on the latest row. A versioned ``aput_state`` replaces the
thread's messages with the state's context, so without the mark it dropped a message written after
its ``aget_state`` with no error (session 40). The mark is kept with the version it belongs to
(``"<version>/<mark>"``): a version the caller set by hand names no read, and is checked alone.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any

from tenxgraph._state_codec import STATE_META_KEY
from tenxgraph.core.exceptions import InvalidConfigError

VERSION_KEY = "_checkpoint_version"
MARK_KEY = "_checkpoint_mark"
# What the caller's own message writes since its read changed (see `note_own_write`).
OWN_KEY = "_checkpoint_own_writes"
# A version as `remember` writes it: a 64-bit int in decimal.
_VERSION_TEXT = re.compile(r"-?[0-9]{1,19}")
# A mark as the core writes them (hex, dashes, digits, a fixed prefix): printable ASCII. A lone
# surrogate reached the core as a bare UnicodeEncodeError, a NUL PostgreSQL as STORAGE_001.
_MARK_TEXT = re.compile(r"[!-~]{0,200}")
# How the mark a message write outside a run leaves begins (the core's MESSAGES_CHANGED).
_MESSAGES_CHANGED = "messages-changed-"


def version_of(config: dict[str, Any]) -> int | None:
    """``config["_checkpoint_version"]`` as an int (None when absent), read as 10xGraph 0.10's
    PgCheckpointer reads it (``int(value)``: ``"3"``, ``3.0`` are 3). A value ``int()`` cannot
    take (``"x"``, NaN, infinity, a list) is ``InvalidConfigError`` STORAGE_CONFIG_002 with
    ``context["field"] == "_checkpoint_version"``, on every backend, before anything is written.
    Before: a bare ``ValueError`` / ``OverflowError`` / ``TypeError`` from ``int()``, and an int
    past 64 bits an ``OverflowError`` from the core ("Python int too large to convert to C long").
    An int outside 64 bits is returned as it is: the caller decides (no stored version equals it)."""
    raw = config.get(VERSION_KEY)
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidConfigError(
            f"{VERSION_KEY} must be a whole number (a version aget_state set), got {raw!r}: {exc}",
            "STORAGE_CONFIG_002", {"field": VERSION_KEY, "value": repr(raw)[:80]},
        ) from None


def mark_in_row(state_data: dict[str, Any]) -> str:
    """The write mark of a stored state row as loaded ("" for a row without one)."""
    meta = state_data.get(STATE_META_KEY)
    mark = meta.get("write") if isinstance(meta, dict) else None
    return mark if isinstance(mark, str) else ""


def remember(config: dict[str, Any], version: int, mark: str | None) -> None:
    """Records the row the caller now holds; ``mark`` None when it is not known (a cached state
    of an older entry): its version is then checked alone."""
    config[VERSION_KEY] = version
    config.pop(OWN_KEY, None)
    if mark is None:
        config.pop(MARK_KEY, None)
    else:
        config[MARK_KEY] = f"{version}/{mark}"


def forget(config: dict[str, Any]) -> None:
    for key in (VERSION_KEY, MARK_KEY, OWN_KEY):
        config.pop(key, None)


def _digest(text: str) -> str:
    """A message's content, its ``timestamp`` left out: ``Message`` stamps the time it is built,
    so a caller sending the same message again (a redelivery, a retry after a crash between its
    ``aput_messages`` and ``aput_state``) wrote a copy that differed from its state's only there,
    and was refused on every attempt with no other writer about (red-team, session 41)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        value.pop("timestamp", None)
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def note_own_write(config: dict[str, Any], own: tuple[int, tuple[str, str]],
                   written: list[tuple[str, str]], deleted: str | None = None) -> None:
    """Records a message write the caller made with ``config`` (``own`` from
    ``own_message_write``; ``written``: the ``(id, json)`` rows, ``deleted``: a deleted id): the
    config now names the row's new mark, and what the write changed, which the caller's
    versioned write must hold (``mark_to_name``)."""
    version, (seen, mark) = own
    held = config.get(OWN_KEY)
    if not (isinstance(held, dict) and held.get("version") == version and isinstance(held.get("messages"), dict)):
        held = {"version": version, "read": seen, "messages": {}}
    messages = dict(held["messages"])
    messages.update({mid: _digest(text) for mid, text in written})
    if deleted is not None:
        messages[deleted] = None
    remember(config, version, mark)
    config[OWN_KEY] = {**held, "messages": messages}


def mark_to_name(config: dict[str, Any], expected: int, mark: str | None, rows: list[tuple[str, str]]) -> str | None:
    """The mark a versioned write of ``rows`` (the state's messages as ``(id, json)``) names. After
    the caller's own message writes, the row's new mark only if the state holds what they
    changed (each written message as written, no deleted one); else the mark it read, which the
    row no longer carries: a state that would undo the caller's own redaction or delete, or drop
    its message, is as stale as one read before another caller's write (red-team, session 40)."""
    held = config.get(OWN_KEY)
    if mark is None or not isinstance(held, dict) or held.get("version") != expected:
        return mark
    messages = held.get("messages")
    have = {mid: _digest(text) for mid, text in rows}
    if isinstance(messages, dict) and all(have.get(mid) == d for mid, d in messages.items()):
        return mark
    read = held.get("read")
    return read if isinstance(read, str) and read != mark else ""


def expected_mark(config: dict[str, Any], expected: int) -> str | None:
    """The mark of the row read at version ``expected``; None when the config holds none for that
    version. A value not of the form this module writes is STORAGE_CONFIG_002, as a bad version is."""
    raw = config.get(MARK_KEY)
    if raw is None:
        return None
    version, sep, mark = raw.partition("/") if isinstance(raw, str) else ("", "", "")
    # ASCII digits, as `remember` writes them: `str.isdigit` let "²" and a 5,000-digit version
    # through to a bare ValueError of int() (red-team, session 40).
    if not sep or not _VERSION_TEXT.fullmatch(version) or not _MARK_TEXT.fullmatch(mark):
        raise InvalidConfigError(
            f"{MARK_KEY} must be the mark aget_state set (\"<version>/<mark>\"), got {raw!r}",
            "STORAGE_CONFIG_002", {"field": MARK_KEY, "value": repr(raw)[:80]},
        )
    return mark if int(version) == expected else None


def own_message_write(config: dict[str, Any]) -> tuple[int, tuple[str, str]] | None:
    """For a message write outside a run with ``config``: the version the config read and
    ``(the mark it read, a new mark)`` for the store (``ChangeMark`` in the core), so that the
    caller's own later versioned write still names the latest row, unless another write came
    between. None when the config holds no read of a stored row (nothing to keep in step), or
    an unreadable one: a message write never needed the version, and ``aput_state`` answers a
    bad one."""
    try:
        version = version_of(config)
        seen = expected_mark(config, version) if version else None
    except InvalidConfigError:
        return None
    if seen is None:
        return None
    return version, (seen, f"{_MESSAGES_CHANGED}{uuid.uuid4().hex}")
