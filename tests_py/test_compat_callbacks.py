"""Callbacks and validators (issue 14 item 2): 10xGraph 0.10's CallbackManager on the Rust loop.

Differential tests run the same agent on 10xGraph 0.10.0 and on tenxgraph and compare the
callback order, what callbacks changed, and the messages. The crash test pins our rule for a
call answered from the ledger: nothing is invoked, so no before/after-invoke callback fires.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tenxgraph.core.state import AgentState, Message
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

AGENT = """
from tenxgraph.core.graph import StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END, CallbackManager, InvocationType
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

log = []

def get_weather(city: str) -> str:
    log.append(f"tool_ran:{city}")
    if city == "Atlantis":
        raise RuntimeError("no such city")
    return f"sunny in {city}"

def model(state: AgentState):
    last = state.context[-1]
    if last.role == "tool":
        return Message.text_message("done", role="assistant")
    city = last.text().split()[-1]
    return Message(role="assistant", content=[], tools_calls=[{"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": '{"city": "%s"}' % city}}])

def route(state):
    return "tools" if state.context[-1].tools_calls else END

CHECKPOINTERS = []

def build(mgr):
    CHECKPOINTERS.append(InMemoryCheckpointer())
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([get_weather]))
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    g.set_entry_point("model")
    return g.compile(checkpointer=CHECKPOINTERS[-1], callback_manager=mgr)

def tool_texts(messages):
    out = []
    for m in messages:
        if m.role == "tool":
            out.append([getattr(b, "output", None) for b in m.content if type(b).__name__ == "ToolResultBlock"])
    return out
"""

ORDER = AGENT + """
mgr = CallbackManager()
mgr.register_before_invoke(InvocationType.AI, lambda c, d: (log.append(f"before_ai:{c.node_name}:{c.function_name}:{sorted(d)}"), d)[1])
mgr.register_after_invoke(InvocationType.AI, lambda c, i, o: (log.append(f"after_ai:{c.node_name}"), o)[1])
async def before_tool(c, d):
    log.append(f"before_tool:{c.node_name}:{c.function_name}:{sorted(d)}:{c.metadata['tool_call_id']}:{c.metadata['args']}")
    return d
mgr.register_before_invoke(InvocationType.TOOL, before_tool)
mgr.register_after_invoke(InvocationType.TOOL, lambda c, i, o: (log.append(f"after_tool:{c.function_name}:{o}"), o)[1])
app = build(mgr)
import os
if os.environ.get("MODE") == "stream":
    for _chunk in app.stream({"messages": [Message.text_message("weather in Paris", role="user")]}, {"thread_id": "t1"}):
        pass
    res = {"messages": CHECKPOINTERS[-1].get_state({"thread_id": "t1"}).context}
else:
    res = app.invoke({"messages": [Message.text_message("weather in Paris", role="user")]}, {"thread_id": "t1"})
emit({"log": log, "roles": [m.role for m in res["messages"]], "tools": tool_texts(res["messages"]),
      "counts": mgr.get_callback_counts()})
"""


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_callback_order_and_contexts_match_10xgraph(oracle, mode: str) -> None:
    theirs, ours = oracle.run_both(ORDER, env={"MODE": mode})
    # 10xGraph runs START as a node of its own, so its AI callbacks fire for "__start__" too;
    # tenxgraph's loop has no such node (documented in docs/migrating-from-10xgraph.md).
    start_entries = [e for e in theirs["log"] if ":__start__" in e]
    assert start_entries == ["before_ai:__start__:<lambda>:['config', 'state']", "after_ai:__start__"]
    assert ours["log"] == [e for e in theirs["log"] if e not in start_entries]
    assert ours["log"] == [
        "before_ai:model:model:['state']", "after_ai:model",
        "before_tool:ToolNode:get_weather:['city']:call_1:{'city': 'Paris'}", "tool_ran:Paris",
        "after_tool:get_weather:sunny in Paris",
        "before_ai:model:model:['state']", "after_ai:model",
    ]
    assert ours["roles"] == theirs["roles"] and ours["tools"] == theirs["tools"]
    assert ours["counts"] == theirs["counts"]


CHANGE = AGENT + """
mgr = CallbackManager()
def to_rome(c, d):
    return {**d, "city": "Rome"}
mgr.register_before_invoke(InvocationType.TOOL, to_rome)
mgr.register_after_invoke(InvocationType.TOOL, lambda c, i, o: f"{o} (input {i['city']})".upper())
app = build(mgr)
res = app.invoke({"messages": [Message.text_message("weather in Paris", role="user")]}, {"thread_id": "t1"})
emit({"log": log, "tools": tool_texts(res["messages"])})
"""


def test_before_invoke_changes_tool_arguments_and_after_invoke_the_result(oracle) -> None:
    theirs, ours = oracle.run_both(CHANGE)
    assert ours == theirs
    assert ours["log"] == ["tool_ran:Rome"]
    assert ours["tools"] == [["SUNNY IN ROME (INPUT ROME)"]]


# One scenario per process: 10xGraph keeps the first CallbackManager a process compiles with
# (see test_each_graph_keeps_its_own_callback_manager), so each graph needs a fresh process there.
ERRORS = AGENT + """
import os
from tenxgraph.core.state.message_block import ToolResultBlock
scenario = os.environ["SCENARIO"]
mgr = CallbackManager()
seen = []
if scenario == "recovered":
    # A failing tool with an on_error callback that answers with a Message: the tool's result.
    def recover(c, i, e):
        seen.append([c.invocation_type.value, c.function_name, type(e).__name__, str(e), sorted(i)])
        return Message.tool_message([ToolResultBlock(call_id=c.metadata["tool_call_id"], output="recovered",
                                                     status="completed")])
    mgr.register_on_error(InvocationType.TOOL, recover)
    res = build(mgr).invoke({"messages": [Message.text_message("weather in Atlantis", role="user")]}, {"thread_id": "t1"})
    emit([seen, tool_texts(res["messages"]), [m.role for m in res["messages"]]])
elif scenario == "unrecovered":
    # The same failure with an on_error callback that returns None: the usual tool error message.
    mgr.register_on_error(InvocationType.TOOL, lambda c, i, e: seen.append(str(e)))
    res = build(mgr).invoke({"messages": [Message.text_message("weather in Atlantis", role="user")]}, {"thread_id": "t2"})
    emit([seen, tool_texts(res["messages"])])
elif scenario == "ai_recovered":
    # A node (an AI invocation) that raises, answered by on_error: the run goes on with that message.
    from tenxgraph.core.graph import StateGraph
    def broken(state):
        raise ValueError("model down")
    g = StateGraph(AgentState)
    g.add_node("model", broken)
    g.add_edge("model", END)
    g.set_entry_point("model")
    mgr.register_on_error(InvocationType.AI, lambda c, i, e: Message.text_message(f"sorry: {e}", role="assistant"))
    res = g.compile(checkpointer=InMemoryCheckpointer(), callback_manager=mgr).invoke(
        {"messages": [Message.text_message("hi", role="user")]}, {"thread_id": "t3"})
    emit([[m.role, m.text()] for m in res["messages"]])
else:
    # A before_invoke callback that raises: on_error sees it, and the tool reports the error.
    def refuse(c, d):
        raise PermissionError("not allowed")
    mgr.register_before_invoke(InvocationType.TOOL, refuse)
    mgr.register_on_error(InvocationType.TOOL, lambda c, i, e: seen.append(type(e).__name__))
    res = build(mgr).invoke({"messages": [Message.text_message("weather in Paris", role="user")]}, {"thread_id": "t4"})
    emit([seen, tool_texts(res["messages"]), log])
"""


def test_on_error_callbacks_recover_or_not_as_in_10xgraph(oracle) -> None:
    out = {}
    for scenario in ("recovered", "unrecovered", "ai_recovered", "before_raises"):
        theirs, ours = oracle.run_both(ERRORS, env={"SCENARIO": scenario})
        assert ours == theirs, scenario
        out[scenario] = ours
    assert out["recovered"][1] == [["recovered"]]
    assert out["recovered"][0] == [["tool", "get_weather", "RuntimeError", "no such city", ["city"]]]
    assert out["unrecovered"] == [["no such city"], [["Internal execution error: no such city"]]]
    assert out["ai_recovered"] == [["user", "hi"], ["assistant", "sorry: model down"]]
    # 10xGraph calls on_error twice for a raising before_invoke (once inside
    # execute_before_invoke, once around the call); tenxgraph keeps that, and the tool never runs.
    assert out["before_raises"][0] == ["PermissionError", "PermissionError"]
    assert out["before_raises"][1] == [["Internal execution error: not allowed"]]
    assert "tool_ran:Paris" not in out["before_raises"][2]


TWO_GRAPHS = """
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END, CallbackManager, InvocationType
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
log = []
def build(tag):
    g = StateGraph(AgentState)
    g.add_node("model", lambda state: Message.text_message("x", role="assistant"))
    g.add_edge("model", END)
    g.set_entry_point("model")
    mgr = CallbackManager()
    mgr.register_before_invoke(InvocationType.AI, lambda c, d: (log.append(f"{tag}:{c.node_name}"), d)[1])
    return g.compile(checkpointer=InMemoryCheckpointer(), callback_manager=mgr)
a, b = build("A"), build("B")
a.invoke({"messages": [Message.text_message("hi", role="user")]}, {"thread_id": "1"})
b.invoke({"messages": [Message.text_message("hi", role="user")]}, {"thread_id": "2"})
emit(log)
"""


def test_each_graph_keeps_its_own_callback_manager(oracle) -> None:
    """A difference on purpose: 10xGraph binds the manager in a process-wide container, and the
    first graph compiled wins, so graph B ran graph A's callbacks. Each graph here has its own."""
    theirs, ours = oracle.run_both(TWO_GRAPHS)
    assert theirs == ["A:__start__", "A:model", "A:__start__", "A:model"]
    assert ours == ["A:model", "B:model"]


VALIDATORS = """
import asyncio
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END, CallbackManager, BaseValidator
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

seen = []
class NoSecrets(BaseValidator):
    async def validate(self, messages):
        seen.append([m.text() for m in messages])
        for m in messages:
            if "password" in m.text():
                raise ValueError("secrets are not allowed")
        return True

ran = []
def echo(state):
    ran.append(state.context[-1].text())
    return Message.text_message("ok", role="assistant")

mgr = CallbackManager()
mgr.register_input_validator(NoSecrets())
g = StateGraph(AgentState)
g.add_node("echo", echo)
g.add_edge("echo", END)
g.set_entry_point("echo")
cp = InMemoryCheckpointer()
app = g.compile(checkpointer=cp, callback_manager=mgr)
out = {}
res = app.invoke({"messages": [Message.text_message("hello", role="user")]}, {"thread_id": "ok"})
out["ok"] = [m.text() for m in res["messages"]]
try:
    app.invoke({"messages": [Message.text_message("my password is x", role="user")]}, {"thread_id": "bad"})
    out["bad"] = "accepted"
except Exception as e:
    out["bad"] = [type(e).__name__, str(e)]
out["bad_state"] = cp.get_state({"thread_id": "bad", "user_id": "test-user"}) is None
# A thread with history: the refused message is not added to it.
try:
    app.invoke({"messages": [Message.text_message("password again", role="user")]}, {"thread_id": "ok"})
except Exception as e:
    out["bad_followup"] = type(e).__name__
state = cp.get_state({"thread_id": "ok"})
out["ok_context"] = [m.text() for m in state.context]
out["seen"] = seen
out["ran"] = ran
emit(out)
"""


def test_input_validators_refuse_before_anything_is_merged_or_run(oracle) -> None:
    theirs, ours = oracle.run_both(VALIDATORS)
    assert ours == theirs
    assert ours["bad"] == ["ValueError", "secrets are not allowed"]
    assert ours["ok_context"] == ["hello", "ok"] and ours["ran"] == ["hello"]


def test_compile_refuses_a_callback_manager_of_the_wrong_type() -> None:
    from tenxgraph.core.graph import StateGraph

    g = StateGraph(AgentState)
    g.add_node("n", lambda s: Message.text_message("x", role="assistant"))
    g.set_entry_point("n")
    with pytest.raises(TypeError, match="callback_manager must be a tenxgraph.utils.CallbackManager"):
        g.compile(checkpointer=InMemoryCheckpointer(), callback_manager={"before": []})


def test_callbacks_registered_for_one_type_do_not_fire_for_another() -> None:
    import asyncio

    from tenxgraph.utils import CallbackContext, CallbackManager, InvocationType

    mgr = CallbackManager()
    mgr.register_before_invoke(InvocationType.MCP, lambda c, d: d + 1)
    ctx = CallbackContext(InvocationType.TOOL, "ToolNode", "f")
    assert asyncio.run(mgr.execute_before_invoke(ctx, 1)) == 1
    ctx = CallbackContext(InvocationType.MCP, "ToolNode", "f")
    assert asyncio.run(mgr.execute_before_invoke(ctx, 1)) == 2
    mgr.clear_callbacks(InvocationType.MCP)
    assert asyncio.run(mgr.execute_before_invoke(ctx, 1)) == 1


MANAGER_UNITS = """
import asyncio
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils.callbacks import CallbackManager, GraphLifecycleContext, GraphLifecycleHook, CallbackContext, InvocationType, BaseValidator
async def main():
    out = {}
    mgr = CallbackManager(); ctx = GraphLifecycleContext(config={}); st = AgentState()
    out["start_same"] = (await mgr.fire_on_graph_start(ctx, st)) is st
    e = ValueError("x")
    rs, rm = await mgr.fire_on_graph_error(ctx, e, st, [], 0, "n")
    out["err"] = [rs is st, rm]
    msgs = [Message.text_message("hello")]
    a, b = await mgr.fire_on_checkpoint(ctx, st, msgs, False)
    out["ck"] = [a is st, b is msgs]
    class H1(GraphLifecycleHook):
        async def on_graph_start(self, c, s):
            s.context_summary = "h1"; return s
    class H2(GraphLifecycleHook):
        async def on_graph_start(self, c, s):
            s.context_summary += "+h2"; return s
        async def on_checkpoint(self, c, s, m, t):
            return s, []
    mgr.register_lifecycle_hook(H1()); mgr.register_lifecycle_hook(H2())
    out["chain"] = (await mgr.fire_on_graph_start(ctx, AgentState())).context_summary
    out["ck2"] = (await mgr.fire_on_checkpoint(ctx, st, msgs, True))[1]
    out["ctx"] = [GraphLifecycleContext(config={}).thread_id, GraphLifecycleContext(config={"run_id": "r"}).run_id]
    out["counts"] = mgr.get_callback_counts()
    m2 = CallbackManager()
    m2.register_on_error(InvocationType.AI, lambda c, i, e: 42)
    m2.register_on_error(InvocationType.AI, lambda c, i, e: None)
    out["onerr"] = await m2.execute_on_error(CallbackContext(InvocationType.AI, "n"), {}, ValueError())
    m3 = CallbackManager()
    m3.register_on_error(InvocationType.AI, lambda c, i, e: Message.text_message("r"))
    m3.register_on_error(InvocationType.AI, lambda c, i, e: 42)
    out["onerr2"] = (await m3.execute_on_error(CallbackContext(InvocationType.AI, "n"), {}, ValueError())).text()
    try:
        BaseValidator()
        out["abstract"] = False
    except TypeError:
        out["abstract"] = True
    out["enum"] = [t.value for t in InvocationType]
    out["validators_empty"] = await CallbackManager().execute_validators([])
    emit(out)
asyncio.run(main())
"""


def test_the_managers_fire_and_execute_methods_answer_as_10xgraphs(oracle) -> None:
    theirs, ours = oracle.run_both(MANAGER_UNITS)
    assert ours == theirs
    assert ours["chain"] == "h1+h2" and ours["err"] == [True, "x"]
    assert ours["onerr"] is None and ours["onerr2"] == "r"  # a non-Message answer is ignored


CONVERT = """
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import (TextBlock, ImageBlock, AudioBlock, VideoBlock, DocumentBlock, MediaRef,
    ToolResultBlock, RemoteToolCallBlock)
from tenxgraph.utils import convert_messages
class S(AgentState):
    name: str = "Ada"
st = S()
st.context_summary = "earlier: hello"
st.context = [
    Message.text_message("hi", role="user"),
    Message(role="assistant", content=[TextBlock(text="calling")], tools_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
    Message.tool_message([ToolResultBlock(call_id="c1", output={"a": 1})]),
    Message(role="user", content=[TextBlock(text="look"), ImageBlock(media=MediaRef(kind="data", data_base64="AAA", mime_type="image/jpeg")),
        AudioBlock(media=MediaRef(kind="data", data_base64="BBB", mime_type="audio/mp3")), AudioBlock(media=MediaRef(kind="url", url="http://a")),
        VideoBlock(media=MediaRef(kind="url", url="http://v")), DocumentBlock(media=MediaRef(kind="url", url="http://d")),
        DocumentBlock(media=MediaRef(kind="file_id", file_id="f1")), DocumentBlock(media=MediaRef(kind="url", url="x"), excerpt="ex"),
        ImageBlock(media=MediaRef(kind="url", url="http://i"))]),
    Message(role="tool", content=[RemoteToolCallBlock(id="r1", name="client")]),
    Message.text_message("ok", role="assistant"),
]
out = {
 "full": convert_messages([{"role": "system", "content": "You help {name}."}, {"role": "system", "content": "Bad {missing}"}, {"role": "system", "content": [{"type": "text", "text": "x"}]}], st, [Message.text_message("extra", role="user")]),
 "no_state": convert_messages([{"role": "system", "content": "P {x}"}]),
}
try:
    convert_messages(None)
except ValueError as e:
    out["none"] = str(e)
emit(out)
"""


def test_convert_messages_matches_10xgraph(oracle) -> None:
    theirs, ours = oracle.run_both(CONVERT)
    assert ours == theirs
    assert ours["full"][0] == {"role": "system", "content": "You help Ada."}
    assert ours["full"][1] == {"role": "system", "content": "Bad {missing}"}  # left as written
    assert {"role": "tool", "content": '{"a": 1}', "tool_call_id": "c1"} in ours["full"]
    assert not any(m.get("content") == "" and m["role"] == "tool" for m in ours["full"])  # the remote call
    assert ours["none"] == "System prompts cannot be None"


# -- a call answered from the ledger fires no invoke callback ---------------------------------

CALLBACK_AGENT = Path(__file__).resolve().parent / "crash_agents" / "callback_agent.py"


def _log_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_call_replayed_from_the_ledger_after_sigkill_fires_no_tool_callbacks(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    db, log = tmp_path / "cb.db", tmp_path / "cb.jsonl"
    dsn = request.getfixturevalue("tenx_postgres").dsn if backend == "postgres" else ""
    schema = f"cb_{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if k != "TENXGRAPH_FAILPOINTS"}
    args = [str(db), str(log), dsn, schema]
    first = subprocess.run([sys.executable, str(CALLBACK_AGENT), "run", *args], env=env,
                           capture_output=True, timeout=120)
    # Killed after charge_card's ledger row committed, before the tool node's step did.
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()
    killed_pid = {e["pid"] for e in _log_lines(log)}
    assert len(killed_pid) == 1
    before = [e["what"] for e in _log_lines(log)]
    assert before == ["before_ai", "after_ai", "before_tool", "tool_ran", "after_tool"]

    second = subprocess.run([sys.executable, str(CALLBACK_AGENT), "resume", *args], env=env,
                            capture_output=True, timeout=120)
    assert second.returncode == 0, second.stderr.decode()
    resumed = [e for e in _log_lines(log) if e["pid"] not in killed_pid]
    # The tool node replays charge_card from the ledger: the tool does not run, so neither
    # before_invoke nor after_invoke fires for it; the model node after it runs with callbacks.
    assert [e["what"] for e in resumed] == ["before_ai", "after_ai", "done"]
    assert resumed[-1]["texts"][-1] == "paid"
    assert [e["what"] for e in _log_lines(log)].count("tool_ran") == 1


@pytest.mark.asyncio
async def test_a_sync_tools_late_result_is_recorded_as_returned_without_after_invoke(checkpointer, make_thread) -> None:
    """Cut off by node_timeout, a sync tool's thread runs on; its result arrives when no run waits
    for it, so it is recorded as the tool returned it (after_invoke cannot run) and the resume
    answers from the ledger: the tool ran once, before_invoke fired once."""
    import asyncio
    import threading

    from tenxgraph.core.exceptions import NodeTimeoutError
    from tenxgraph.utils import CallbackManager, InvocationType

    from .tool_graphs import call, tool_graph, tool_texts

    release, starts = threading.Event(), []

    def charge() -> str:
        """Charges the card."""
        starts.append(1)
        if not release.wait(30):
            raise RuntimeError("never released")
        return "charged"

    seen: list[str] = []
    mgr = CallbackManager()
    mgr.register_before_invoke(InvocationType.TOOL, lambda c, d: (seen.append("before"), d)[1])
    mgr.register_after_invoke(InvocationType.TOOL, lambda c, i, o: (seen.append("after"), o.upper())[1])
    app = tool_graph(AgentState, [charge], [[call("c1", "charge")]], checkpointer=checkpointer, callback_manager=mgr)
    cfg = {"thread_id": make_thread("latecb"), "node_timeout": 0.5, "tool_timeout": None}
    try:
        with pytest.raises(NodeTimeoutError):
            await asyncio.wait_for(app.ainvoke({"messages": [Message.text_message("pay")]}, dict(cfg)), 30)
    finally:
        release.set()
    state = await checkpointer.aget_state(dict(cfg))
    key = f"{next(m for m in state.context if m.tools_calls).message_id}:c1"
    for _ in range(1500):
        if await checkpointer.aget_tool_status(dict(cfg), key) == "completed":
            break
        await asyncio.sleep(0.02)
    record = await checkpointer.aget_tool_result(dict(cfg), key)
    assert record["value"]["content"][0]["output"] == "charged"
    r = await app.ainvoke({}, {"thread_id": cfg["thread_id"]})
    assert tool_texts(r["messages"]) == {"c1": "charged"}
    assert len(starts) == 1 and seen == ["before"]
