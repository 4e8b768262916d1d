"""MCP tools (``ToolNode(tools, client=fastmcp.Client(...))``) through the replay-safe handler.

A real fastmcp server (tests_py/mcp_kit/server.py) runs in a child process on a loopback HTTP port
and counts every call it receives in a file, so "never sent to the server twice" is counted
where it matters: on the server. Tests that are not about processes use fastmcp's in-process
transport.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

fastmcp = pytest.importorskip("fastmcp", reason="the mcp extra (fastmcp) is not installed")
from fastmcp import Client, FastMCP  # noqa: E402

from tenxgraph.core.graph import ToolNode  # noqa: E402
from tenxgraph.core.graph.mcp_tools import McpToolNameClashError  # noqa: E402
from tenxgraph.core.state import Message  # noqa: E402
from tenxgraph.core.state.message_block import ErrorBlock, ToolResultBlock  # noqa: E402
from tenxgraph.storage.checkpointer import InMemoryCheckpointer  # noqa: E402
from tenxgraph.testing import CrashKit  # noqa: E402
from tenxgraph.utils import CallbackManager, InvocationType  # noqa: E402
from tests_py.mcp_kit.agent import PAY, build_graph  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Server:
    url: str
    calls_file: Path

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.calls_file.exists():
            return []
        rows = [json.loads(x) for x in self.calls_file.read_text().splitlines() if x.strip()]
        return [r for r in rows if tool is None or r["tool"] == tool]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def _server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    calls = tmp_path_factory.mktemp("mcp") / "calls.jsonl"
    port = _free_port()
    env = dict(os.environ, MCP_CALLS=str(calls), PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-m", "tests_py.mcp_kit.server", str(port)], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                break
            except OSError:
                if child.poll() is not None:
                    raise AssertionError(f"the MCP server died: {child.stderr.read().decode()[-2000:]}") from None
                assert time.monotonic() < deadline, "the MCP server never listened"
                time.sleep(0.05)
        yield Server(f"http://127.0.0.1:{port}/mcp", calls)
    finally:
        child.kill()
        child.wait(timeout=30)


@pytest.fixture
def server(_server_process: Server) -> Server:
    _server_process.calls_file.write_text("")  # the server appends by name: a new count per test
    return _server_process


def _tool_messages(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.role == "tool"]


def _result(message: Message) -> ToolResultBlock:
    return next(b for b in message.content if isinstance(b, ToolResultBlock))


def _down_url() -> str:
    return f"http://127.0.0.1:{_free_port()}/mcp"  # nothing listens there


# ------------------------------------------------------------------------------------ a turn


def test_tool_calling_turn_through_the_server(checkpointer: Any, server: Server, make_thread: Any) -> None:
    app = build_graph(checkpointer, Client(server.url), PAY)
    out = app.invoke({"messages": [Message.text_message("pay")]}, config={"thread_id": make_thread("mcp")})
    tools = {m.metadata["function_name"]: _result(m) for m in _tool_messages(out["messages"])}
    # 10xGraph's shape of an MCP result: the content blocks as their fields.
    assert tools["charge_card"].output == [{"type": "text", "text": "charged 5", "annotations": None, "meta": None}]
    assert tools["charge_card"].is_error is False and tools["charge_card"].status == "completed"
    assert tools["note"].output == "noted paid"
    assert [c["amount"] for c in server.calls("charge_card")] == [5]


def test_parallel_calls_to_one_server_each_get_their_answer(server: Server) -> None:
    calls = [("charge_card", {"amount": 3}), ("get_weather", {"city": "Oslo"}), ("charge_card", {"amount": 4})]
    app = build_graph(InMemoryCheckpointer(), Client(server.url), calls)
    out = app.invoke({"messages": [Message.text_message("go")]}, config={"thread_id": "parallel"})
    texts = {m.metadata["tool_call_id"]: _result(m).output[0]["text"] for m in _tool_messages(out["messages"])}
    assert texts == {"call_1": "charged 3", "call_2": '{"city":"Oslo","temp_c":21}', "call_3": "charged 4"}
    assert sorted(c["amount"] for c in server.calls("charge_card")) == [3, 4]
    # Each request carries its call's idempotency key in _meta, one per call.
    keys = [c["idempotency_key"] for c in server.calls("charge_card")]
    assert all(isinstance(k, str) and k for k in keys) and len(set(keys)) == 2, keys
    assert [c["city"] for c in server.calls("get_weather")] == ["Oslo"]


def test_a_streamed_run_calls_the_server_once_and_shows_the_result() -> None:
    seen: list[Any] = []
    app = build_graph(InMemoryCheckpointer(), Client(_in_process_server(seen)), [("add", {"a": 4, "b": 5})])

    async def run() -> list[Any]:
        return [c async for c in app.astream({"messages": [Message.text_message("go")]}, {"thread_id": "streamed"})]

    chunks = asyncio.run(run())
    tool_chunks = [c.message for c in chunks if c.message is not None and c.message.role == "tool"]
    assert [_result(m).output[0]["text"] for m in tool_chunks] == ["9"]
    assert seen == [("add", 4, 5)]


def test_server_tools_are_listed_after_the_local_ones(server: Server) -> None:
    node = ToolNode([_note], client=Client(server.url))
    tools = asyncio.run(node.all_tools())
    assert [t["function"]["name"] for t in tools] == ["_note", "charge_card", "get_weather", "hang"]
    weather = tools[2]["function"]
    assert weather["description"] == "The weather in a city."
    assert weather["parameters"]["properties"] == {"city": {"type": "string"}}
    assert weather["parameters"]["required"] == ["city"]
    assert node.mcp_tools == ["charge_card", "get_weather", "hang"]
    # The sync form, also from inside a running loop (10xGraph's asyncio.run fails there).
    assert node.all_tools_sync() == tools

    async def inside_a_loop() -> list[dict[str, Any]]:
        return node.all_tools_sync()

    assert asyncio.run(inside_a_loop()) == tools
    assert server.calls() == []  # listing calls no tool


def _note(text: str) -> str:
    """A local tool."""
    return text


# ------------------------------------------------------------------------------ crash, replay


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else sqlite_db


def test_sigkill_after_the_mcp_call_returned_resume_does_not_call_the_server_again(
        server: Server, db: str, tmp_path: Path) -> None:
    kit = CrashKit(tmp_path / "kit", db=db)
    cb_log = tmp_path / "callbacks.jsonl"
    env = {"MCP_URL": server.url, "MCP_CB_LOG": str(cb_log)}
    crashed = kit.run_until_crash("tests_py.mcp_kit.agent:build", "t-mcp", input="pay",
                                  failpoints="after_record:charge_card=kill", env=env)
    assert crashed.killed
    assert [c["amount"] for c in server.calls("charge_card")] == [5]  # it reached the server once
    before_crash = [json.loads(x) for x in cb_log.read_text().splitlines()]
    assert {"what": "before_mcp", "fn": "charge_card"} in [{k: r[k] for k in ("what", "fn")} for r in before_crash]

    resumed = kit.resume("tests_py.mcp_kit.agent:build", "t-mcp", env=env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert [c["amount"] for c in server.calls("charge_card")] == [5]  # answered from the ledger
    results = json.loads(resumed.last)
    assert [{"type": "text", "text": "charged 5", "annotations": None, "meta": None}] in results
    assert "noted paid" in results
    after = [json.loads(x) for x in cb_log.read_text().splitlines()][len(before_crash):]
    # A call answered from the ledger fires no callback.
    assert not [r for r in after if r["fn"] == "charge_card"], after


@pytest.mark.parametrize("factory, sent_again", [("build", True), ("build_at_most_once", False)])
def test_sigkill_before_the_mcp_result_was_recorded_follows_the_configured_class(
        server: Server, sqlite_db: str, tmp_path: Path, factory: str, sent_again: bool) -> None:
    """Killed after the server answered but before the ledger row committed (the intent window):
    an idempotent MCP tool (the default) is sent again on resume; one configured at_most_once is
    not, and the model reads that its outcome is unknown."""
    kit = CrashKit(tmp_path / "kit", db=sqlite_db)
    env = {"MCP_URL": server.url}
    crashed = kit.run_until_crash(f"tests_py.mcp_kit.agent:{factory}", "t-window", input="pay",
                                  failpoints="after_tool:charge_card=kill", env=env)
    assert crashed.killed
    assert len(server.calls("charge_card")) == 1
    resumed = kit.resume(f"tests_py.mcp_kit.agent:{factory}", "t-window", env=env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert len(server.calls("charge_card")) == (2 if sent_again else 1)
    results = json.dumps(json.loads(resumed.last))
    if sent_again:
        assert "charged 5" in results
    else:
        assert "charged 5" not in results and "never recorded" in results, results


def test_mcp_side_effects_rejects_an_unknown_class() -> None:
    with pytest.raises(ValueError, match="mcp_side_effects"):
        ToolNode([], mcp_side_effects="sometimes")
    with pytest.raises(ValueError, match="mcp_side_effects"):
        ToolNode([], mcp_side_effects={"charge_card": "twice"})


# ------------------------------------------------------------------------- hung, down, errors


def test_a_hung_server_is_bounded_by_tool_timeout(server: Server) -> None:
    app = build_graph(InMemoryCheckpointer(), Client(server.url), [("hang", {}), ("note", {"text": "x"})])
    out = app.invoke({"messages": [Message.text_message("go")]}, config={"thread_id": "hung", "tool_timeout": 2})
    by_name = {m.metadata.get("function_name"): m for m in _tool_messages(out["messages"])}
    hung = _result(by_name["hang"])
    assert hung.is_error and "NODE_TIMEOUT_002" in hung.output and "timeout of 2s" in hung.output
    assert _result(by_name["note"]).output == "noted x"  # the other call was not held up
    assert len(server.calls("hang")) == 1  # the server did get it, and never answered
    assert out["messages"][-1].role == "assistant"  # the model got its turn after the timeout


def test_the_client_still_works_after_a_call_was_cancelled(server: Server) -> None:
    node = ToolNode([], client=Client(server.url))

    async def scenario() -> Message:
        hung = asyncio.ensure_future(node.invoke("hang", {}, "c1", {}, None))
        deadline = time.monotonic() + 60
        while not server.calls("hang"):  # cancel once the server holds the request
            assert time.monotonic() < deadline, "the hang call never reached the server"
            await asyncio.sleep(0.02)
        hung.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hung
        return await node.invoke("charge_card", {"amount": 9}, "c2", {}, None)

    after = asyncio.run(scenario())
    assert _result(after).output[0]["text"] == "charged 9"
    assert [c["amount"] for c in server.calls("charge_card")] == [9]


def test_a_server_that_is_down_gives_a_tool_error_the_model_reads() -> None:
    node = ToolNode([_note], client=Client(_down_url()))
    # Listing: the model sees the local tools only, and the turn is not failed.
    assert [t["function"]["name"] for t in asyncio.run(node.all_tools())] == ["_note"]
    app = build_graph(InMemoryCheckpointer(), Client(_down_url()), PAY)
    out = app.invoke({"messages": [Message.text_message("pay")]}, config={"thread_id": "down"})
    by_name = {m.metadata.get("function_name"): m for m in _tool_messages(out["messages"])}
    charge = by_name["charge_card"]
    block = _result(charge)
    assert block.is_error and block.status == "failed"
    assert block.output.startswith("MCP execution error: "), block.output
    assert any(isinstance(b, ErrorBlock) for b in charge.content)
    assert _result(by_name["note"]).output == "noted paid"
    assert out["messages"][-1].role == "assistant"


def _in_process_server(seen: list[Any]) -> FastMCP:
    mcp = FastMCP("in-process")

    @mcp.tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        seen.append(("add", a, b))
        return a + b

    @mcp.tool
    def boom(x: int) -> str:
        """Always fails."""
        seen.append(("boom", x))
        raise ValueError("kaput")

    @mcp.tool(tags={"math"})
    def mul(a: int, b: int) -> int:
        """Multiply two numbers."""
        return a * b

    @mcp.tool
    def whoami(user: dict) -> str:
        """Who is calling."""
        return json.dumps(user, sort_keys=True)

    return mcp


def test_a_server_that_never_answers_the_listing_is_bounded_by_tool_timeout() -> None:
    from fastmcp.server.middleware import Middleware

    class NeverList(Middleware):
        async def on_list_tools(self, context: Any, call_next: Any) -> Any:
            await asyncio.Event().wait()

    seen: list[Any] = []
    mcp = _in_process_server(seen)
    mcp.add_middleware(NeverList())
    node = ToolNode([_note], client=Client(mcp))
    # The model turn goes on with the local tools, as for a server that is down.
    tools = asyncio.run(node.all_tools(config={"tool_timeout": 1}))
    assert [t["function"]["name"] for t in tools] == ["_note"]
    # In a graph, a call to such a server ends at tool_timeout: fastmcp's call_tool lists the
    # tools too (for their output schemas), before or after the server ran the tool.
    app = build_graph(InMemoryCheckpointer(), Client(mcp), [("add", {"a": 1, "b": 1})])
    out = app.invoke({"messages": [Message.text_message("go")]}, config={"thread_id": "no-list", "tool_timeout": 1})
    block = _result(_tool_messages(out["messages"])[0])
    assert block.is_error and "NODE_TIMEOUT_002" in block.output
    assert out["messages"][-1].role == "assistant"


def test_a_failing_tool_and_bad_arguments_are_tool_errors() -> None:
    seen: list[Any] = []
    node = ToolNode([], client=Client(_in_process_server(seen)))
    asyncio.run(node.all_tools())
    failed = asyncio.run(node.invoke("boom", {"x": 1}, "c1", {}, None))
    assert _result(failed).is_error and "kaput" in _result(failed).output
    bad = asyncio.run(node.invoke("add", {"a": "zz"}, "c2", {}, None))
    assert _result(bad).is_error and _result(bad).output.startswith("MCP execution error: ")
    unknown = asyncio.run(node.invoke("nope", {}, "c3", {}, None))
    assert _result(unknown).is_error and _result(unknown).output == "Tool 'nope' not found."
    assert seen == [("boom", 1)]


def test_a_fresh_tool_node_lists_the_server_before_its_first_call() -> None:
    # A resume in a new process goes straight to the tool node: no model turn listed the tools.
    seen: list[Any] = []
    node = ToolNode([], client=Client(_in_process_server(seen)))
    out = asyncio.run(node.invoke("add", {"a": 2, "b": 3}, "c1", {}, None))
    assert _result(out).output == [{"type": "text", "text": "5", "annotations": None, "meta": None}]
    assert seen == [("add", 2, 3)]


def test_a_server_tool_named_like_a_local_tool_is_a_clear_error() -> None:
    def add(a: int, b: int) -> int:
        """A local add."""
        return a - b

    node = ToolNode([add], client=Client(_in_process_server([])))
    with pytest.raises(McpToolNameClashError) as err:
        asyncio.run(node.all_tools())
    assert err.value.error_code == "MCP_001" and err.value.context == {"tools": ["add"]}


def test_tags_select_the_server_tools_with_one_of_them() -> None:
    node = ToolNode([_note], client=Client(_in_process_server([])))
    tagged = asyncio.run(node.all_tools(tags={"math"}))
    # As 10xGraph: an untagged local tool stays, an untagged server tool does not.
    assert [t["function"]["name"] for t in tagged] == ["_note", "mul"]
    assert node.mcp_tools == ["add", "boom", "mul", "whoami"]  # every listed name can be called


def test_pass_user_info_to_mcp_sends_the_user_argument() -> None:
    node = ToolNode([], client=Client(_in_process_server([])), pass_user_info_to_mcp=True)
    by_id = asyncio.run(node.invoke("whoami", {}, "c1", {"user_id": "u-7"}, None))
    assert _result(by_id).output[0]["text"] == '{"user_id": "u-7"}'
    by_dict = asyncio.run(node.invoke("whoami", {}, "c2", {"user_id": "u-7", "user": {"name": "Ada"}}, None))
    assert _result(by_dict).output[0]["text"] == '{"name": "Ada"}'


def test_without_fastmcp_a_client_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import tenxgraph.core.graph.tool_node as tool_node

    monkeypatch.setattr(tool_node, "HAS_FASTMCP", False)
    with pytest.raises(ImportError, match=r"pip install 10xgraph\[mcp\]"):
        ToolNode([], client=object())
    ToolNode([_note])  # no client, no extra needed


# --------------------------------------------------------------------------------- callbacks


def test_mcp_callbacks_wrap_each_call_in_order() -> None:
    seen: list[Any] = []
    log: list[tuple[Any, ...]] = []
    mgr = CallbackManager()

    def before(ctx: Any, data: dict[str, Any]) -> dict[str, Any]:
        log.append(("before", ctx.invocation_type, ctx.function_name, dict(data)))
        return {**data, "b": 10} if ctx.function_name == "add" else data

    def after(ctx: Any, data: Any, out: Any) -> Any:
        log.append(("after", ctx.invocation_type, ctx.function_name, type(out).__name__))
        return out

    def on_error(ctx: Any, data: Any, exc: Exception) -> Any:
        log.append(("error", ctx.invocation_type, ctx.function_name, type(exc).__name__))
        return Message.tool_message([ToolResultBlock(call_id="c2", output="recovered", status="completed")])

    for kind in (InvocationType.MCP, InvocationType.TOOL):
        mgr.register_before_invoke(kind, before)
        mgr.register_after_invoke(kind, after)
        mgr.register_on_error(kind, on_error)

    node = ToolNode([_note], client=Client(_in_process_server(seen)))
    asyncio.run(node.all_tools())
    added = asyncio.run(node.invoke("add", {"a": 1, "b": 2}, "c1", {}, None, callback_manager=mgr))
    failed = asyncio.run(node.invoke("boom", {"x": 3}, "c2", {}, None, callback_manager=mgr))
    asyncio.run(node.invoke("_note", {"text": "t"}, "c3", {}, None, callback_manager=mgr))
    assert _result(added).output[0]["text"] == "11"  # before_invoke changed what the server got
    assert seen == [("add", 1, 10), ("boom", 3)]
    assert _result(failed).output == "recovered"  # on_error's Message is the result
    assert [(w, str(k), f) for w, k, f, *_ in log] == [
        ("before", "mcp", "add"), ("after", "mcp", "add"),
        ("before", "mcp", "boom"), ("error", "mcp", "boom"),
        ("before", "tool", "_note"), ("after", "tool", "_note"),
    ]
    assert log[0][3] == {"a": 1, "b": 2} and log[1][3] == "Message"


# ------------------------------------------------------------------------------- ReactAgent


def test_react_agent_with_an_mcp_client(monkeypatch: pytest.MonkeyPatch) -> None:
    from tenxgraph.prebuilt.agent import ReactAgent
    from tenxgraph.testing.providers import OpenAIStandIn

    seen: list[Any] = []
    with OpenAIStandIn() as llm:
        for k, v in llm.env.items():
            monkeypatch.setenv(k, v)
        llm.reply_tool_calls(("add", {"a": 20, "b": 1}))
        llm.reply_text("It is 21.")
        app = ReactAgent(model="openai/gpt-4o-mini", system_prompt=[{"role": "system", "content": "Add."}],
                         tools=[_note], client=Client(_in_process_server(seen))).compile(
            checkpointer=InMemoryCheckpointer())
        out = app.invoke({"messages": [Message.text_message("20+1?")]}, config={"thread_id": "react-mcp"})
        assert out["messages"][-1].text() == "It is 21."
        first = llm.requests[0].body
        assert [t["function"]["name"] for t in first["tools"]] == ["_note", "add", "boom", "mul", "whoami"]
        tool_turn = [m for m in llm.requests[1].messages if m["role"] == "tool"]
        assert len(tool_turn) == 1 and "21" in tool_turn[0]["content"]
    assert seen == [("add", 20, 1)]


# ------------------------------------------------------------------------------ differential

DIFF_SCRIPT = """
import asyncio, json
from fastmcp import FastMCP, Client
from tenxgraph.core.graph import ToolNode
from tenxgraph.utils import CallbackManager, InvocationType

mcp = FastMCP("diff")

@mcp.tool
def add(a: int, b: int) -> int:
    '''Add two numbers.'''
    return a + b

@mcp.tool
def weather(city: str) -> dict:
    '''The weather.'''
    return {"city": city, "temp": 21}

@mcp.tool
def boom(x: int) -> str:
    '''Fails.'''
    raise ValueError("kaput")

@mcp.tool
def whoami(user: dict) -> str:
    '''Who.'''
    return json.dumps(user, sort_keys=True)

def local(q: str) -> str:
    '''A local tool.'''
    return q

log = []
mgr = CallbackManager()
mgr.register_before_invoke(InvocationType.MCP, lambda c, d: (log.append(["before", c.function_name, sorted(d)]), d)[1])
mgr.register_after_invoke(InvocationType.MCP, lambda c, i, o: (log.append(["after", c.function_name]), o)[1])
mgr.register_on_error(InvocationType.MCP, lambda c, i, e: log.append(["error", c.function_name]))

async def main():
    node = ToolNode([local], client=Client(mcp), pass_user_info_to_mcp=True)
    tools = await node.all_tools()
    out = []
    for name, args in [("add", {"a": 2, "b": 3}), ("weather", {"city": "Oslo"}), ("boom", {"x": 1}), ("whoami", {})]:
        msg = await node.invoke(name, args, "c-" + name, {"thread_id": "t", "user_id": "u1"}, None, callback_manager=mgr)
        out.append({"role": msg.role, "metadata": msg.metadata,
                    "content": [{k: v for k, v in b.model_dump(mode="json").items()} for b in msg.content]})
    emit({"names": [t["function"]["name"] for t in tools],
          "descriptions": [t["function"]["description"] for t in tools],
          "properties": [t["function"]["parameters"].get("properties") for t in tools],
          "mcp_tools": sorted(set(node.mcp_tools)), "results": out, "log": log})

asyncio.run(main())
"""


def test_differential_listing_results_errors_and_callbacks(oracle: Any) -> None:
    theirs, ours = oracle.run_both(DIFF_SCRIPT)
    for key in ("names", "descriptions", "properties", "mcp_tools", "log"):
        assert ours[key] == theirs[key], (key, theirs[key], ours[key])
    assert ours["results"] == theirs["results"], json.dumps({"theirs": theirs["results"], "ours": ours["results"]})


GRAPH_SCRIPT = """
import json
from fastmcp import FastMCP, Client
from tenxgraph.core.graph import StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils import END

mcp = FastMCP("diff")

@mcp.tool
def add(a: int, b: int) -> int:
    '''Add two numbers.'''
    return a + b

def add_local(a: int, b: int) -> int:
    '''A local tool with the server tool's name.'''
    return a - b
add_local.__name__ = "add"

def model(state):
    if state.context[-1].role == "tool":
        return Message.text_message("done", role="assistant")
    return Message(role="assistant", content=[], tools_calls=[
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}])

g = StateGraph(AgentState)
g.add_node("model", model)
g.add_node("tools", ToolNode([], client=Client(mcp)))
g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END, {"tools": "tools", END: END})
g.add_edge("tools", "model")
g.set_entry_point("model")
out = g.compile(checkpointer=InMemoryCheckpointer()).invoke({"messages": [Message.text_message("go")]},
                                                            config={"thread_id": "t"})
tool = [m for m in out["messages"] if m.role == "tool"][0]
result = [b for b in tool.content if b.type == "tool_result"][0]
clash = ToolNode([add_local], client=Client(mcp))
import asyncio
try:
    names = [t["function"]["name"] for t in asyncio.run(clash.all_tools())]
except Exception as exc:
    names = type(exc).__name__
emit({"output": result.output, "is_error": result.is_error, "clash": names})
"""


def test_differential_pinned_differences_a_first_call_and_a_name_clash(oracle: Any) -> None:
    theirs, ours = oracle.run_both(GRAPH_SCRIPT)
    # A tool node whose server no model turn listed in this process (a resume in a fresh one):
    # 10xGraph answers "not found"; we list the server and make the call.
    assert (theirs["output"], theirs["is_error"]) == ("Tool 'add' not found.", True)
    assert (ours["output"], ours["is_error"]) == (
        [{"type": "text", "text": "5", "annotations": None, "meta": None}], False)
    # A server tool named like a local one: 10xGraph lists both; we refuse it (MCP_001).
    assert theirs["clash"] == ["add", "add"]
    assert ours["clash"] == "McpToolNameClashError"
