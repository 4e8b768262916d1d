"""NativeCheckpointer: 10xGraph's checkpointer method set over a Rust store (``_core.NativeStore``),
the base of the built-in backends (in-memory, SQLite, Postgres).

Every backend gives the same guarantees, which 10xGraph's InMemory and SQLite did not: versioned
writes (``StaleStateError`` STORAGE_CONFLICT_001), a durable tool ledger (first result wins),
messages deduplicated by id, and JSON copies instead of live object references.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from tenxgraph import _core
from tenxgraph import _in_flight as in_flight
from tenxgraph._message_ids import PROTOTYPE_IDS_KEY
from tenxgraph._state_codec import encode_message, encode_state
from tenxgraph.core.exceptions import InvalidConfigError, MessageNotFoundError, StaleStateError
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.logs import run_logger
from tenxgraph.storage.checkpointer import _read_head as read_head
from tenxgraph.storage.checkpointer.authz_guard import authz_owner_scoped, check_authz
from tenxgraph.storage.checkpointer.base_checkpointer import STOP_REQUEST_NAMESPACE, BaseCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo
from tenxgraph._user_id import user_id_of

__all__ = ["NativeCheckpointer"]

StateT = TypeVar("StateT", bound=AgentState)
# In a state cache entry: when the thread it was cached for was made (see `_thread_born`).
_CACHED_FOR = "__cached_for_thread__"
# In a state cache entry: the write mark of the row it was read from (see `_read_head`).
_CACHED_MARK = "__cached_mark__"
# Versions are 64-bit signed ints in every store.
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_log = run_logger("tenxgraph.checkpointer")


def _ids(config: dict[str, Any]) -> tuple[str, str]:
    if not isinstance(config, dict):
        raise InvalidConfigError(f"config must be a dict, got {type(config).__name__}")
    thread_id = config.get("thread_id")
    if thread_id is None or thread_id == "":
        raise InvalidConfigError("config must contain a thread_id")
    # Checked as the run's config is: an id that is not valid Unicode is STORAGE_CONFIG_002.
    return _core.text_id("thread_id", thread_id), _user(config)


def _user(config: dict[str, Any] | None) -> str:
    """The caller's user: ``config["user_id"]``, or the anonymous user a run gets by default."""
    if config is not None and not isinstance(config, dict):
        raise InvalidConfigError(f"config must be a dict, got {type(config).__name__}")
    return _core.text_id("user_id", user_id_of(config))


def _thread_info_user(config: dict[str, Any], thread_info: ThreadInfo, user_id: str, isolated: bool) -> str:
    """Whose thread ``aput_thread`` writes: the ThreadInfo's ``user_id`` where the config names
    none and users are not isolated (10xGraph stores the ThreadInfo's user; until session 21 it
    was replaced by the anonymous user without a word), else the config's. Under user isolation
    or an authz owner scope the config's user is the caller's identity, which a ThreadInfo must
    not change (it would let an anonymous caller write another user's thread): a ThreadInfo
    naming another user is refused there, like a mismatched thread id, as it is everywhere when
    the config names a user."""
    if thread_info.user_id is None:
        return user_id
    wanted = _core.text_id("user_id", thread_info.user_id)
    if wanted == user_id:
        return user_id
    if config.get("user_id") is None and not isolated and not authz_owner_scoped(config):
        return wanted
    raise ValueError(f"ThreadInfo.user_id {thread_info.user_id!r} does not match config user_id {user_id!r}")


def _ledger_key(tool_call_id: Any, *, write: bool = True) -> str:
    """A ledger key given to ``aput_tool_result``: the limits of every other id (at most 255
    characters, no NUL, valid Unicode), checked the same on every backend. PostgreSQL's
    ``VARCHAR(255)`` column refused a longer key and a NUL with STORAGE_001 and its own words,
    SQLite and memory stored them, and a lone surrogate was a ``UnicodeEncodeError``. The keys
    a run writes never break them (a longer one is stored as its digest, engine/ledger.rs). A
    read (``write=False``) takes a longer key: in 10xGraph's ``"<message id>:<call id>"`` form it
    names a row stored under its digest."""
    key = str(tool_call_id)
    reason = None
    if "\x00" in key:
        reason = "must not contain the NUL character (U+0000)"
    elif write and len(key) > 255:
        reason = f"must be at most 255 characters long (it has {len(key)})"
    else:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            reason = "must be valid Unicode text (it holds a lone surrogate)"
    if reason is not None:
        shown = key[:80].encode("utf-8", "replace").decode("utf-8")
        raise InvalidConfigError(f"tool_call_id {reason}", "STORAGE_CONFIG_002",
                                 {"field": "tool_call_id", "value": shown})
    return key


def _as_stored_key(key: str) -> str | None:
    """A key in the stored form (a JSON array) written another way, as the core writes it: compact,
    non-ASCII as itself (``json.dumps([m, c])`` has ", " and ``\\u00e9``, and read "not
    recorded": red-team, session 26). None when ``key`` is not such an array."""
    if not key.startswith("["):
        return None
    try:
        parsed = json.loads(key)
    except ValueError:
        return None
    if not isinstance(parsed, list):
        return None
    return json.dumps(parsed, separators=(",", ":"), ensure_ascii=False)


def _cache_ttl(ttl_seconds: Any) -> float | None:
    """``ttl_seconds`` of ``aput_cache_value``, the same answer on every backend. None or 0: no
    expiry (10xGraph's ``ttl_seconds or ...``). A positive number: that many seconds, cut by the
    core to about 31 years (infinity included: Postgres cannot hold ``NOW() + 1e15 s`` and Redis
    refuses a ``PX`` past 2**63 ms, so such TTLs failed there and nowhere else). Anything else (a negative number, NaN, a bool,
    a string, an int too large for a float) is ``InvalidConfigError`` STORAGE_CONFIG_002 with
    ``context["field"] == "ttl_seconds"``, nothing written. Before: infinity and TTLs past about
    9e12 s failed on Postgres only (STORAGE_001, "interval out of range"), a negative TTL or NaN
    meant "never expires" (10xGraph's in-memory and SQLite checkpointers: already expired), a
    bool counted as 0 or 1 s, and ``10**400`` / ``"5"`` raised a bare OverflowError / TypeError."""
    if ttl_seconds is None:
        return None
    reason = None
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float)):
        reason = f"must be a number of seconds or None, got {type(ttl_seconds).__name__}"
    else:
        try:
            ttl = float(ttl_seconds)
        except OverflowError:
            ttl = float("inf")  # an int past a float's range: as infinity, cut below
        if ttl != ttl or ttl < 0:
            reason = f"must be >= 0 (0 or None: no expiry), got {ttl_seconds!r}"
    if reason is not None:
        raise InvalidConfigError(f"ttl_seconds {reason}", "STORAGE_CONFIG_002",
                                 {"field": "ttl_seconds", "value": repr(ttl_seconds)[:80]})
    return None if ttl == 0 else ttl


def _page(search: Any, offset: Any, limit: Any) -> int | None:
    """The same answer on every backend for a bad page or search: a ValueError. Before, a negative
    limit listed nothing (memory), everything (SQLite) or failed with PostgreSQL's own STORAGE_001,
    and a NUL in the search text failed on PostgreSQL alone. Returns the limit to apply: a limit
    of 0 is no limit, as on every 10xGraph 0.10 checkpointer (it listed nothing here until
    session 21)."""
    for name, value in (("offset", offset), ("limit", limit)):
        # Past 2**63 - 1 the core's int was a raw OverflowError (helper red-team, session 27).
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63):
            raise ValueError(f"{name} must be a whole number >= 0 (below 2**63) or None, got {value!r}")
    if search is not None and (not isinstance(search, str) or "\x00" in search or not _utf8(search)):
        raise ValueError("search must be text without the NUL character (U+0000) or a lone surrogate")
    return limit or None


# The generic cache's namespaces that the stores keep for themselves (the state cache of a store
# without Redis): the public cache methods refuse them, so a value cached under any namespace a
# user names never reads or replaces another user's cached state (it did under "state_cache").
_RESERVED_CACHE_PREFIX = "tenxgraph:"


def _cache_text(field: str, value: Any, *, namespace: bool = False) -> str:
    """A generic cache namespace or key as stored: ``str(value)`` (10xGraph formats keys into
    ``f"{namespace}:{key}"``), refused with ``InvalidConfigError`` STORAGE_CONFIG_002 before
    anything is read or written where a store could not keep it the same on every backend (a NUL,
    a lone surrogate) or where it names a namespace the stores reserve."""
    text = value if isinstance(value, str) else str(value)
    reason = None
    if "\0" in text:
        reason = "contains a NUL character, which PostgreSQL cannot store"
    elif not _utf8(text):
        reason = "is not valid Unicode (a lone surrogate)"
    elif namespace and text.startswith(_RESERVED_CACHE_PREFIX):
        reason = f"starts with {_RESERVED_CACHE_PREFIX!r}, which tenxgraph reserves for its own entries"
    if reason is not None:
        raise InvalidConfigError(f"cache {field} {reason}", "STORAGE_CONFIG_002",
                                 {"field": field, "value": repr(value)[:80]})
    return text


def _cache_names(namespace: Any, key: Any) -> tuple[str, str]:
    """A cache call's namespace and key, checked (see ``_cache_text``)."""
    return _cache_text("namespace", namespace, namespace=True), _cache_text("key", key)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _msg_rows(messages: list[Message]) -> list[tuple[str, str]]:
    rows = []
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            raise TypeError(f"expected Message, got {type(m).__name__}")
        # Set to None (or "") after construction: stored under the key "None", it made the thread
        # unreadable on memory and SQLite (every later read a ValidationError). Refused first,
        # nothing written.
        if m.message_id is None or m.message_id == "" or isinstance(m.message_id, bool):
            raise ValueError(f"messages[{i}].message_id must be a str or int id, got {m.message_id!r}")
        rows.append((str(m.message_id), encode_message(m)))
    return rows


def live_lease(info: dict[str, Any] | None) -> bool:
    """Whether a lease as ``aget_lease`` gives it is held now (not released, not expired)."""
    return info is not None and not info.get("released") and float(info.get("expires_in", 0)) > 0


async def stop_token(native: Any, thread_id: str, user_id: str) -> int:
    """The fencing token a stop request names (``native``: a ``_core.NativeStore``): the last
    one the thread's lease row holds, held or not. Every run that takes the thread later holds a
    greater one, so the request reaches only a run that held it at this read. 0 when the thread
    never had a lease (no run holds 0). A request naming nobody (when no run held the lease)
    stopped a turn that started between this read and the write (red-team, session 36)."""
    raw = await native.lease_get(thread_id, user_id)
    return 0 if raw is None else int(json.loads(raw)["token"])


def _with_stored_prototype_map(state: StateT, stored_json: str) -> StateT:
    """``state`` with the stored state's map of prototype copies (``_message_ids``), when it has
    one: a state an operator built without it (``AgentState(context=...)``) dropped it, and the
    thread's next turns stored the prompt a node returns under the prototype's id; on PostgreSQL
    that id is then this thread's, and every other thread failed on it (STORAGE_FORBIDDEN_002;
    seventh pass, session 39). A shallow copy: the caller's object is not changed."""
    pairs = json.loads(stored_json).get("execution_meta", {}).get("internal_data", {}).get(PROTOTYPE_IDS_KEY)
    if pairs is None:
        return state
    meta = state.execution_meta
    internal = {**meta.internal_data, PROTOTYPE_IDS_KEY: pairs}
    return state.model_copy(update={"execution_meta": meta.model_copy(update={"internal_data": internal})})


class NativeCheckpointer(BaseCheckpointer[StateT]):
    """The storage API nodes, tools and operators use, over a Rust store the Rust loop drives
    directly. Async first; each ``aX`` has a sync ``X``."""

    _native: Any
    enforce_user_isolation: bool = False
    # Whether ThreadInfo.metadata read back keeps "run_id" (10xGraph's PgCheckpointer leaks it
    # there; none of ours does: it is ThreadInfo.run_id).
    _run_id_in_metadata: bool = False

    def _encode_state(self, state: AgentState) -> dict[str, Any]:
        return encode_state(state, with_context=True)

    # -- state -----------------------------------------------------------------------------

    async def asetup(self) -> bool:
        # Opens the store (a SQLite file is created and migrated; Postgres connects and migrates)
        # if no call has yet: it opens on first use, not when constructed.
        await self._native.setup()
        return True

    async def aget_state(self, config: dict[str, Any]) -> StateT | None:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        row = await self._native.load(thread_id, user_id, owner_scoped=authz_owner_scoped(config))
        if row is None:
            return None
        version, state_json, messages = row
        data = json.loads(state_json)
        data["context"] = [json.loads(m) for m in messages]
        read_head.remember(config, version, read_head.mark_in_row(data))
        return self._decode_state(data)  # type: ignore[return-value]

    async def aput_state(self, config: dict[str, Any], state: StateT) -> StateT:
        return await self.aput_checkpoint(config, state)

    async def aput_checkpoint(
        self,
        config: dict[str, Any],
        state: StateT,
        messages: list[Message] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> StateT:
        """Writes the state (its context replaces the stored messages) plus ``messages`` in one
        versioned transaction. With ``config["_checkpoint_version"]`` set (``aget_state`` sets it)
        a write over a newer version raises StaleStateError and writes nothing; so does one after
        a message was written or deleted outside a run since that read (see ``_read_head``;
        ``aget_state`` again, then write). A state without
        the thread's map of prototype copies is written with the stored one (see
        ``_with_stored_prototype_map``); the caller's object is returned as given."""
        given = state
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        if not isinstance(state, AgentState):
            raise TypeError(f"state must be an AgentState, got {type(state).__name__}")
        expected = read_head.version_of(config)
        row = None
        # A state with no execution_meta or internal_data left is refused by the encode below.
        internal = getattr(state.execution_meta, "internal_data", None)
        keeps_map = not isinstance(internal, dict) or PROTOTYPE_IDS_KEY in internal
        if expected is None or not _I64_MIN <= expected <= _I64_MAX or not keeps_map:
            row = await self._native.load(thread_id, user_id, owner_scoped=authz_owner_scoped(config))
        if not keeps_map and row is not None:
            state = _with_stored_prototype_map(state, row[1])
        if expected is None or not _I64_MIN <= expected <= _I64_MAX:
            current = row[0] if row is not None else 0
            if expected is not None:
                # No stored version is past 64 bits: stale, as 10xGraph's PgCheckpointer answers.
                raise StaleStateError(
                    f"State was modified by another execution (expected version {expected}, found {current})",
                    "STORAGE_CONFLICT_001",
                    {"thread_id": thread_id, "expected_version": expected, "current_version": current},
                )
            expected = current
            mark = None
        else:
            mark = read_head.expected_mark(config, expected)
        data = encode_state(state, with_context=False)
        rows = _msg_rows(list(state.context))
        known = {r[0] for r in rows}
        rows += [r for r in _msg_rows(messages or []) if r[0] not in known]
        mark = read_head.mark_to_name(config, expected, mark, rows)
        version = await self._native.put_step(thread_id, user_id, int(expected), json.dumps(data), rows, True,
                                               owner_scoped=authz_owner_scoped(config), expected_mark=mark)
        read_head.remember(config, version, read_head.mark_in_row(data))
        return given

    async def aclear_state(self, config: dict[str, Any]) -> bool:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        await self._native.clear_state(thread_id, user_id, owner_scoped=authz_owner_scoped(config))
        await self._native.state_cache_clear(thread_id, user_id)
        read_head.forget(config)
        return True

    async def aput_state_cache(self, config: dict[str, Any], state: StateT) -> StateT:
        """Caches the whole state under the version in ``config`` (set by reads and writes); an
        older version never replaces a newer cached one."""
        await self._state_cache_put(config, state)
        return state

    async def _state_cache_put(self, config: dict[str, Any], state: StateT) -> bool | None:
        """True when cached, False when a newer cached version kept its place, None when the
        version in ``config`` is past 64 bits (no commit can have it: nothing cached)."""
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        version = read_head.version_of(config) or 0
        if not _I64_MIN <= version <= _I64_MAX:
            return None
        payload = self._encode_state(state)
        payload[_CACHED_FOR] = await self._thread_born(thread_id, user_id)
        mark = read_head.expected_mark(config, version)
        if read_head.OWN_KEY in config:
            # An entry is served only while its mark is the latest row's: a state that does not
            # hold the caller's own message writes gets the mark it was read with.
            mark = read_head.mark_to_name(config, version, mark, _msg_rows(list(state.context)))
        payload[_CACHED_MARK] = mark
        return bool(await self._native.state_cache_put(thread_id, user_id, version, json.dumps(payload)))

    async def _thread_born(self, thread_id: str, user_id: str) -> str | None:
        """When the thread's row was made (None: no row, or not this user's to read): with the
        version, what tells a cached state of this thread from one of a thread deleted since and
        made again under its id, whose versions start over. As text: a float in the cached JSON
        came back rounded from SQLite's JSON functions (15 digits), and no entry matched."""
        row = await self._native.get_thread(thread_id, user_id)
        return None if row is None else repr(row[4])

    async def aget_state_cache(self, config: dict[str, Any]) -> StateT | None:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        hit = await self._native.state_cache_get(thread_id, user_id)
        if hit is not None:
            version, raw = hit
            data = json.loads(raw)
            born = data.pop(_CACHED_FOR, None)
            mark = data.pop(_CACHED_MARK, None)
            mark = mark if isinstance(mark, str) else None
            # Only while it is the thread's latest version (0: nothing committed yet): runs commit
            # without writing the cache (10xGraph's loop rewrote it at every step), so an entry
            # cached before a run, or by a writer that then lost a version check, would be served
            # as the thread's state. And only of this very thread: one deleted (aclean_thread by
            # another user, aprune) and made again reaches the same versions, and its cached
            # state was served, with a version that let aput_state write it over the new turns.
            # And only while the latest row carries the mark the entry was read with: a message
            # written or deleted outside a run makes no new version. An entry with no mark (cached
            # under a version set by hand, or by an earlier build) is read again, or a write from
            # it dropped such a message (red-team, session 40); one of a thread with no stored
            # state (version 0) has nothing to tell apart.
            versions = await self._native.state_versions(thread_id, user_id)
            latest_mark = read_head.mark_in_row(json.loads(versions[0][2])) if versions else ""
            if (version == (versions[0][0] if versions else 0) and (mark == latest_mark or version == 0)
                    and born == await self._thread_born(thread_id, user_id)):
                read_head.remember(config, version, mark)
                return self._decode_state(data)  # type: ignore[return-value]
            await self._native.state_cache_clear(thread_id, user_id)
            state = await self.aget_state(config)
            if state is not None:
                await self._state_cache_put(config, state)
            return state
        return await self.aget_state(config)

    # -- generic cache and stop requests ---------------------------------------------------

    async def aput_cache_value(self, namespace: str, key: str, value: Any, ttl_seconds: int | None = None) -> Any:
        ns, k = _cache_names(namespace, key)
        ttl = _cache_ttl(ttl_seconds)
        await self._native.cache_put(ns, k, json.dumps(value), ttl)
        return value

    async def aget_cache_value(self, namespace: str, key: str) -> Any:
        ns, k = _cache_names(namespace, key)
        raw = await self._native.cache_get(ns, k)
        return None if raw is None else json.loads(raw)

    async def aclear_cache_value(self, namespace: str, key: str) -> bool:
        ns, k = _cache_names(namespace, key)
        return bool(await self._native.cache_clear(ns, k))

    async def alist_cache_keys(self, namespace: str, prefix: str | None = None) -> list[str]:
        ns = _cache_text("namespace", namespace, namespace=True)
        return list(await self._native.cache_keys(ns, None if prefix is None else _cache_text("prefix", prefix)))

    async def arequest_stop(self, config: dict[str, Any]) -> bool:
        """A stop request for the thread's run. ``stop()`` adds ``_stop_token``, the fencing token
        of the run it saw holding the thread (read before the state): only that run obeys it, so
        a request that lands after that run ended cannot stop the thread's next turn."""
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        token = config.get("_stop_token")
        return bool(await self._native.request_stop(thread_id, user_id, token if type(token) is int else None))

    async def ais_stop_requested(self, config: dict[str, Any]) -> bool:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        await self._native.check_ids(thread_id, user_id)
        return bool(await self.aget_cache_value(STOP_REQUEST_NAMESPACE, _core.stop_key(thread_id, user_id)))

    async def aclear_stop_request(self, config: dict[str, Any]) -> Any:
        """What this backend's ``aclear_cache_value`` answers, as 10xGraph's: the flag removed or
        None (memory, SQLite), the count of keys removed (PostgreSQL)."""
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        await self._native.check_ids(thread_id, user_id)
        return await self.aclear_cache_value(STOP_REQUEST_NAMESPACE, _core.stop_key(thread_id, user_id))

    # -- tool ledger -----------------------------------------------------------------------

    async def aget_tool_result(self, config: dict[str, Any], tool_call_id: str) -> dict[str, Any] | None:
        """The recorded result under a ledger key, or None. A read failure counts as no record, and
        so does an intent record (the call started, its result was never recorded)."""
        await check_authz(self, config)
        row = await self._ledger_row(config, tool_call_id)
        return None if row is None or _is_intent(row) else row

    async def aget_tool_status(self, config: dict[str, Any], tool_call_id: str) -> str | None:
        """``"completed"`` (a result is recorded), ``"started"`` (an intent record only: the call
        began and its outcome is unknown), ``"paused"`` (the call is waiting at ``interrupt()``
        with its thread: it runs again on resume) or None (no row, or the ledger could not be
        read). ``tool_call_id`` is a ledger key as stored (``["<message id>", "<call id>"]``, JSON) or in
        10xGraph's form ``"<message id>:<call id>"``."""
        await check_authz(self, config)
        row = await self._ledger_row(config, tool_call_id)
        if row is None:
            return None
        if not _is_intent(row):
            return "completed"
        return "paused" if row.get("paused") is True else "started"

    async def _ledger_row(self, config: dict[str, Any], tool_call_id: str) -> dict[str, Any] | None:
        thread_id, user_id = _ids(config)
        key = _ledger_key(tool_call_id, write=False)
        keys = _core.ledger_lookup_keys(key)
        stored_form = _as_stored_key(key)
        if stored_form is not None and stored_form not in keys:
            keys.insert(1, stored_form)
        try:
            found = await self._native.ledger_get(thread_id, user_id, keys, owner_scoped=authz_owner_scoped(config))
        except Exception as exc:
            _log.warning("ledger read failed for %s (treated as no record): %s", tool_call_id, exc)
            return None
        hits = [k for k in keys if k in found]
        if len(hits) > 1 and hits[0] != keys[0] and len({found[k] for k in hits}) > 1:
            # 10xGraph's "<message id>:<call id>" with a ":" inside an id: two recorded calls
            # answer to it (red-team, session 26: the first was returned, whichever it was).
            raise InvalidConfigError(
                f"tool_call_id {str(tool_call_id)[:80]!r} names {len(hits)} recorded calls (a ':' inside a message "
                f"or call id); pass the key as stored, one of {hits}", "STORAGE_CONFIG_002",
                {"field": "tool_call_id", "value": str(tool_call_id)[:80], "candidates": hits})
        raw = found[hits[0]] if hits else None
        return None if raw is None else json.loads(raw)

    async def aput_tool_result(self, config: dict[str, Any], tool_call_id: str, result: dict[str, Any]) -> bool:
        """Records a result; the first one recorded for a key wins. Raises on failure."""
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        return bool(await self._native.ledger_put(thread_id, user_id, _ledger_key(tool_call_id), json.dumps(result),
                                                 owner_scoped=authz_owner_scoped(config)))

    # -- messages --------------------------------------------------------------------------

    async def aput_messages(
        self, config: dict[str, Any], messages: list[Message], metadata: dict[str, Any] | None = None
    ) -> int:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        own = read_head.own_message_write(config)
        rows = _msg_rows(messages)
        written = int(await self._native.put_messages(thread_id, user_id, rows, owner_scoped=authz_owner_scoped(config),
                                                      after=own and own[1]))
        if own is not None and rows:
            read_head.note_own_write(config, own, rows)
        return written

    async def aget_message(self, config: dict[str, Any], message_id: str | int) -> Message:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        raw = await self._native.get_message(thread_id, user_id, _core.text_id("message_id", message_id),
                                             owner_scoped=authz_owner_scoped(config))
        if raw is None:
            raise MessageNotFoundError(f"message {message_id!r} not found in thread {thread_id!r}",
                                       context={"thread_id": thread_id, "message_id": str(message_id)})
        return Message.model_validate(json.loads(raw))

    async def alist_messages(
        self,
        config: dict[str, Any],
        search: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> list[Message]:
        limit = _page(search, offset, limit)
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        rows = await self._native.list_messages(thread_id, user_id, search, offset, limit,
                                                owner_scoped=authz_owner_scoped(config))
        return [Message.model_validate(json.loads(r)) for r in rows]

    async def adelete_message(self, config: dict[str, Any], message_id: str | int) -> bool:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        own = read_head.own_message_write(config)
        stored_id = _core.text_id("message_id", message_id)
        if not await self._native.delete_message(thread_id, user_id, stored_id,
                                                 owner_scoped=authz_owner_scoped(config), after=own and own[1]):
            raise MessageNotFoundError(f"message {message_id!r} not found in thread {thread_id!r}",
                                       context={"thread_id": thread_id, "message_id": str(message_id)})
        if own is not None:
            read_head.note_own_write(config, own, [], stored_id)
        return True

    # -- threads ---------------------------------------------------------------------------

    async def aput_thread(self, config: dict[str, Any], thread_info: ThreadInfo) -> bool:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        if str(thread_info.thread_id) != thread_id:
            raise ValueError(
                f"ThreadInfo.thread_id {thread_info.thread_id!r} does not match config thread_id {thread_id!r}"
            )
        user_id = _thread_info_user(config, thread_info, user_id, self._native.isolates_users)
        # run_id rides in the metadata, where 10xGraph's Postgres schema keeps it too.
        meta = json.dumps({**(thread_info.metadata or {}), "run_id": thread_info.run_id})
        return bool(await self._native.put_thread(thread_id, user_id, thread_info.thread_name, meta,
                                                  owner_scoped=authz_owner_scoped(config)))

    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        row = await self._native.get_thread(thread_id, user_id, owner_scoped=authz_owner_scoped(config))
        return None if row is None else _thread_info(row, self._run_id_in_metadata)

    async def alist_threads(
        self,
        config: dict[str, Any],
        search: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> list[ThreadInfo]:
        """The caller's threads under user isolation (a config without a ``user_id`` is the
        anonymous user, as for every other method, so it never lists other users' threads);
        every thread without isolation."""
        limit = _page(search, offset, limit)
        # The config and its user are checked on every backend: a list, a NUL or a lone
        # surrogate in the user id listed every thread where users are not isolated (memory and
        # SQLite by default) and was refused on PostgreSQL (helper red-team, session 27).
        caller = _user(config)
        scope = caller if self._native.isolates_users or authz_owner_scoped(config) else None
        rows = await self._native.list_threads(scope, search, offset, limit)
        return [_thread_info(r, self._run_id_in_metadata) for r in rows]

    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        await check_authz(self, config)
        thread_id, user_id = _ids(config)
        await self._native.clean_thread(thread_id, user_id, owner_scoped=authz_owner_scoped(config))
        await self._native.state_cache_clear(thread_id, user_id)
        return True

    async def aget_thread_owner(self, thread_id: str | int, config: dict[str, Any] | None = None) -> str | None:
        """The user who owns the thread. Under user isolation only the owner is told (the caller
        is ``config["user_id"]``, the anonymous user without one): anybody else gets None, as
        for a thread that does not exist. Under a ``config["authz"]`` owner scope another
        user's thread raises ``StorageError`` ``STORAGE_FORBIDDEN_001``."""
        if config is not None:
            await check_authz(self, config, thread_id)
        return await self._native.thread_owner(_core.text_id("thread_id", thread_id), _user(config),
                                               owner_scoped=config is not None and authz_owner_scoped(config))

    async def aget_lease(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The thread's lease: ``token`` (the fencing token), ``holder`` (the run id), ``host``,
        ``pid``, ``expires_in`` (seconds; negative once expired) and ``released``; None when no
        run ever held the thread or the thread was deleted (its row goes with it once nobody
        holds it), and under user isolation when the caller does not own the
        thread (a thread nobody owns yet included: a run holds it and has not written)."""
        await check_authz(self, config)
        raw = await self._native.lease_get(*_ids(config), owner_scoped=authz_owner_scoped(config))
        return None if raw is None else dict(json.loads(raw))

    async def aprune(
        self,
        *,
        keep_versions: int | None = None,
        finished_older_than: float | None = None,
        ledger_ttl: float | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Retention. ``keep_versions``: at most that many state versions per thread (the latest
        always stays). ``finished_older_than``: delete completed threads (messages, ledger) not
        updated for that many seconds. ``ledger_ttl``: delete ledger rows of completed threads
        recorded more than that many seconds ago. Only threads whose latest state is completed and
        whose lease is free lose rows or go: a pending interrupt, an unfinished (resumable) run or
        a running one keeps everything it needs; so does a thread whose 10xGraph Redis entry says a
        run is under way, and, without ``redis_url`` or while Redis does not answer, every thread
        whose latest state 10xGraph wrote (``legacy_unchecked`` is then True where one was left). A
        deleted thread's lease row goes with it unless a run holds it. Every call also deletes
        expired cache entries (reads already skip them). Returns what was (or, with ``dry_run``,
        would be) removed: ``{"state_versions", "threads", "ledger_rows", "cache_entries",
        "dry_run", "legacy_unchecked"}``."""
        if keep_versions is not None and (isinstance(keep_versions, bool) or not isinstance(keep_versions, int)
                                          or keep_versions < 1):
            raise ValueError(f"keep_versions must be an int >= 1, got {keep_versions!r}")
        for name, value in (("finished_older_than", finished_older_than), ("ledger_ttl", ledger_ttl)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value < float("inf")):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        raw = await self._native.prune(
            keep_versions,
            None if finished_older_than is None else float(finished_older_than),
            None if ledger_ttl is None else float(ledger_ttl),
            bool(dry_run),
        )
        return dict(json.loads(raw))

    async def arelease(self) -> bool:
        # Runs in flight on this store are cancelled and unwind first, and sync calls still in
        # their threads record what they return: closed under them, the store refused those
        # ledger writes and the next run fired the tools again (see tenxgraph._in_flight).
        await in_flight.drain(self, 0.0, in_flight.UNWIND_SECONDS)
        return bool(await self._native.release())


def _thread_info(row: tuple[str, str, str | None, str, float, float], keep_run_id: bool) -> ThreadInfo:
    from datetime import datetime, timezone

    thread_id, user_id, name, meta, created, updated = row
    metadata = json.loads(meta)
    run_id = metadata.get("run_id") if isinstance(metadata, dict) else None
    if not keep_run_id and isinstance(metadata, dict):
        metadata.pop("run_id", None)
    return ThreadInfo(
        thread_id=thread_id,
        thread_name=name,
        user_id=user_id,
        metadata=metadata,
        run_id=run_id,
        created_at=datetime.fromtimestamp(created, tz=timezone.utc),
        updated_at=datetime.fromtimestamp(updated, tz=timezone.utc),
    )


def _is_intent(row: Any) -> bool:
    return isinstance(row, dict) and row.get("__kind__") == _core.INTENT_KIND
