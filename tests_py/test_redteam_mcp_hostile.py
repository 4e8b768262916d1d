"""An MCP server that returns non-text content (an image, audio, text + image + embedded
resource, nothing) and one that dies in the middle of a call (session 7 red-team pass). Each
call ends in a tool result the model can read (its content as JSON-able blocks, or a tool
error), recorded in the ledger like any result; the turn completes; nothing hangs; a dead
server is a tool error, and a resume does not call it again for a call whose error was
recorded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastmcp")

from fastmcp import Client  # noqa: E402

from tenxgraph.core.state.message_block import ToolResultBlock  # noqa: E402
from tenxgraph.core.state import Message  # noqa: E402
from tests_py.mcp_kit.agent import build_graph  # noqa: E402
from tests_py.redteam.mcp_server import McpServer, mcp_server  # noqa: E402

MODULE = "tests_py.redteam.hostile_mcp_server"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServer]:
    with mcp_server(tmp_path_factory.mktemp("hostile"), MODULE) as s:
        yield s


def _results(messages: list[Message]) -> dict[str, ToolResultBlock]:
    return {b.call_id: b for m in messages if m.role == "tool" for b in m.content if isinstance(b, ToolResultBlock)}


@pytest.mark.parametrize("tool", ["picture", "sound", "mixed", "nothing"])
def test_non_text_content_is_a_result_the_model_can_read(checkpointer: Any, hostile: McpServer, make_thread: Any,
                                                         tool: str) -> None:
    app = build_graph(checkpointer, Client(hostile.url), [(tool, {})])
    cfg = {"thread_id": make_thread(), "tool_timeout": 60}
    out = asyncio.run(asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg)), 120))
    result = _results(out["messages"])["call_1"]
    json.dumps(result.output)  # JSON-able: it was stored and goes to the model as is
    assert str(out["messages"][-1].role) == "assistant"
    state = asyncio.run(checkpointer.aget_state(dict(cfg)))
    assert str(state.execution_meta.status).endswith("completed")
    # Recorded in the ledger like any result (a replay would return it without a call).
    before = hostile.counts().get(tool, 0)
    issuing = next(m for m in state.context if m.tools_calls)
    assert asyncio.run(checkpointer.aget_tool_status(dict(cfg), f"{issuing.message_id}:call_1")) == "completed"
    assert hostile.counts().get(tool, 0) == before


def test_a_server_that_dies_mid_call_is_a_tool_error_and_the_turn_completes(checkpointer: Any, tmp_path: Path,
                                                                           make_thread: Any) -> None:
    with mcp_server(tmp_path, MODULE) as dying:
        app = build_graph(checkpointer, Client(dying.url), [("die", {}), ("note", {"text": "after"})])
        cfg = {"thread_id": make_thread(), "tool_timeout": 60}
        out = asyncio.run(asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("go")]}, dict(cfg)), 180))
        assert dying.process.wait(timeout=60) == 3  # it really died in the call
        results = _results(out["messages"])
        assert results["call_1"].is_error, results["call_1"]
        assert results["call_2"].output == "noted after" and not results["call_2"].is_error
        assert dying.counts() == {"die": 1}
        state = asyncio.run(checkpointer.aget_state(dict(cfg)))
        assert str(state.execution_meta.status).endswith("completed")
