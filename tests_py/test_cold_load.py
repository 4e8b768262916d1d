"""The first turn of a thread in a process (a cold load): the store hands each message's stored
text through to one validation, unchanged, on every backend; the loaded objects are filed in the
oldest GC generation; a bad stored row is still the load's error, with nothing written."""

from __future__ import annotations

import gc
import json
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph, metrics
from tenxgraph.core.state.message import TokenUsages
from tenxgraph.core.state.message_block import (
    AnnotationBlock,
    AnnotationRef,
    AudioBlock,
    DataBlock,
    DocumentBlock,
    ErrorBlock,
    ImageBlock,
    MediaRef,
    ReasoningBlock,
    RemoteToolCallBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    VideoBlock,
)
from tenxgraph.storage.checkpointer import SqliteCheckpointer

from .conftest import make_checkpointer


def every_block(i: int) -> list[Any]:
    media = MediaRef(kind="url", url=f"https://example.com/{i}.bin", mime_type="image/png", size_bytes=i, width=3)
    return [
        TextBlock(text=f"text {i}: café 🚀 \u2028 \"quoted\" \\ back", annotations=[AnnotationRef(url="https://a", page=i)]),
        ImageBlock(media=media, alt_text="alt", bbox=[0.1, 0.25, 1e-7, 12345.5]),
        AudioBlock(media=MediaRef(kind="data", data_base64="AAAA"), transcript="hi", sample_rate=16000, channels=1),
        VideoBlock(media=media, thumbnail=MediaRef(kind="file_id", file_id=f"file-{i}")),
        DocumentBlock(media=media, pages=[1, 2, i], excerpt="…"),
        DataBlock(mime_type="application/json", data_base64="e30="),
        ToolCallBlock(id=f"call_{i}", name="lookup", args={"q": i, "nested": {"a": [1, {"b": None}]}}, tool_type="function"),
        RemoteToolCallBlock(id=f"remote_{i}", name="client_side", args={"x": True}),
        ToolResultBlock(call_id=f"call_{i}", output={"rows": [i, -i, 2**63 - 1], "ok": True}, status="completed"),
        ReasoningBlock(summary="because", details=["a", "b"], thinking="hmm", signature="sig"),
        AnnotationBlock(kind="note", refs=[AnnotationRef(title="t", index=i)], spans=[(0, 3), (4, 9)]),
        ErrorBlock(message="boom", code="E1", data={"retry": False}),
    ]


def thread_of(n: int, int_ids: bool = True) -> list[Message]:
    """``n`` messages whose contents cycle through every content-block kind and every field."""
    blocks = every_block(0)
    msgs = []
    for i in range(n):
        kind = i % (len(blocks) + 1)
        content = every_block(i) if kind == len(blocks) else [every_block(i)[kind]]
        msgs.append(Message(
            message_id=i if int_ids and i % 7 == 3 else f"m-{i}",
            role=("user", "assistant", "tool", "system")[i % 4],
            content=content,
            tools_calls=[{"id": f"call_{i}", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]
            if i % 4 == 1 else None,
            reasoning="why" if i % 5 == 0 else None,
            timestamp=1_700_000_000.123456 + i,
            metadata={"i": i, "ünï": "✓", "deep": [[[{"k": [i]}]]]},
            usages=TokenUsages(completion_tokens=i, prompt_tokens=2 * i, total_tokens=3 * i) if i % 3 == 0 else None,
            raw={"provider": "x", "n": i} if i % 6 == 0 else None,
            parsed_content={"answer": i} if i % 8 == 0 else None,
        ))
    return msgs


class Seen:
    """What the node saw of the loaded state."""

    def __init__(self) -> None:
        self.dumps: list[dict[str, Any]] = []
        self.first: Any = None
        self.in_oldest_generation: bool | None = None


def build(cp: Any, seen: Seen, *, check_generation: bool = False) -> Any:
    async def reply(state: AgentState, config: dict[str, Any]) -> AgentState:
        seen.dumps = [m.model_dump(mode="json") for m in state.context]
        seen.first = state.context[0]
        if check_generation:
            oldest = gc.get_objects(generation=2)
            seen.in_oldest_generation = any(o is state.context[0] for o in oldest)
        state.context.append(Message.text_message("done", role="assistant"))
        return state

    g = StateGraph(AgentState())
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=cp)


def history_loads() -> float:
    return metrics.snapshot()["tenxgraph.storage.history_loads"]


@pytest.mark.asyncio
async def test_a_thousand_messages_of_every_block_kind_come_back_equal_through_a_cold_load(
    checkpointer: Any, make_thread: Any, request: pytest.FixtureRequest
) -> None:
    # Int message ids are kept as ints in memory and SQLite; Postgres stores every id as text
    # (docs/migrating-from-10xgraph.md, id_generator), which is not what this test is about.
    int_ids = not request.node.callspec.params["checkpointer"].startswith("postgres")
    t = make_thread()
    original = thread_of(1000, int_ids)
    state = AgentState()
    state.context = original
    await checkpointer.aput_state({"thread_id": t}, state)
    seen = Seen()
    app = build(checkpointer, seen)  # a new graph: no live state of the thread in it
    loads = history_loads()
    await app.ainvoke({"messages": [Message.text_message("next", role="user")]}, {"thread_id": t})
    assert history_loads() - loads == 1, "the run loaded the thread's history"
    assert len(seen.dumps) == 1001
    assert seen.dumps[:1000] == [m.model_dump(mode="json") for m in original]
    assert seen.dumps[1000]["content"][0]["text"] == "next"
    assert [type(b) for b in seen.first.content] == [type(b) for b in original[0].content]
    assert isinstance(seen.dumps[3]["message_id"], int if int_ids else str)


# Written by hand into a stored row: escapes, integers past 64 bits, tiny and huge floats,
# deep nesting. The load must give the validation these exact values.
ODD_METADATA = (
    '{"esc": "caf\\u00e9 \\ud83d\\ude80 \\u0001 \\" \\\\ \\/", "big": 1180591620717411303427, '
    '"neg_big": -36893488147419103233, "u64": 18446744073709551615, "i64": -9223372036854775808, '
    '"small": 1e-300, "exp": 6.02214076e-23, "float": 12.5, "neg_zero": -0.0, '
    '"nested": ' + "[" * 60 + '{"leaf": "ok"}' + "]" * 60 + "}"
)


def odd_message_text(message_id: str) -> str:
    return (
        '{"message_id": "' + message_id + '", "role": "user", '
        '"content": [{"type": "text", "text": "odd \\u2603", "annotations": []}], '
        '"metadata": ' + ODD_METADATA + "}"
    )


async def seed(cp: Any, t: str) -> None:
    state = AgentState()
    state.context = [Message.text_message(f"m{i}", message_id=f"m{i}") for i in range(3)]
    await cp.aput_state({"thread_id": t}, state)


def sqlite_set_message(db: Path, message_id: str, text: str) -> None:
    # Only with no checkpointer of ours open on the file: Python's sqlite3 is a second SQLite
    # library in the process, and closing its connection would break the other's locks.
    c = sqlite3.connect(db)
    try:
        with c:
            n = c.execute("UPDATE messages SET message_data = ? WHERE message_id = ?", (text, message_id)).rowcount
        assert n == 1
    finally:
        c.close()


def stored_rows(db: Path) -> tuple[list[int], int]:
    """The thread's state versions and its number of messages, read from the file."""
    c = sqlite3.connect(db)
    try:
        versions = [r[0] for r in c.execute("SELECT version FROM states ORDER BY version")]
        count = c.execute("SELECT count(*) FROM messages").fetchone()[0]
    finally:
        c.close()
    return versions, count


async def odd_row_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path, t: str, text: str) -> Any:
    """A store whose thread ``t`` has three messages, the second one's stored text ``text``."""
    cp = make_checkpointer(kind, request, tmp_path)
    await seed(cp, t)
    if kind == "sqlite":
        await cp.arelease()
        sqlite_set_message(tmp_path / "cp.db", "m1", text)
        return SqliteCheckpointer(tmp_path / "cp.db")
    pg = request.getfixturevalue("tenx_postgres")
    dbname = urllib.parse.urlsplit(pg.dsn).path.lstrip("/")
    quoted = text.replace("'", "''")
    pg.psql(f"UPDATE {cp.schema}.messages SET message_data = '{quoted}'::jsonb WHERE message_id = 'm1'", dbname=dbname)
    return cp


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_stored_row_with_odd_json_comes_back_identical(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, make_thread: Any
) -> None:
    t = make_thread()
    cp = await odd_row_store(kind, request, tmp_path, t, odd_message_text("m1"))
    seen = Seen()
    await build(cp, seen).ainvoke({"messages": [Message.text_message("next", role="user")]}, {"thread_id": t})
    expected = json.loads(ODD_METADATA)
    got = seen.dumps[1]["metadata"]
    # Before: integers past 64 bits came back as floats (1.1805916207174113e+21), which
    # compare unequal to these (not powers of two).
    assert got == expected
    assert type(got["big"]) is int and type(got["neg_big"]) is int
    assert seen.dumps[1]["content"][0]["text"] == "odd ☃"
    assert [d["message_id"] for d in seen.dumps] == ["m0", "m1", "m2", seen.dumps[3]["message_id"]]


@pytest.mark.asyncio
async def test_a_stored_message_that_is_not_json_fails_the_load_and_writes_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, make_thread: Any
) -> None:
    from tenxgraph.core.exceptions import StorageError

    t = make_thread()
    cp = await odd_row_store("sqlite", request, tmp_path, t, '{"message_id": "m1", "role": "user", not json')
    seen = Seen()
    with pytest.raises(StorageError) as err:
        await build(cp, seen).ainvoke({"messages": [Message.text_message("next", role="user")]}, {"thread_id": t})
    assert err.value.error_code == "STORAGE_001" and "load messages" in str(err.value)
    assert seen.dumps == [], "no node ran"
    assert gc.isenabled()
    await cp.arelease()
    assert stored_rows(tmp_path / "cp.db") == ([1], 3), "the input was not committed"



@pytest.mark.asyncio
async def test_a_stored_message_the_model_refuses_fails_the_load_with_the_collector_back_on(
    request: pytest.FixtureRequest, tmp_path: Path, make_thread: Any
) -> None:
    from pydantic import ValidationError

    t = make_thread()
    cp = await odd_row_store("sqlite", request, tmp_path, t, '{"message_id": "m1", "role": "robot", "content": []}')
    seen = Seen()
    assert gc.isenabled()
    with pytest.raises(ValidationError, match="role"):
        await build(cp, seen).ainvoke({"messages": [Message.text_message("next", role="user")]}, {"thread_id": t})
    assert gc.isenabled(), "the collector is enabled again after a failed validation"
    assert seen.dumps == []
    await cp.arelease()
    assert stored_rows(tmp_path / "cp.db") == ([1], 3), "the input was not committed"


@pytest.mark.asyncio
async def test_the_loaded_objects_are_filed_in_the_oldest_generation(make_thread: Any) -> None:
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    cp, t = InMemoryCheckpointer(), make_thread()
    state = AgentState()
    state.context = thread_of(300)
    await cp.aput_state({"thread_id": t}, state)
    seen = Seen()
    app = build(cp, seen, check_generation=True)
    # Every generation's counter at zero: what the run leaves in the young generations stays
    # there until the node looks, unless the load itself filed it in the oldest.
    gc.collect()
    await app.ainvoke({"messages": [Message.text_message("next", role="user")]}, {"thread_id": t})
    assert seen.in_oldest_generation is True


def in_a_generation(obj: Any) -> bool:
    """Whether the collector examines ``obj`` (frozen objects are in none of its generations)."""
    return any(o is obj for g in (0, 1, 2) for o in gc.get_objects(generation=g))


@pytest.mark.asyncio
async def test_a_process_that_froze_objects_keeps_them_frozen_and_a_disabled_collector_stays_off(
    make_thread: Any,
) -> None:
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    cp = InMemoryCheckpointer()
    t1, t2 = make_thread(), make_thread()
    for t in (t1, t2):
        state = AgentState()
        state.context = thread_of(50)
        await cp.aput_state({"thread_id": t}, state)
    sentinel = [object()]  # a tracked container of the process's own
    gc.collect()
    gc.freeze()
    try:
        assert gc.is_tracked(sentinel) and not in_a_generation(sentinel), "frozen"
        seen = Seen()
        await build(cp, seen, check_generation=True).ainvoke(
            {"messages": [Message.text_message("next", role="user")]}, {"thread_id": t1})
        assert len(seen.dumps) == 51
        assert not in_a_generation(sentinel), "the process's frozen objects were released"
        # Filed by one young collection instead (CPython 3.12 starts with objects frozen, so this
        # is every 3.12 process's path).
        assert seen.in_oldest_generation is True
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        seen = Seen()
        await build(cp, seen).ainvoke({"messages": [Message.text_message("next", role="user")]}, {"thread_id": t2})
        assert len(seen.dumps) == 51
        assert not gc.isenabled(), "a collector the process had disabled was enabled by the load"
    finally:
        gc.enable()
