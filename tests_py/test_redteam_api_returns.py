"""Red team: what the public checkpointer methods return, and how they answer bad arguments, on
every backend (memory, SQLite, Postgres, Postgres+Redis), held against 10xGraph 0.10.0.

The rule: a method returns what 10xGraph 0.10's checkpointer of the same kind returns (its
InMemoryCheckpointer, SqliteCheckpointer, PgCheckpointer; Postgres without Redis answers as
Postgres with it), and a bad argument is a typed error with an error code or a defined answer,
the same on every backend. The 10xGraph values quoted were observed in its own venv (session 16,
/root/.cache/tenxgraph/oracle-10xgraph-0.10.0). Every test here failed on at least one backend
when written."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import InvalidConfigError, MessageNotFoundError, StaleStateError
from tenxgraph.utils.thread_info import ThreadInfo

pytestmark = pytest.mark.asyncio


def kind_of(cp: Any) -> str:
    """The backend's name as in conftest.BACKENDS."""
    name = type(cp).__name__
    if name == "InMemoryCheckpointer":
        return "memory"
    if name == "SqliteCheckpointer":
        return "sqlite"
    return "postgres+redis" if getattr(cp, "redis_url", None) else "postgres"


def typed(value: Any) -> tuple[str, Any]:
    """A return value with its type, so ``True`` and ``1`` (or ``None`` and ``0``) differ."""
    return (type(value).__name__, value)


# -- generic cache: ttl_seconds ---------------------------------------------------------------

HUGE_TTLS = {
    "inf": math.inf,
    "1e15": 1e15,
    "1e300": 1e300,
    "2**63": 2**63,
    "2**64": 2**64,
    "10**400": 10**400,
}


@pytest.mark.parametrize("ttl", list(HUGE_TTLS.values()), ids=list(HUGE_TTLS))
async def test_an_infinite_or_huge_cache_ttl_stores_the_value_on_every_backend(checkpointer, make_thread, ttl) -> None:
    """A TTL past what a store can express means "no expiry in practice" (cut to 1e9 s, as
    node_timeout / tool_timeout are), on every backend. Before: on Postgres (with and without
    Redis) `inf` raised STORAGE_001 "cache write failed: ... interval out of range" and 1e15,
    1e300, 2**63, 2**64 STORAGE_001 "... timestamp out of range", nothing stored, while memory and
    SQLite stored the value; `10**400` was a bare OverflowError ("int too large to convert to
    float") on every backend. (10xGraph 0.10: memory/SQLite store it, PgCheckpointer logs Redis'
    refusal and returns None, storing nothing.)"""
    ns, key = "ttl-huge", make_thread("k")
    await checkpointer.aput_cache_value(ns, key, {"v": 1}, ttl_seconds=ttl)
    assert await checkpointer.aget_cache_value(ns, key) == {"v": 1}
    assert key in await checkpointer.alist_cache_keys(ns)


@pytest.mark.parametrize("ttl", [0, 0.0, None, 3600, 0.5], ids=["0", "0.0", "None", "3600", "0.5"])
async def test_a_zero_none_or_positive_ttl_keeps_the_value(checkpointer, make_thread, ttl) -> None:
    """0 and None mean no expiry (10xGraph's ``ttl_seconds or ...``), a positive TTL keeps the
    value until it runs out; the same on every backend. A guard for the refusals below."""
    ns, key = "ttl-ok", make_thread("k")
    await checkpointer.aput_cache_value(ns, key, "v", ttl_seconds=ttl)
    assert await checkpointer.aget_cache_value(ns, key) == "v"


async def test_a_tiny_ttl_expires(checkpointer, make_thread) -> None:
    """A positive TTL that has run out reads as absent on every backend (a guard). Redis keeps a
    value at least 1 ms (PX is whole milliseconds), so the read waits a little."""
    ns, key = "ttl-tiny", make_thread("k")
    await checkpointer.aput_cache_value(ns, key, "v", ttl_seconds=1e-9)
    await asyncio.sleep(0.05)
    assert await checkpointer.aget_cache_value(ns, key) is None
    assert key not in await checkpointer.alist_cache_keys(ns)


BAD_TTLS = {
    "negative": -5,
    "-inf": -math.inf,
    "nan": math.nan,
    "True": True,
    "False": False,
    "str": "5",
    "list": [1],
}


@pytest.mark.parametrize("ttl", list(BAD_TTLS.values()), ids=list(BAD_TTLS))
async def test_a_bad_cache_ttl_is_a_typed_error_and_nothing_is_written(checkpointer, make_thread, ttl) -> None:
    """A negative, NaN, bool or non-number TTL is InvalidConfigError STORAGE_CONFIG_002 naming
    ``ttl_seconds``, nothing written, on every backend. Before: -5, -inf and NaN stored the value
    for ever on every backend (10xGraph's memory and SQLite: already expired, its Postgres: not
    stored), True kept it 1 s and False for ever, and "5" / [1] raised a bare TypeError ("must be
    real number, not str")."""
    ns, key = "ttl-bad", make_thread("k")
    with pytest.raises(InvalidConfigError) as err:
        await checkpointer.aput_cache_value(ns, key, {"v": 1}, ttl_seconds=ttl)
    assert err.value.error_code == "STORAGE_CONFIG_002"
    assert err.value.context["field"] == "ttl_seconds"
    assert await checkpointer.aget_cache_value(ns, key) is None
    assert key not in await checkpointer.alist_cache_keys(ns)


# -- return values, as 10xGraph's checkpointer of the same kind -------------------------------

# Observed on 10xGraph 0.10.0: InMemoryCheckpointer and SqliteCheckpointer answer alike here
# (aclear_cache_value: the removed value, None when absent; the in-memory one hands out its
# internal (value, expires_at) pair, a pinned difference, tests_py/test_checkpointer_compat.py),
# PgCheckpointer (Redis' DEL count, None for writes).
EMBEDDED = {
    "asetup": typed(None),
    "aput_messages": typed(True),
    "aput_messages([])": typed(True),
    "aput_thread(new)": typed(True),
    "aput_thread(update)": typed(True),
    "aclear_cache_value(hit)": typed({"v": 1}),
    "aclear_cache_value(miss)": typed(None),
    "aclear_stop_request(pending)": typed(True),
    "aclear_stop_request(none)": typed(None),
}
POSTGRES = {
    "asetup": typed(True),
    "aput_messages": typed(None),
    "aput_messages([])": typed(None),
    "aput_thread(new)": typed(True),
    "aput_thread(update)": typed(False),
    "aclear_cache_value(hit)": typed(1),
    "aclear_cache_value(miss)": typed(0),
    "aclear_stop_request(pending)": typed(1),
    "aclear_stop_request(none)": typed(0),
}
EXPECTED_RETURNS = {"memory": EMBEDDED, "sqlite": EMBEDDED, "postgres": POSTGRES, "postgres+redis": POSTGRES}


async def test_return_values_are_those_of_10xgraph_s_checkpointer_of_the_same_kind(checkpointer, make_thread) -> None:
    """Memory and Postgres already answered as 10xGraph's (docs/migrating-from-10xgraph.md);
    SQLite did not. Before, on SQLite: `asetup()` True (10xGraph: None), `aput_messages` the
    number of messages (1, and 0 for []; 10xGraph: True), `aput_thread` of an existing thread
    False (10xGraph: True), `aclear_cache_value` True whether or not a value was there (10xGraph:
    the value, or None), `aclear_stop_request` True with no stop pending (10xGraph: None)."""
    cp = checkpointer
    tid, tid2 = make_thread("ret"), make_thread("ret")
    cfg, cfg2 = {"thread_id": tid, "user_id": "u1"}, {"thread_id": tid2, "user_id": "u1"}
    got = {"asetup": typed(await cp.asetup())}
    got["aput_messages"] = typed(await cp.aput_messages(cfg, [Message.text_message("hi", message_id=f"m-{tid}")]))
    got["aput_messages([])"] = typed(await cp.aput_messages(cfg, []))
    got["aput_thread(new)"] = typed(await cp.aput_thread(cfg2, ThreadInfo(thread_id=tid2, thread_name="n")))
    got["aput_thread(update)"] = typed(await cp.aput_thread(cfg, ThreadInfo(thread_id=tid, thread_name="n")))
    await cp.aput_cache_value("ns-ret", tid, {"v": 1})
    got["aclear_cache_value(hit)"] = typed(await cp.aclear_cache_value("ns-ret", tid))
    got["aclear_cache_value(miss)"] = typed(await cp.aclear_cache_value("ns-ret", tid))
    await cp.arequest_stop(cfg)
    got["aclear_stop_request(pending)"] = typed(await cp.aclear_stop_request(cfg))
    got["aclear_stop_request(none)"] = typed(await cp.aclear_stop_request(cfg))
    assert got == EXPECTED_RETURNS[kind_of(cp)]


async def test_clearing_answers_truthy_exactly_when_something_was_removed(checkpointer, make_thread) -> None:
    """Across backends the values differ as 10xGraph's do (True / 1 / the value), but whether
    something was removed reads the same everywhere: truthy after a hit, falsy after a miss.
    Before: SQLite answered True to `aclear_cache_value` of an absent key and to
    `aclear_stop_request` with no stop pending (memory: None, Postgres: 0)."""
    cp = checkpointer
    cfg = {"thread_id": make_thread("clr"), "user_id": "u1"}
    await cp.aput_cache_value("ns-clr", "k", "v")
    assert await cp.aclear_cache_value("ns-clr", "k")
    assert not await cp.aclear_cache_value("ns-clr", "k")
    await cp.arequest_stop(cfg)
    assert await cp.aclear_stop_request(cfg)
    assert not await cp.ais_stop_requested(cfg)
    assert not await cp.aclear_stop_request(cfg)


async def test_aput_state_cache_returns_as_10xgraph_and_says_when_it_did_not_cache(checkpointer, make_thread) -> None:
    """10xGraph 0.10: InMemory / SQLite `aput_state_cache` return the state; PgCheckpointer
    returns True when cached and None when its version guard kept a newer entry (observed: a
    write at version 1 after one at 3, and a write without a version after it, both None).
    Before: ours returned True on Postgres (with and without Redis) for the skipped writes too."""
    cp = checkpointer
    cfg = {"thread_id": make_thread("sc"), "user_id": "u1"}
    for _ in range(3):
        await cp.aput_state(dict(cfg), AgentState())
    state = AgentState()
    written = await cp.aput_state_cache({**cfg, "_checkpoint_version": 3}, state)
    skipped = await cp.aput_state_cache({**cfg, "_checkpoint_version": 1}, state)
    no_version = await cp.aput_state_cache(dict(cfg), state)
    if kind_of(cp).startswith("postgres"):
        assert (written, skipped, no_version) == (True, None, None)
    else:
        assert written is state and skipped is state and no_version is state
    c = dict(cfg)
    assert isinstance(await cp.aget_state_cache(c), AgentState) and c["_checkpoint_version"] == 3


# -- _checkpoint_version ------------------------------------------------------------------------

HUGE_VERSIONS = {"2**63": 2**63, "2**64": 2**64, "10**30": 10**30, "-2**63-1": -(2**63) - 1}


@pytest.mark.parametrize("method", ["aput_state", "aput_checkpoint"])
@pytest.mark.parametrize("version", list(HUGE_VERSIONS.values()), ids=list(HUGE_VERSIONS))
async def test_a_checkpoint_version_past_64_bits_is_a_stale_state_error(checkpointer, make_thread, method, version) -> None:
    """No stored version is past 64 bits, so such an expected version is stale:
    StaleStateError STORAGE_CONFLICT_001 with the versions in `context`, as 10xGraph's
    PgCheckpointer answers ("expected version 18446744073709551616, found 1"); nothing written.
    Before: a bare OverflowError ("Python int too large to convert to C long") on every backend,
    from the core's i64 argument."""
    cp = checkpointer
    cfg = {"thread_id": make_thread("ver"), "user_id": "u1"}
    await cp.aput_state(dict(cfg), AgentState())
    with pytest.raises(StaleStateError) as err:
        await getattr(cp, method)({**cfg, "_checkpoint_version": version}, AgentState())
    assert err.value.error_code == "STORAGE_CONFLICT_001"
    assert err.value.context["expected_version"] == version
    assert err.value.context["current_version"] == 1
    c = dict(cfg)
    await cp.aget_state(c)
    assert c["_checkpoint_version"] == 1


BAD_VERSIONS = {"str": "x", "nan": math.nan, "inf": math.inf, "list": [1], "dict": {}}


@pytest.mark.parametrize("method", ["aput_state", "aput_checkpoint", "aput_state_cache"])
@pytest.mark.parametrize("version", list(BAD_VERSIONS.values()), ids=list(BAD_VERSIONS))
async def test_a_checkpoint_version_that_is_no_number_is_a_typed_error(checkpointer, make_thread, method, version) -> None:
    """`config["_checkpoint_version"]` that `int()` cannot read is InvalidConfigError
    STORAGE_CONFIG_002 naming the key, nothing written, on every backend. Before: a bare
    ValueError ("invalid literal for int()", "cannot convert float NaN to integer"),
    OverflowError ("cannot convert float infinity to integer") or TypeError, from `int()`.
    (10xGraph's PgCheckpointer: StorageError STORAGE_001 for the writes; its memory and SQLite
    ignore the key.)"""
    cp = checkpointer
    cfg = {"thread_id": make_thread("ver"), "user_id": "u1"}
    await cp.aput_state(dict(cfg), AgentState())
    with pytest.raises(InvalidConfigError) as err:
        await getattr(cp, method)({**cfg, "_checkpoint_version": version}, AgentState())
    assert err.value.error_code == "STORAGE_CONFIG_002"
    assert err.value.context["field"] == "_checkpoint_version"
    c = dict(cfg)
    await cp.aget_state_cache(c)
    assert c["_checkpoint_version"] == 1


@pytest.mark.parametrize("version", [2**63, 2**64], ids=["2**63", "2**64"])
async def test_aput_state_cache_with_a_version_past_64_bits_caches_nothing(checkpointer, make_thread, version) -> None:
    """No commit can have such a version, so nothing is cached (Postgres: None, as for a
    write its guard skips; memory / SQLite: the state, as 10xGraph's always) and the stored state
    is what `aget_state_cache` reads. Before: OverflowError on every backend."""
    cp = checkpointer
    cfg = {"thread_id": make_thread("ver"), "user_id": "u1"}
    await cp.aput_state(dict(cfg), AgentState())
    state = AgentState()
    got = await cp.aput_state_cache({**cfg, "_checkpoint_version": version}, state)
    assert got is (None if kind_of(cp).startswith("postgres") else state)
    c = dict(cfg)
    assert isinstance(await cp.aget_state_cache(c), AgentState) and c["_checkpoint_version"] == 1


@pytest.mark.parametrize("version", ["2", 2.0], ids=["digit-string", "float"])
async def test_a_checkpoint_version_int_can_read_is_taken_as_10xgraph_takes_it(checkpointer, make_thread, version) -> None:
    """10xGraph's PgCheckpointer compares ``int(expected)``: "2" and 2.0 are version 2 (a guard:
    the typed refusals above must not refuse these)."""
    cp = checkpointer
    cfg = {"thread_id": make_thread("ver"), "user_id": "u1"}
    await cp.aput_state(dict(cfg), AgentState())
    await cp.aput_state(dict(cfg), AgentState())
    c = {**cfg, "_checkpoint_version": version}
    await cp.aput_state(c, AgentState())
    assert c["_checkpoint_version"] == 3


# -- the state cache against the stored state -------------------------------------------------


def one_node(cp: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("m", lambda s: [Message.text_message("reply", role="assistant")])
    g.add_edge(START, "m")
    g.add_edge("m", END)
    return g.compile(checkpointer=cp)


async def test_aget_state_cache_after_a_run_is_the_state_the_run_committed(checkpointer, make_thread) -> None:
    """A state cached before a run is not served after it. Before, on every backend: after
    `aput_state_cache` and then a run, `aget_state_cache` returned the entry cached before the run
    (2 messages, version 2) while the thread held 4 messages (the run loop never writes the
    cache). 10xGraph 0.10 returns the run's state (its loop rewrites the cache at each step): 4
    messages on InMemory, SQLite and Postgres."""
    cp = checkpointer
    app = one_node(cp)
    cfg = {"thread_id": make_thread("run"), "user_id": "u1"}
    await app.ainvoke({"messages": [Message.text_message("one")]}, config=dict(cfg))
    c = dict(cfg)
    await cp.aput_state_cache(c, await cp.aget_state_cache(c))
    await app.ainvoke({"messages": [Message.text_message("two")]}, config=dict(cfg))
    stored = dict(cfg)
    want = await cp.aget_state(stored)
    c = dict(cfg)
    got = await cp.aget_state_cache(c)
    assert [m.text() for m in got.context] == [m.text() for m in want.context] == ["one", "reply", "two", "reply"]
    assert c["_checkpoint_version"] == stored["_checkpoint_version"]


async def test_a_state_cached_under_a_version_no_commit_has_is_not_served(checkpointer, make_thread) -> None:
    """An entry cached under a version the thread never reached (a writer that then lost its
    version check) is not the thread's state. Before: `aget_state_cache` served it with version
    10**6 on every backend, so each write from it raised StaleStateError; only Postgres+Redis
    dropped the entry after that error (memory, SQLite and Postgres without Redis kept serving it
    for the cache's 24 h)."""
    cp = checkpointer
    cfg = {"thread_id": make_thread("poison"), "user_id": "u1"}
    await cp.aput_state(dict(cfg), AgentState())
    await cp.aput_state_cache({**cfg, "_checkpoint_version": 10**6}, AgentState())
    c = dict(cfg)
    assert isinstance(await cp.aget_state_cache(c), AgentState)
    assert c["_checkpoint_version"] == 1
    await cp.aput_state(c, AgentState())  # a write from what the cache answered is not stale
    c = dict(cfg)
    await cp.aget_state_cache(c)
    assert c["_checkpoint_version"] == 2


# -- errors code written for 10xGraph catches ---------------------------------------------------


@pytest.mark.parametrize("method", ["aget_message", "adelete_message"])
async def test_a_missing_message_is_an_index_error_and_a_value_error(checkpointer, make_thread, method) -> None:
    """10xGraph 0.10 raised IndexError for a missing message on InMemory / SQLite and
    ValueError("Message not found: ...") from PgCheckpointer.aget_message; ours raises
    MessageNotFoundError STORAGE_NOT_FOUND_001 on every backend, which should be caught by code
    written for either. Before: an IndexError only, so `except ValueError` (10xGraph Postgres
    code) let it through."""
    cfg = {"thread_id": make_thread("nf"), "user_id": "u1"}
    await checkpointer.aput_messages(cfg, [Message.text_message("hi", message_id=f"m-{cfg['thread_id']}")])
    with pytest.raises(MessageNotFoundError) as err:
        await getattr(checkpointer, method)(cfg, "nope")
    assert err.value.error_code == "STORAGE_NOT_FOUND_001"
    assert isinstance(err.value, IndexError) and isinstance(err.value, ValueError)
