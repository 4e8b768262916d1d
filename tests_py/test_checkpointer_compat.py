"""Checkpointers as 10xGraph 0.10 users write and use them (issue 14, item 9).

PgCheckpointer connects on first use, not in its constructor; the classes subscript
(``InMemoryCheckpointer[MyState]``); BaseCheckpointer is abstract and its sync twins run the
instance's own async methods; the return values are 10xGraph's (differential tests below run the
same script on 10xGraph 0.10.0).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import GraphError, TransientStorageError
from tenxgraph.storage.checkpointer import (
    BaseCheckpointer,
    InMemoryCheckpointer,
    PgCheckpointer,
    SqliteCheckpointer,
)
from tenxgraph.testing.services import PostgresServer
from tenxgraph.utils.thread_info import ThreadInfo
from tests_py.test_pg_races_and_outages import _pg_ctl, _pg_start, private_pg  # noqa: F401  (fixture)


class Billing(AgentState):
    invoice: str = ""
    amount: int = 0


def _dead_dsn() -> str:
    # A port that was free a moment ago: nothing listens there.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://app@127.0.0.1:{port}/nowhere"


def _echo_graph(cp: BaseCheckpointer) -> Any:
    g = StateGraph(AgentState)
    g.add_node("echo", lambda s: [Message.text_message("echo:" + s.context[-1].text(), role="assistant")])
    g.set_entry_point("echo")
    g.add_edge("echo", END)
    return g.compile(checkpointer=cp)


# -- a. PgCheckpointer(...) does not connect ------------------------------------------------


def test_module_level_checkpointer_imports_while_the_database_is_down(tmp_path: Path) -> None:
    """A module as ``10xgraph.json`` names it (``graph.agent:checkpointer``), imported with its
    database unreachable: the import succeeds; the first use fails with the typed error."""
    (tmp_path / "agent_mod.py").write_text(textwrap.dedent(f"""
        from tenxgraph import END, AgentState, Message, StateGraph
        from tenxgraph.storage.checkpointer import PgCheckpointer

        checkpointer = PgCheckpointer(postgres_dsn={_dead_dsn()!r}, pool_config={{"timeout": 1.0}})
        g = StateGraph(AgentState)
        g.add_node("a", lambda s: [Message.text_message("x", role="assistant")])
        g.set_entry_point("a")
        g.add_edge("a", END)
        app = g.compile(checkpointer=checkpointer)
    """))
    probe = textwrap.dedent("""
        import agent_mod
        print("imported")
        from tenxgraph.core.exceptions import TransientStorageError
        try:
            agent_mod.app.invoke({"messages": []}, {"thread_id": "t"})
        except TransientStorageError as e:
            print("first use:", e.error_code)
    """)
    import tenxgraph

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(tenxgraph.__file__).parents[1])])}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["imported", "first use: STORAGE_TRANSIENT_001"], (r.stdout, r.stderr[-2000:])


@pytest.mark.asyncio
async def test_first_use_of_an_unreachable_database_is_the_typed_error() -> None:
    cp = PgCheckpointer(postgres_dsn=_dead_dsn(), pool_config={"timeout": 1.0})
    app = _echo_graph(cp)  # compiling does not connect either
    for use in (cp.asetup(), cp.aget_state({"thread_id": "t"}),
                app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t"})):
        with pytest.raises(TransientStorageError) as info:
            await use
        assert info.value.error_code == "STORAGE_TRANSIENT_001"
    assert await cp.arelease() is None  # closing a never-opened store connects to nothing


@pytest.mark.parametrize("bad", [
    {"postgres_dsn": "not a dsn"},
    {"postgres_dsn": "postgresql://app@127.0.0.1:1/x", "schema": "bad; drop"},
    {"postgres_dsn": "postgresql://app@127.0.0.1:1/x", "redis_url": "nope://"},
], ids=["dsn", "schema", "redis_url"])
def test_a_malformed_setting_still_fails_in_the_constructor(bad: dict[str, str]) -> None:
    """Only the connection waits for first use: what can be checked without I/O is checked now."""
    with pytest.raises(ValueError):
        PgCheckpointer(**bad)


@pytest.mark.asyncio
async def test_a_real_postgres_works_without_setup(pg_dsn: str) -> None:
    cp = PgCheckpointer(pg_dsn, schema="lazy_a")
    out = await _echo_graph(cp).ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t1"})
    assert [m.text() for m in out["messages"]] == ["hi", "echo:hi"]
    assert await cp.asetup() is True
    await cp.arelease()


@pytest.mark.asyncio
async def test_postgres_started_after_construction_is_picked_up(private_pg: PostgresServer) -> None:  # noqa: F811
    dsn = private_pg.create_database("lazy_later")
    await asyncio.to_thread(_pg_ctl, private_pg, "-m", "fast", "stop")
    try:
        cp = PgCheckpointer(dsn, pool_config={"timeout": 1.0})
        app = _echo_graph(cp)
        with pytest.raises(TransientStorageError):
            await app.ainvoke({"messages": [Message.text_message("early")]}, {"thread_id": "t"})
    finally:
        await asyncio.to_thread(_pg_start, private_pg)
    # The failed open is not remembered: the same instance connects now.
    out = await app.ainvoke({"messages": [Message.text_message("late")]}, {"thread_id": "t"})
    assert [m.text() for m in out["messages"]] == ["late", "echo:late"]
    assert await cp.asetup() is True
    await cp.arelease()
    other = PgCheckpointer(dsn)
    state = await other.aget_state({"thread_id": "t", "user_id": "anonymous"})
    assert state is not None and [m.text() for m in state.context] == ["late", "echo:late"]
    await other.arelease()


# -- b. generics, abstract base, sync twins -------------------------------------------------


@pytest.mark.parametrize("cls", [BaseCheckpointer, InMemoryCheckpointer, SqliteCheckpointer, PgCheckpointer])
def test_checkpointer_classes_subscript(cls: type) -> None:
    alias = cls[Billing]
    assert alias.__origin__ is cls


@pytest.mark.asyncio
async def test_a_declared_state_class_is_what_rows_come_back_as(tmp_path: Path) -> None:
    for cp in (InMemoryCheckpointer[Billing](), SqliteCheckpointer[Billing](tmp_path / "b.db")):
        cfg = {"thread_id": "t", "user_id": "u"}
        await cp.aput_state(cfg, Billing(invoice="INV-1", amount=42))
        got = await cp.aget_state({"thread_id": "t", "user_id": "u"})
        assert type(got) is Billing and (got.invoice, got.amount) == ("INV-1", 42)


def test_a_declared_state_class_refuses_another_graphs_state() -> None:
    class Other(AgentState):
        x: int = 0

    g = StateGraph(Other())
    g.add_node("n", lambda s: [])
    g.set_entry_point("n")
    g.add_edge("n", END)
    with pytest.raises(ValueError, match="declared for state class 'Billing'"):
        g.compile(checkpointer=InMemoryCheckpointer[Billing]())


def test_base_checkpointer_is_abstract() -> None:
    with pytest.raises(TypeError):
        BaseCheckpointer()  # type: ignore[abstract]

    class Half(BaseCheckpointer[AgentState]):
        async def aget_state(self, config: dict[str, Any]) -> AgentState | None:
            return None

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]


class DictCheckpointer(BaseCheckpointer[AgentState]):
    """A user's checkpointer written in Python, storing into dicts."""

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[str, AgentState] = {}
        self.calls: list[str] = []

    async def asetup(self) -> Any:
        return "ready"

    async def aput_state(self, config: dict[str, Any], state: AgentState) -> AgentState:
        self.calls.append("aput_state")
        self.states[config["thread_id"]] = state
        return state

    async def aget_state(self, config: dict[str, Any]) -> AgentState | None:
        self.calls.append("aget_state")
        return self.states.get(config["thread_id"])

    async def aclear_state(self, config: dict[str, Any]) -> Any:
        return self.states.pop(config["thread_id"], None) is not None

    async def aput_state_cache(self, config: dict[str, Any], state: AgentState) -> Any:
        return None

    async def aget_state_cache(self, config: dict[str, Any]) -> AgentState | None:
        return None

    async def aput_messages(self, config: dict[str, Any], messages: list[Message], metadata: Any = None) -> Any:
        return None

    async def aget_message(self, config: dict[str, Any], message_id: str | int) -> Message:
        raise IndexError(message_id)

    async def alist_messages(self, config: dict[str, Any], search: Any = None, offset: Any = None,
                             limit: Any = None) -> list[Message]:
        return []

    async def adelete_message(self, config: dict[str, Any], message_id: str | int) -> Any:
        return None

    async def aput_thread(self, config: dict[str, Any], thread_info: ThreadInfo) -> Any:
        return None

    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        return None

    async def alist_threads(self, config: dict[str, Any], search: Any = None, offset: Any = None,
                            limit: Any = None) -> list[ThreadInfo]:
        return []

    async def aclean_thread(self, config: dict[str, Any]) -> Any:
        return None

    async def arelease(self) -> Any:
        return None


def test_sync_twins_run_the_subclass_methods() -> None:
    cp = DictCheckpointer()
    assert cp.setup() == "ready"
    cfg = {"thread_id": "t"}
    cp.put_state(cfg, AgentState())
    assert cp.get_state(cfg) is cp.states["t"]
    assert cp.calls == ["aput_state", "aget_state"]
    assert cp.clear_state(cfg) is True and cp.get_state(cfg) is None
    # Defaults of the base: no cache, no ledger (None), stop requests through the cache.
    assert cp.get_cache_value("ns", "k") is None and cp.list_cache_keys("ns") == []
    assert cp.get_tool_result(cfg, "m:c") is None and cp.is_stop_requested(cfg) is False


@pytest.mark.asyncio
async def test_sync_twins_work_inside_a_running_loop() -> None:
    cp = DictCheckpointer()
    cp.put_state({"thread_id": "t"}, AgentState())  # an async app calling the sync API
    assert cp.get_state({"thread_id": "t"}) is not None


@pytest.mark.asyncio
async def test_a_subclass_of_a_builtin_overriding_aget_state_is_seen_by_get_state() -> None:
    seen: list[str] = []

    class Audited(InMemoryCheckpointer[AgentState]):
        async def aget_state(self, config: dict[str, Any]) -> AgentState | None:
            seen.append(config["thread_id"])
            return await super().aget_state(config)

    cp = Audited()
    await cp.aput_state({"thread_id": "t"}, AgentState())
    assert await asyncio.to_thread(cp.get_state, {"thread_id": "t"}) is not None
    assert seen == ["t"]


def test_compiling_a_python_checkpointer_is_refused_with_a_typed_error() -> None:
    """The Rust loop cannot drive a checkpointer written in Python yet: running its graph anyway
    would give up step commits and replay safety, so compile() says so instead."""
    with pytest.raises(GraphError) as info:
        _echo_graph(DictCheckpointer())
    assert info.value.error_code == "GRAPH_CHECKPOINTER_001"
    assert "DictCheckpointer" in str(info.value)
