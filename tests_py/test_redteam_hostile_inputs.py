"""Red team: hostile inputs through the public checkpointer API and through a graph run, on every
backend (memory, SQLite, Postgres, Postgres+Redis). Each test states the rule it holds the
runtime to: a typed error or a defined behaviour, the same on every backend, nothing half-written,
no other thread or user affected. Every test here failed on at least one backend when written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import InvalidConfigError, StorageError
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

from .conftest import BACKENDS, make_checkpointer
from .tool_graphs import call, tool_graph, tool_texts

pytestmark = pytest.mark.asyncio


def one_node(cp: Any, node: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("m", node)
    g.add_edge(START, "m")
    g.add_edge("m", END)
    return g.compile(checkpointer=cp)


def msg(text: str, role: str = "user", **fields: Any) -> Message:
    m = Message.text_message(text, role=role)
    for k, v in fields.items():
        setattr(m, k, v)
    return m


async def status(cp: Any, cfg: dict[str, Any]) -> str | None:
    st = await cp.aget_state(dict(cfg))
    return None if st is None else str(st.execution_meta.status.value if hasattr(st.execution_meta.status, "value")
                                         else st.execution_meta.status)


# -- NUL (U+0000) in an object key ----------------------------------------------------------


async def test_a_tool_result_with_nul_in_a_dict_key_is_recorded_and_the_tool_runs_once(checkpointer, make_thread) -> None:
    """A NUL in a string value is stored as U+FFFD on Postgres (docs/bad-inputs.md); a NUL in a
    dict key made the whole step fail there ("unsupported Unicode escape sequence"): the thread
    stayed `running`, new input got STORAGE_BUSY_001, and every `ainvoke({})` ran the finished
    tool again and failed again."""
    ran: list[int] = []

    async def lookup(x: int) -> dict:
        """Looks x up."""
        ran.append(x)
        return {"a\x00b": x}

    tid = make_thread("nulkey-tool")
    app = tool_graph(AgentState, [lookup], [[call("c1", "lookup", {"x": 1})]], checkpointer=checkpointer)
    cfg = {"thread_id": tid}
    try:
        result = await app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg))
        first = None
    except StorageError as exc:
        result, first = None, exc
    try:
        await app.ainvoke({}, dict(cfg))
    except StorageError:
        pass
    assert ran == [1], f"the finished tool ran {len(ran)} times (first run: {first})"
    assert first is None, str(first)
    assert tool_texts(result["messages"])["c1"] in ([{"a\x00b": 1}], [{"a\ufffdb": 1}])
    assert await status(checkpointer, cfg) == "completed"


async def test_a_nul_in_a_message_metadata_key_is_stored_like_a_nul_in_its_text(checkpointer, make_thread) -> None:
    """Through a run and through aput_messages: stored (as U+FFFD on Postgres), as a NUL in the
    text or in a metadata value is; on Postgres the step failed with STORAGE_001 and left the
    thread `running` (new input refused with STORAGE_BUSY_001)."""

    async def node(state: AgentState) -> Message:
        return msg("answer", role="assistant", metadata={"k\x00": 1})

    tid = make_thread("nulkey-msg")
    cfg = {"thread_id": tid}
    await one_node(checkpointer, node).ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    st = await checkpointer.aget_state(dict(cfg))
    assert [m.metadata for m in st.context][1] in ({"k\x00": 1}, {"k\ufffd": 1})
    assert await status(checkpointer, cfg) == "completed"

    other = {"thread_id": make_thread("nulkey-put")}
    await checkpointer.aput_messages(dict(other), [msg("x", tools_calls=[{"id": "c", "function": {"arguments": {"a\x00": 1}}}])])
    assert len(await checkpointer.alist_messages(dict(other))) == 1


# -- message ids that are one key as stored ---------------------------------------------------


async def test_aput_messages_with_one_id_twice_keeps_the_last_on_every_backend(checkpointer, make_thread) -> None:
    """Memory and SQLite upsert in order (the last text wins; 10xGraph's Postgres did too, one
    INSERT per message). Our Postgres sent both rows in one INSERT ... ON CONFLICT and failed
    with STORAGE_001 "ON CONFLICT DO UPDATE command cannot affect row a second time"."""
    tid = make_thread("dup")
    cfg = {"thread_id": tid}
    await checkpointer.aput_messages(dict(cfg), [msg("first", message_id="dup"), msg("second", message_id="dup")])
    assert [(m.message_id, m.text()) for m in await checkpointer.alist_messages(dict(cfg))] == [("dup", "second")]
    await checkpointer.aput_state(dict(cfg), AgentState(context=[msg("a", message_id=7), msg("b", message_id="7")]))
    assert [m.text() for m in (await checkpointer.aget_state(dict(cfg))).context] in (["b"], ["a", "b"])


async def test_a_node_s_messages_with_ids_7_and_str_7_are_kept_or_refused_not_half_stored(checkpointer, make_thread) -> None:
    """Python keeps both (7 != "7"), every store keys both as "7". Memory and SQLite silently
    kept one of the node's two messages (the run returned both); Postgres failed the step with
    STORAGE_001 and left the thread `running` for good."""
    n = uuid.uuid4().int % 10**12

    async def node(state: AgentState) -> list[Message]:
        return [msg("as int", role="assistant", message_id=n), msg("as str", role="assistant", message_id=str(n))]

    tid = make_thread("int-str")
    cfg = {"thread_id": tid}
    try:
        result = await one_node(checkpointer, node).ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    except (ValueError, InvalidConfigError) as exc:  # a clear refusal is fine: then nothing of the step
        st = await checkpointer.aget_state(dict(cfg))
        assert [m.text() for m in st.context] == ["hi"], exc
        assert await status(checkpointer, cfg) != "running"
        return
    returned = [m.text() for m in result["messages"]]
    stored = [m.text() for m in (await checkpointer.aget_state(dict(cfg))).context]
    assert stored == returned, "the run returned messages the store did not keep"


# -- the state cache key -------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
def isolated(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    return make_checkpointer(request.param, request, tmp_path, enforce_user_isolation=True)


async def test_the_state_cache_of_thread_a_b_user_c_is_not_that_of_thread_a_user_b_c(isolated, make_thread) -> None:
    """The cache key was "<thread>:<user>" (Redis: "state_cache:<thread>:<user>"), so user
    "b:c" writing the state cache of their thread "a" replaced what user "c" reads back from
    the state cache of their thread "a:b", under user isolation. The stop key had the same
    flaw and was fixed in session 7."""
    a = make_thread("sc")
    victim = {"thread_id": f"{a}:b", "user_id": "c"}
    attacker = {"thread_id": a, "user_id": "b:c"}
    await isolated.aput_state(dict(victim), AgentState(context=[Message.text_message("victim's")]))
    await isolated.aput_state_cache(dict(victim, _checkpoint_version=1), await isolated.aget_state(dict(victim)))
    await isolated.aput_state_cache(dict(attacker, _checkpoint_version=99),
                                    AgentState(context=[Message.text_message("FORGED")]))
    got = await isolated.aget_state_cache(dict(victim))
    assert [m.text() for m in got.context] == ["victim's"]


# -- user ids the run and the checkpointer read differently ---------------------------------------


@pytest.mark.parametrize("uid", [0, "", False], ids=["zero", "empty", "false"])
async def test_a_falsy_user_id_reads_the_thread_its_own_run_wrote(isolated, make_thread, uid) -> None:
    """A run takes config["user_id"] as given (owner "0", "", "False"); the checkpointer took any
    falsy user_id as the anonymous user. Under isolation the caller's own thread was invisible to
    the same config (aget_state None) and `astop` found no run to stop."""

    async def node(state: AgentState) -> Message:
        return msg("ok", role="assistant")

    tid = make_thread("falsy")
    cfg = {"thread_id": tid, "user_id": uid}
    app = one_node(isolated, node)
    try:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    except (ValueError, InvalidConfigError):  # refusing a falsy user id outright is fine too
        assert await isolated.aget_thread_owner(tid) is None
        return
    st = await isolated.aget_state(dict(cfg))
    assert st is not None and [m.text() for m in st.context] == ["hi", "ok"]


# -- the public ledger API ------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["k" * 300, "a\x00b"], ids=["300-chars", "nul"])
async def test_aput_tool_result_answers_a_key_alike_on_every_backend(checkpointer, make_thread, key) -> None:
    """Memory and SQLite stored the key; Postgres raised STORAGE_001 with its own text ("value
    too long for type character varying(255)", "invalid byte sequence")."""
    cfg = {"thread_id": make_thread("lk")}
    await checkpointer.aput_messages(dict(cfg), [Message.text_message("hi")])
    try:
        await checkpointer.aput_tool_result(dict(cfg), key, {"__kind__": "raw", "value": 1})
    except InvalidConfigError as exc:
        assert exc.error_code == "STORAGE_CONFIG_002"
        try:
            assert await checkpointer.aget_tool_result(dict(cfg), key) is None
        except InvalidConfigError as read_exc:  # the read may refuse the key the same way
            assert read_exc.error_code == "STORAGE_CONFIG_002"
        return
    assert await checkpointer.aget_tool_result(dict(cfg), key) == {"__kind__": "raw", "value": 1}


# -- reads that decode what was stored --------------------------------------------------------------


async def test_a_message_read_by_id_or_listed_keeps_an_int_past_64_bits(checkpointer, make_thread) -> None:
    """aget_state reads 2**64 + 1 back exactly (the stored text goes to Python as it is);
    aget_message and alist_messages decoded it in Rust first and returned 1.8446744073709552e19."""
    cfg = {"thread_id": make_thread("bigint")}
    m = msg("x", metadata={"n": 2**64 + 1})
    await checkpointer.aput_state(dict(cfg), AgentState(context=[m]))
    assert (await checkpointer.aget_state(dict(cfg))).context[0].metadata == {"n": 2**64 + 1}
    assert (await checkpointer.aget_message(dict(cfg), m.message_id)).metadata == {"n": 2**64 + 1}
    assert [x.metadata for x in await checkpointer.alist_messages(dict(cfg))] == [{"n": 2**64 + 1}]


@pytest.mark.parametrize("mid", [2**63, 2**64], ids=["2**63", "2**64"])
async def test_an_int_message_id_past_i64_is_read_back_or_refused(checkpointer, make_thread, mid) -> None:
    """2**63 came back as the str "9223372036854775808" on Postgres (an int elsewhere); 2**64 was
    accepted everywhere, and afterwards every alist_messages of the thread raised a pydantic
    ValidationError on memory and SQLite (the id read back as a float)."""
    cfg = {"thread_id": make_thread("bigid")}
    try:
        await checkpointer.aput_messages(dict(cfg), [msg("x", message_id=mid)])
    except (ValueError, InvalidConfigError):
        assert await checkpointer.alist_messages(dict(cfg)) == []
        return
    assert [m.message_id for m in await checkpointer.alist_messages(dict(cfg))] == [mid]


async def test_a_message_nested_150_deep_is_refused_or_readable(checkpointer, make_thread) -> None:
    """aput_messages (and a node) stored it on every backend; aget_state read it, but every
    alist_messages / aget_message of the thread then failed: STORAGE_001 "recursion limit
    exceeded" (SQLite, Postgres) or a ValidationError on None (memory)."""
    deep: dict = {"leaf": 1}
    for _ in range(150):
        deep = {"k": deep}
    cfg = {"thread_id": make_thread("deep")}
    m = msg("x", metadata=deep)
    try:
        await checkpointer.aput_messages(dict(cfg), [m])
    except ValueError:
        assert await checkpointer.alist_messages(dict(cfg)) == []
        return
    assert len(await checkpointer.alist_messages(dict(cfg))) == 1
    assert (await checkpointer.aget_message(dict(cfg), m.message_id)).metadata == deep


async def test_a_node_message_with_nul_keeps_its_int_past_64_bits(checkpointer, make_thread) -> None:
    """A message whose text holds an escaped NUL is decoded and re-encoded on its way to Postgres
    (messages.rs keyed_row), and the decode rounded 2**64 + 1 to 18446744073709552000: stored
    silently changed. Without the NUL the text goes as it is and keeps the int."""

    async def node(state: AgentState) -> Message:
        return msg("a\x00b", role="assistant", metadata={"n": 2**64 + 1})

    cfg = {"thread_id": make_thread("nul-bigint")}
    await one_node(checkpointer, node).ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    assert (await checkpointer.aget_state(dict(cfg))).context[1].metadata == {"n": 2**64 + 1}


# -- paging, search and the cache ------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{"limit": -1}, {"search": "\x00"}], ids=["limit-1", "search-nul"])
async def test_alist_messages_answers_a_bad_page_or_search_alike(checkpointer, make_thread, kw) -> None:
    """limit=-1: memory returned [], SQLite every message, Postgres STORAGE_001 "LIMIT must not be
    negative"; search="\\x00": Postgres STORAGE_001 "invalid byte sequence". The answer of the
    in-memory checkpointer is the reference here (any one answer, or a ValueError, would do)."""
    cfg = {"thread_id": make_thread("page")}
    msgs = [Message.text_message("a"), Message.text_message("b")]
    ref = InMemoryCheckpointer()
    for cp in (ref, checkpointer):
        await cp.aput_messages(dict(cfg), [m.model_copy() for m in msgs])

    async def answer(cp: Any) -> Any:
        try:
            return [m.text() for m in await cp.alist_messages(dict(cfg), **kw)]
        except ValueError as exc:
            return type(exc)
    assert await answer(checkpointer) == await answer(ref)


async def test_a_nul_in_a_cache_value_is_stored_as_elsewhere(checkpointer) -> None:
    """aput_cache_value is the one JSON write without the NUL replacement: Postgres without Redis
    (and with Redis down) raised STORAGE_001 "unsupported Unicode escape sequence"."""
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    await checkpointer.aput_cache_value(ns, "k", {"a": "x\x00y", "b\x00": 1})
    assert await checkpointer.aget_cache_value(ns, "k") in ({"a": "x\x00y", "b\x00": 1}, {"a": "x\ufffdy", "b\ufffd": 1})


async def test_a_reply_with_id_str_123_after_one_with_id_123_does_not_overwrite_it(checkpointer, make_thread) -> None:
    """Turn 1's reply has the message id 123, turn 2's "123" (ids a model server or an id
    generator can give). Both stayed in the live context, but the store upserted turn 2's reply
    over turn 1's row: the stored thread read back as [q1, "answer 2", q2], turn 1's answer lost
    and the order wrong, on every backend, with no error. (tests_py/test_ledger_keys.py's
    int-and-string case runs this scenario and checks only the tool results.)"""

    async def node(state: AgentState) -> Message:
        n = sum(1 for m in state.context if m.role == "user")
        return msg(f"answer {n}", role="assistant", message_id=123 if n == 1 else "123")

    cfg = {"thread_id": make_thread("twins")}
    app = one_node(checkpointer, node)
    await app.ainvoke({"messages": [Message.text_message("q1")]}, dict(cfg))
    try:
        await app.ainvoke({"messages": [Message.text_message("q2")]}, dict(cfg))
    except (ValueError, InvalidConfigError):  # refusing the second turn is a clear answer
        assert [m.text() for m in (await checkpointer.alist_messages(dict(cfg)))][:2] == ["q1", "answer 1"]
        assert await status(checkpointer, cfg) != "running"
        return
    assert [m.text() for m in await checkpointer.alist_messages(dict(cfg))] == ["q1", "answer 1", "q2", "answer 2"]


async def test_a_nul_in_a_thread_metadata_key_or_a_state_dict_key_is_stored(checkpointer, make_thread) -> None:
    """The same rule as for a NUL in a string value (U+FFFD on Postgres): aput_thread and
    aput_state raised STORAGE_001 "unsupported Unicode escape sequence" on Postgres."""
    from tenxgraph.utils.thread_info import ThreadInfo

    tid = make_thread("nulkey-meta")
    await checkpointer.aput_thread({"thread_id": tid}, ThreadInfo(thread_id=tid, metadata={"k\x00": 1}))
    assert (await checkpointer.aget_thread({"thread_id": tid})).metadata in ({"k\x00": 1}, {"k\ufffd": 1})
    cfg = {"thread_id": make_thread("nulkey-state")}
    state = AgentState()
    state.execution_meta.internal_data["k\x00"] = 1
    await checkpointer.aput_state(dict(cfg), state)
    got = (await checkpointer.aget_state(dict(cfg))).execution_meta.internal_data
    assert got.get("k\x00", got.get("k\ufffd")) == 1


async def test_a_reply_whose_id_another_thread_holds_does_not_wedge_the_thread(checkpointer, make_thread) -> None:
    """A model server that repeats its completion ids across conversations gives two threads one
    message id. Memory and SQLite store both. Postgres (message_id is its messages table's key)
    refuses the second with STORAGE_FORBIDDEN_002 (naming the message as '') at the step's
    commit, and the thread stayed `running` for good: new input got STORAGE_BUSY_001 and every
    `ainvoke({})` called the model again and failed again. A refused step must leave the thread
    resumable with new input (an `error` status, as for a state the store cannot serialise), or
    the reply stored under a fresh id."""
    shared = f"chatcmpl-{uuid.uuid4().hex[:8]}"

    async def node(state: AgentState) -> Message:
        return msg("reply", role="assistant", message_id=shared)

    app = one_node(checkpointer, node)
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": make_thread("first")})
    cfg = {"thread_id": make_thread("second")}
    try:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    except StorageError as exc:
        assert str(shared) in str(exc), f"the error does not name the message: {exc}"
        assert exc.error_code == "STORAGE_FORBIDDEN_002"
    assert await status(checkpointer, cfg) != "running"
    # New input is taken (not STORAGE_BUSY_001); the node answers with the same taken id again,
    # so on Postgres that step is refused again, with the same clear error.
    try:
        await app.ainvoke({"messages": [Message.text_message("next question")]}, dict(cfg))
    except StorageError as exc:
        assert exc.error_code == "STORAGE_FORBIDDEN_002", exc
    assert await status(checkpointer, cfg) != "running"
