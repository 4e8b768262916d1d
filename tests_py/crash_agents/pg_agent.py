"""Graphs on PgCheckpointer for the Postgres race and outage tests (tests_py/test_pg_races_and_outages.py).

Run as a child process, or imported. Side effects go to the file named by TENX_EFFECTS (one line
each, fsynced), so a parent can count what really ran across SIGKILLs and restarts.

    pg_agent.py answer-start DSN SCHEMA THREAD     user message, then node 'answer', whose message
                                                    has the fixed id "fixed-id"
    pg_agent.py answer-resume DSN SCHEMA THREAD    ainvoke({}) on the same graph
        Both print {"status", "messages": [ids]}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import PgCheckpointer

USER = "u-race"


class RaceState(AgentState):
    pass


def effect(line: str, path: str | os.PathLike[str] | None = None) -> None:
    target = path or os.environ.get("TENX_EFFECTS")
    if not target:
        return
    with open(target, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def effects(path: str | os.PathLike[str]) -> list[str]:
    p = Path(path)
    return p.read_text().splitlines() if p.exists() else []


def answer_graph(dsn: str, schema: str):
    async def answer(state: AgentState) -> Message:
        effect("answer")
        return Message.text_message("the answer", role="assistant", message_id="fixed-id")

    g = StateGraph(AgentState)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=PgCheckpointer(dsn, schema=schema))


# --------------------------------------------------------------------------- tools (outage tests)


def tool_call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def tool_graph(checkpointer: Any, effects_path: Path, gate: Path):
    """model -> tools (fast_tool and slow_tool in parallel) -> model -> END.

    slow_tool appends "start:slow", touches ``gate/entered`` and waits for ``gate/release``.
    """

    async def fast_tool(x: int) -> str:
        """Return x doubled."""
        effect("done:fast", effects_path)
        return f"fast {2 * x}"

    async def slow_tool(x: int) -> str:
        """Return x tripled, slowly."""
        effect("start:slow", effects_path)
        (gate / "entered").touch()
        deadline = time.monotonic() + 60
        while not (gate / "release").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("slow_tool was never released")
            await asyncio.sleep(0.01)
        effect("done:slow", effects_path)
        return f"slow {3 * x}"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("calling tools", role="assistant", message_id="assistant-calls")
            msg.tools_calls = [tool_call("call_fast", "fast_tool", x=2), tool_call("call_slow", "slow_tool", x=3)]
            return msg
        return Message.text_message("all done", role="assistant")

    def route(state: AgentState) -> str:
        return "tools" if state.context[-1].tools_calls else END

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([fast_tool, slow_tool]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


# --------------------------------------------------------------------------- entry point


async def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode in ("answer-start", "answer-resume"):
        dsn, schema, thread = argv[1:4]
        app = answer_graph(dsn, schema)
        data = {"messages": [Message.text_message("question", message_id="user-1")]} if mode == "answer-start" else {}
        result = await app.ainvoke(data, {"thread_id": thread, "user_id": USER}, response_granularity="full")
        print(json.dumps({
            "status": str(result["state"].execution_meta.status),
            "messages": [str(m.message_id) for m in result["messages"]],
        }), flush=True)
        return
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
