"""Graphs for the seeded torture test (tests_py/test_torture.py), run as a child process.

    torture_agent.py GRAPH MODE DB THREAD [--stream]

GRAPH: ``support`` (examples/support_agent.py: model -> 3 parallel tools -> model) or ``loop``
(plan -> 3 parallel tools -> review, looped 3 times by a conditional edge, then finish; two of the
tools update the state through ``ToolResult(state=...)``, one reads the state). MODE: ``start``
(the user message) or ``resume`` (``{}``). DB: a SQLite file, or a ``postgresql://`` DSN (schema
from TORTURE_SCHEMA, ``state_history_limit=1000``). ``--stream`` runs ``astream`` instead of
``ainvoke``. Failpoints come from ``TENXGRAPH_FAILPOINTS`` (read by the core).

Every tool appends one fsynced JSON line to the file named by TORTURE_EFFECTS (the support
agent's tools write to SUPPORT_EFFECTS, which the parent points at the same file), so the parent
counts what really ran across SIGKILLs.

Prints one JSON line: ``{"status", "messages": [[role, text, id], ...], "version",
"already_completed"}`` read back from the checkpointer after the run (a resume of a thread that is
already completed runs nothing), or ``{"error": code}`` (exit 3) when a failpoint raised.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.exceptions import FailpointError
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state.tool_result import ToolResult
from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import support_agent  # noqa: E402  (the README's example agent: its model, route and tools)

USER = "torture-user"
LOOPS = 3
# The calls each graph makes, by call id, and the tool that serves each.
SUPPORT_CALLS = {"call_1": "lookup_order", "call_2": "charge_card", "call_3": "send_receipt"}
LOOP_TOOLS = ("audit", "tag", "echo")
LOOP_CALLS = {f"c{i}_{t}": t for i in range(1, LOOPS + 1) for t in LOOP_TOOLS}
GRAPHS: dict[str, dict[str, Any]] = {
    "support": {"calls": SUPPORT_CALLS, "nodes": {"model": 2, "tools": 1},
                "tools": {"lookup_order": 1, "charge_card": 1, "send_receipt": 1}},
    "loop": {"calls": LOOP_CALLS, "nodes": {"plan": LOOPS, "tools": LOOPS, "review": LOOPS, "finish": 1},
             "tools": {t: LOOPS for t in LOOP_TOOLS}},
}


def open_checkpointer(db: str):
    if db.startswith("postgresql://"):
        return PgCheckpointer(db, schema=os.environ["TORTURE_SCHEMA"], state_history_limit=1000)
    return SqliteCheckpointer(db)


def effect(tool: str, call_id: str, **data: Any) -> None:
    path = os.environ.get("TORTURE_EFFECTS")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"tool": tool, "call_id": call_id, "phase": "done", "pid": os.getpid(), **data}) + "\n")
        f.flush()
        os.fsync(f.fileno())


# --------------------------------------------------------------------------- (a) the support agent


def build_support(checkpointer):
    g = StateGraph(support_agent.SupportState)
    g.add_node("model", support_agent.model)
    g.add_node("tools", ToolNode([support_agent.lookup_order, support_agent.charge_card, support_agent.send_receipt]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", support_agent.route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


# --------------------------------------------------------------------------- (b) the loop graph


class LoopState(AgentState):
    iteration: int = 0
    audited_upto: int = 0
    last_tag: str = ""


def _call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def plan(state: LoopState) -> LoopState:
    i = state.iteration + 1
    state.iteration = i
    msg = Message.text_message(f"plan {i}", role="assistant")
    msg.tools_calls = [_call(f"c{i}_audit", "audit", i=i), _call(f"c{i}_tag", "tag", i=i, label=f"t{i}"),
                       _call(f"c{i}_echo", "echo", i=i, text=f"e{i}")]
    state.context.append(msg)
    return state


async def audit(i: int, idempotency_key: str) -> ToolResult:
    """Audit iteration i; records how far the audit got in the state."""
    effect("audit", f"c{i}_audit", key=idempotency_key)
    return ToolResult(f"audited {i}", state={"audited_upto": i})


async def tag(i: int, label: str) -> ToolResult:
    """Tag iteration i with a label; stores the label in the state."""
    await asyncio.sleep(0.002)  # returns after audit: the two state updates land at different times
    effect("tag", f"c{i}_tag", label=label)
    return ToolResult(f"tagged {label}", state={"last_tag": label})


async def echo(i: int, text: str, state: LoopState) -> str:
    """Echo a text, with what the state said when the call ran (a branch copy)."""
    effect("echo", f"c{i}_echo")
    return f"echo {text} at iteration {state.iteration} audited {state.audited_upto}"


async def review(state: LoopState) -> LoopState:
    results = sum(1 for m in state.context if m.role == "tool")
    state.context.append(Message.text_message(
        f"review {state.iteration}: audited_upto={state.audited_upto} last_tag={state.last_tag} "
        f"tool_messages={results} messages={len(state.context)}", role="assistant"))
    return state


async def finish(state: LoopState) -> LoopState:
    state.context.append(Message.text_message(
        f"final: iteration={state.iteration} audited_upto={state.audited_upto} last_tag={state.last_tag}",
        role="assistant"))
    return state


def again(state: LoopState) -> str:
    return "plan" if state.iteration < LOOPS else "finish"


def build_loop(checkpointer):
    g = StateGraph(LoopState)
    g.add_node("plan", plan)
    g.add_node("tools", ToolNode([audit, tag, echo]))
    g.add_node("review", review)
    g.add_node("finish", finish)
    g.add_edge(START, "plan")
    g.add_edge("plan", "tools")
    g.add_edge("tools", "review")
    g.add_conditional_edges("review", again, {"plan": "plan", "finish": "finish"})
    g.add_edge("finish", END)
    return g.compile(checkpointer=checkpointer)


BUILDERS = {"support": build_support, "loop": build_loop}
USER_TEXT = {"support": "Please charge my saved card for order 4821 and email me the receipt.",
             "loop": "audit this three times"}


def user_input(graph: str) -> dict[str, Any]:
    return {"messages": [Message.text_message(USER_TEXT[graph], message_id="user-1")]}


async def run(graph: str, mode: str, checkpointer, thread: str, stream: bool) -> dict[str, Any]:
    app = BUILDERS[graph](checkpointer)
    config = {"thread_id": thread, "user_id": USER, "recursion_limit": 50}
    data = user_input(graph) if mode == "start" else {}
    already = False
    if mode == "resume":
        # A crash after the last node's step committed leaves a completed thread: there is
        # nothing to resume (ainvoke({}) on a completed thread would start a new run).
        before = await checkpointer.aget_state({"thread_id": thread, "user_id": USER})
        already = before is not None and str(before.execution_meta.status) == "completed"
    if already:
        pass
    elif stream:
        async for _chunk in app.astream(data, config):
            pass
    else:
        await app.ainvoke(data, config)
    probe = {"thread_id": thread, "user_id": USER}
    state = await checkpointer.aget_state(probe)
    return {
        "status": str(state.execution_meta.status),
        "messages": [[m.role, m.text(), m.message_id] for m in state.context],
        "version": probe.get("_checkpoint_version"),
        "already_completed": already,
    }


async def main(graph: str, mode: str, db: str, thread: str, stream: bool) -> int:
    try:
        out = await run(graph, mode, open_checkpointer(db), thread, stream)
    except FailpointError as e:
        print(json.dumps({"error": e.error_code}), flush=True)
        return 3
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], "--stream" in sys.argv[5:])))
