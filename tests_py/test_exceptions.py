"""Structured exceptions: codes, str, to_dict, logging and pickling across processes."""

from __future__ import annotations

import importlib
import logging
import pickle
import sys
import types

import pytest

import tenxgraph.core
from tenxgraph.core import exceptions as exc

CODED = [
    (exc.GraphError, Exception, "GRAPH_000"),
    (exc.NodeError, exc.GraphError, "NODE_000"),
    (exc.GraphRecursionError, exc.GraphError, "RECURSION_000"),
    (exc.NodeTimeoutError, exc.NodeError, "NODE_TIMEOUT_000"),
    (exc.StorageError, Exception, "STORAGE_000"),
    (exc.TransientStorageError, exc.StorageError, "STORAGE_TRANSIENT_000"),
    (exc.SerializationError, exc.StorageError, "STORAGE_SERIALIZATION_000"),
    (exc.SchemaVersionError, exc.StorageError, "STORAGE_SCHEMA_000"),
    (exc.StaleStateError, exc.StorageError, "STORAGE_CONFLICT_000"),
    (exc.ResourceNotFoundError, exc.StorageError, "STORAGE_NOT_FOUND_000"),
    (exc.ThreadBusyError, exc.StorageError, "STORAGE_BUSY_000"),
    (exc.MetricsError, Exception, "METRICS_000"),
]
IDS = [cls.__name__ for cls, _, _ in CODED]


@pytest.mark.parametrize(("cls", "base", "code"), CODED, ids=IDS)
def test_hierarchy_and_default_code(cls: type, base: type, code: str) -> None:
    assert issubclass(cls, base)
    err = cls("boom")
    assert err.message == "boom"
    assert err.error_code == code
    assert err.context == {}
    assert str(err) == f"[{code}] boom"
    assert err.args == ("boom",)


@pytest.mark.parametrize(("cls", "base", "code"), CODED, ids=IDS)
def test_explicit_code_context_and_to_dict(cls: type, base: type, code: str) -> None:
    ctx = {"node_name": "n1", "attempt": 2}
    err = cls("went wrong", "X_042", ctx)
    assert str(err) == "[X_042] went wrong"
    assert err.context is ctx
    assert err.to_dict() == {
        "error_type": cls.__name__,
        "error_code": "X_042",
        "message": "went wrong",
        "context": ctx,
    }
    by_keyword = cls(message="m", error_code="K_1", context={"a": 1})
    assert (by_keyword.error_code, by_keyword.context) == ("K_1", {"a": 1})


@pytest.mark.parametrize(("cls", "base", "code"), CODED, ids=IDS)
def test_pickle_round_trip_keeps_everything(cls: type, base: type, code: str) -> None:
    err = cls("lost", "CODE_7", {"thread_id": "t1", "n": [1, 2]})
    err.extra_attr = "kept"
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is cls
    assert clone.message == "lost"
    assert clone.error_code == "CODE_7"
    assert clone.context == {"thread_id": "t1", "n": [1, 2]}
    assert clone.extra_attr == "kept"
    assert str(clone) == "[CODE_7] lost"
    assert clone.to_dict() == err.to_dict()


def test_unpickling_does_not_log_again(caplog: pytest.LogCaptureFixture) -> None:
    err = exc.NodeError("once")
    data = pickle.dumps(err)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="tenxgraph.exceptions"):
        pickle.loads(data)
    assert caplog.records == []


def test_constructor_logs_at_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="tenxgraph.exceptions"):
        exc.NodeError("node exploded", "NODE_001")
    [record] = caplog.records
    assert record.name == "tenxgraph.exceptions"
    assert record.levelno == logging.ERROR
    assert "node exploded" in record.getMessage()
    assert "NODE_001" in record.getMessage()


@pytest.mark.parametrize("cls", [exc.StaleStateError, exc.ThreadBusyError])
def test_concurrency_conflicts_log_at_warning(
    cls: type, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="tenxgraph.exceptions"):
        cls("version moved")
    [record] = caplog.records
    assert record.levelno == logging.WARNING


def test_catching_by_base_class_and_cause_chain() -> None:
    original = ValueError("bad input")
    with pytest.raises(exc.GraphError) as info:
        try:
            raise original
        except ValueError as cause:
            raise exc.NodeTimeoutError("too slow", "NODE_TIMEOUT_001") from cause
    assert isinstance(info.value, exc.NodeError)
    assert info.value.__cause__ is original
    assert info.value.error_code == "NODE_TIMEOUT_001"


def test_storage_errors_are_not_graph_errors() -> None:
    assert not issubclass(exc.StorageError, exc.GraphError)
    assert not issubclass(exc.MetricsError, exc.GraphError)
    assert not issubclass(exc.GraphError, exc.StorageError)


def test_repr_names_the_fields() -> None:
    text = repr(exc.StorageError("s", "STORAGE_001", {"k": 1}))
    assert text == "StorageError(message='s', error_code='STORAGE_001', context={'k': 1})"


def test_graph_stop_requested() -> None:
    assert issubclass(exc.GraphStopRequested, Exception)
    assert not hasattr(exc.GraphStopRequested(), "error_code")
    assert exc.GraphStopRequested().node_name is None
    stop = exc.GraphStopRequested("agent")
    assert stop.node_name == "agent"
    assert "agent" in str(stop)
    clone = pickle.loads(pickle.dumps(stop))
    assert type(clone) is exc.GraphStopRequested
    assert clone.node_name == "agent"
    assert pickle.loads(pickle.dumps(exc.GraphStopRequested())).node_name is None


def test_stop_requested_does_not_log(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="tenxgraph.exceptions"):
        exc.GraphStopRequested("n")
    assert caplog.records == []


@pytest.mark.parametrize("name", [*exc.__all__])
def test_core_reexports_every_exception(name: str) -> None:
    assert getattr(tenxgraph.core, name) is getattr(exc, name)


def test_core_lazily_exports_graph_names(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("tenxgraph.core.graph")
    names = ("StateGraph", "CompiledGraph", "Edge", "Node", "ToolNode")
    sentinels = {n: type(n, (), {}) for n in names}
    for n, obj in sentinels.items():
        setattr(fake, n, obj)
    monkeypatch.setitem(sys.modules, "tenxgraph.core.graph", fake)
    core = importlib.import_module("tenxgraph.core")
    for n in sentinels:
        # A real graph module may already have been resolved and cached by another test.
        monkeypatch.delitem(vars(core), n, raising=False)
    try:
        for n, obj in sentinels.items():
            assert getattr(core, n) is obj
            assert n in dir(core)
    finally:
        for n in sentinels:
            vars(core).pop(n, None)


def test_core_unknown_attribute_is_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        tenxgraph.core.NoSuchThing  # noqa: B018


@pytest.mark.asyncio
async def test_a_failed_threads_stored_error_carries_its_code(checkpointer, make_thread) -> None:  # type: ignore[no-untyped-def]
    """As 10xGraph stores it, ``str()`` of the raised exception: "[NODE_001] Error in node ...".
    The code was missing, so code reading a failed thread could not tell what failed it
    (differential red-team, session 35)."""
    from tenxgraph import END, AgentState, Message, StateGraph
    from tenxgraph.core.exceptions import GraphRecursionError, NodeError

    def boom(state: AgentState) -> None:
        raise RuntimeError("boom")

    g = StateGraph(AgentState)
    g.add_node("A", boom)
    g.set_entry_point("A")
    g.add_edge("A", END)
    app = g.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread()}
    with pytest.raises(NodeError) as err:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    stored = await checkpointer.aget_state(dict(cfg))
    assert stored.execution_meta.internal_data["error"] == str(err.value)
    assert str(err.value).startswith("[NODE_001] Error in node 'A'")

    loop = StateGraph(AgentState)
    loop.add_node("A", lambda s: Message.text_message("again", role="assistant"))
    loop.set_entry_point("A")
    loop.add_edge("A", "A")
    app = loop.compile(checkpointer=checkpointer)
    cfg = {"thread_id": make_thread(), "recursion_limit": 3}
    with pytest.raises(GraphRecursionError) as rec:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))
    stored = await checkpointer.aget_state(dict(cfg))
    assert stored.execution_meta.internal_data["error"] == str(rec.value)
    assert stored.execution_meta.internal_data["error"].startswith("[RECURSION_001] ")
