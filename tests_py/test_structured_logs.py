"""Log lines about a run carry its fields as LogRecord attributes (what JSON formatters and log
shippers index), from the Rust core and from Python; the not-recorded alert line is stable."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import NodeError
from tenxgraph.core.state.tool_result import ToolResult
from tenxgraph.logs import NOT_RECORDED_EVENT, NOT_RECORDED_MESSAGE, RunFieldsDefaults, reset_level_cache
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tests_py.tool_graphs import call, tool_graph, tool_texts


def user(text: str) -> Message:
    return Message.text_message(text)


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Everything from tenxgraph at DEBUG, Rust lines included (their level cache is reset)."""
    caplog.set_level(logging.DEBUG, logger="tenxgraph")
    reset_level_cache()
    yield caplog
    caplog.handler.records.clear()
    logging.getLogger("tenxgraph").setLevel(logging.NOTSET)
    reset_level_cache()


async def _broken_ledger(db: Path) -> SqliteCheckpointer:
    """A store whose ledger writes fail. The trigger is added while no store has the file open:
    Python's sqlite3 is a second SQLite library in this process, and closing its connection while
    the bundled one has the file open breaks the other's POSIX locks (disk I/O errors)."""
    made = SqliteCheckpointer(db)
    await made.asetup()  # creates the tables (a checkpointer opens its file on first use)
    await made.arelease()
    c = sqlite3.connect(db)
    with c:
        c.execute("CREATE TRIGGER no_ledger BEFORE INSERT ON tool_executions BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    c.close()
    return SqliteCheckpointer(db)


@pytest.mark.asyncio
async def test_not_recorded_alert_line_is_stable_and_structured(tmp_path: Path, debug_logs) -> None:
    cp = await _broken_ledger(tmp_path / "nowrite.db")

    async def charge() -> str:
        return "charged"

    app = tool_graph(AgentState, [charge], [[call("c1", "charge", {})]], checkpointer=cp)
    await app.ainvoke({"messages": [user("x")]}, {"thread_id": "order-7", "run_id": "run-42"})

    [alert] = [r for r in debug_logs.records if getattr(r, "event", None) == NOT_RECORDED_EVENT]
    assert alert.name == "tenxgraph.engine.tools" and alert.levelno == logging.ERROR
    assert alert.getMessage() == NOT_RECORDED_MESSAGE == "tool call COMPLETED but could not be recorded; a replay of this node may run it again"
    assert (alert.thread_id, alert.run_id, alert.node, alert.tool) == ("order-7", "run-42", "tools", "charge")
    assert json.loads(alert.ledger_key)[1] == "c1" and "disk full" in alert.error

    # A JSON formatter indexes the fields as they are.
    line = json.loads(json.dumps({k: getattr(alert, k) for k in ("message", "event", "thread_id", "run_id", "node", "tool")}
                                 | {"message": alert.getMessage()}))
    assert line["event"] == "tool_result_not_recorded" and line["tool"] == "charge"


@pytest.mark.asyncio
async def test_every_rust_line_of_a_run_carries_thread_and_run(tmp_path: Path, debug_logs) -> None:
    async def hang() -> str:
        await asyncio.sleep(30)
        return "never"

    app = tool_graph(AgentState, [hang], [[call("c1", "hang", {})]], checkpointer=SqliteCheckpointer(tmp_path / "a.db"))
    await app.ainvoke({"messages": [user("x")]}, {"thread_id": "t-rust", "run_id": "r-rust", "tool_timeout": 0.2})

    rust = [r for r in debug_logs.records if r.name.startswith("tenxgraph.engine")]
    assert len(rust) >= 4, [r.getMessage() for r in rust]  # step commits and the timeout at least
    for r in rust:
        assert (r.thread_id, r.run_id) == ("t-rust", "r-rust"), (r.name, r.getMessage())
    [timeout] = [r for r in rust if "timed out" in r.getMessage()]
    assert (timeout.node, timeout.tool, timeout.levelno) == ("tools", "hang", logging.WARNING)
    # A commit after a node names that node; the input's commit comes before any node.
    commits = [r for r in rust if r.getMessage() == "step committed"]
    assert not hasattr(commits[0], "node")
    assert [c.node for c in commits[1:]] == ["model", "tools", "model"]
    assert all(c.version.isdigit() for c in commits)


@pytest.mark.asyncio
async def test_python_lines_of_a_run_carry_the_same_fields(tmp_path: Path, debug_logs) -> None:
    async def refuse(order_id: str) -> str:
        raise RuntimeError("card declined")

    app = tool_graph(AgentState, [refuse], [[call("c9", "refuse", {"order_id": "1"})]],
                     checkpointer=SqliteCheckpointer(tmp_path / "p.db"))
    r = await app.ainvoke({"messages": [user("x")]}, {"thread_id": "t-py", "run_id": "r-py", "node_timeout": "soon"})
    assert "card declined" in tool_texts(r["messages"])["c9"]

    [failed] = [r for r in debug_logs.records if r.name == "tenxgraph.graph.tool_node" and "failed" in r.getMessage()]
    assert (failed.thread_id, failed.run_id, failed.node, failed.tool) == ("t-py", "r-py", "tools", "refuse")
    [bad_timeout] = [r for r in debug_logs.records if "invalid node_timeout" in r.getMessage()]
    assert (bad_timeout.thread_id, bad_timeout.run_id) == ("t-py", "r-py")

    async def crash(state: AgentState) -> Message:
        raise ValueError("bug in node")

    g = StateGraph(AgentState)
    g.add_node("crash", crash)
    g.add_edge(START, "crash")
    g.add_edge("crash", END)
    with pytest.raises(NodeError):
        await g.compile(checkpointer=SqliteCheckpointer(tmp_path / "q.db")).ainvoke(
            {"messages": [user("x")]}, {"thread_id": "t-node", "run_id": "r-node"})
    [raised] = [r for r in debug_logs.records if r.name == "tenxgraph.exceptions" and "bug in node" in r.getMessage()]
    assert (raised.thread_id, raised.run_id, raised.error_code) == ("t-node", "r-node", "NODE_001")


@pytest.mark.asyncio
async def test_python_not_recorded_line_matches_the_rust_one(tmp_path: Path, debug_logs) -> None:
    class Opaque:
        pass

    async def stash() -> ToolResult:
        # A key the state has no field for (ignored when applied) whose value JSON cannot hold:
        # the record cannot be written. (An unstorable value for a field is recorded without the
        # update since session 30: test_tool_state_update_unstorable.py.)
        return ToolResult(message="stashed", state={"scratch": Opaque()})

    app = tool_graph(AgentState, [stash], [[call("c3", "stash", {})]],
                     checkpointer=SqliteCheckpointer(tmp_path / "s.db"))
    await app.ainvoke({"messages": [user("x")]}, {"thread_id": "t-upd", "run_id": "r-upd"})
    [alert] = [r for r in debug_logs.records if getattr(r, "event", None) == NOT_RECORDED_EVENT]
    assert alert.getMessage() == NOT_RECORDED_MESSAGE and alert.levelno == logging.ERROR
    assert (alert.thread_id, alert.run_id, alert.node, alert.tool) == ("t-upd", "r-upd", "tools", "stash")
    assert json.loads(alert.ledger_key)[1] == "c3" and "not JSON-serialisable" in alert.error


def test_run_fields_defaults_let_text_formats_name_the_fields() -> None:
    fmt = logging.Formatter("%(levelname)s [thread=%(thread_id)s run=%(run_id)s tool=%(tool)s] %(message)s")
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    with pytest.raises(ValueError):  # without the filter the format cannot render a plain record
        fmt.format(plain)
    RunFieldsDefaults().filter(plain)
    assert fmt.format(plain) == "INFO [thread=- run=- tool=-] hello"
    about_run = logging.LogRecord("x", logging.INFO, __file__, 1, "hi", None, None)
    about_run.thread_id, about_run.run_id = "t1", "r1"
    RunFieldsDefaults().filter(about_run)
    assert fmt.format(about_run) == "INFO [thread=t1 run=r1 tool=-] hi"


@pytest.mark.asyncio
async def test_fields_do_not_leak_out_of_a_run(tmp_path: Path, debug_logs) -> None:
    app = tool_graph(AgentState, [], [[]], checkpointer=SqliteCheckpointer(tmp_path / "l.db"))
    await app.ainvoke({"messages": [user("x")]}, {"thread_id": "t-leak", "run_id": "r-leak"})
    logging.getLogger("tenxgraph.graph").warning("after the run")
    [after] = [r for r in debug_logs.records if r.getMessage() == "after the run"]
    assert not hasattr(after, "thread_id") and not hasattr(after, "run_id")


class _ShipperDown(logging.Handler):
    """A log handler that raises (a shipper whose emit does not catch), for the Rust core's lines."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.failed = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "step committed":  # a line only the Rust core writes
            self.failed += 1
            raise RuntimeError("log shipper down")


@pytest.mark.asyncio
async def test_a_log_handler_that_raises_on_a_rust_line_does_not_fail_the_run(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """(session 31) The handler's exception was left set in the interpreter: the run's next call
    into Python failed with SystemError and the thread was stored as failed. It is printed, as
    ``logging`` prints a failing handler's, and the run goes on."""
    logger = logging.getLogger("tenxgraph")
    handler = _ShipperDown()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    reset_level_cache()
    try:
        g = StateGraph(AgentState)
        g.add_node("model", lambda s: Message.text_message("ok", role="assistant"))
        g.add_edge(START, "model")
        g.add_edge("model", END)
        cp = SqliteCheckpointer(tmp_path / "cp.db")
        app = g.compile(checkpointer=cp)
        out = await app.ainvoke({"messages": [user("hi")]}, {"thread_id": "shipper"})
        assert out["messages"][-1].text() == "ok"
        state = await cp.aget_state({"thread_id": "shipper"})
        assert str(state.execution_meta.status).endswith("completed")
        assert handler.failed >= 2
        assert "log shipper down" in capsys.readouterr().err
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        reset_level_cache()
