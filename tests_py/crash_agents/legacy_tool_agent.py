"""A small tool-calling agent written against the public API that 10xGraph 0.10 and tenxgraph share.

The real 10xGraph runs it as a script (``python legacy_tool_agent.py start``) to write a thread
into a Postgres + Redis that tenxgraph then opens; tenxgraph's side imports ``build``.

- ``model`` (scripted): on the user's message it asks for two tools in one assistant message
  (``charge`` and ``email``); on their results it answers ``"all done: ..."``. It refuses to run on
  a context whose tool calls are unanswered (what a provider does), so a resume at the wrong node
  shows up as NodeError NODE_001.
- ``charge`` records its effect and returns at once; ``email`` writes ``email.ready`` and waits
  for ``email.release`` before recording its effect, so a test can kill the process inside the
  tool node after ``charge``'s ledger row committed and before ``email`` finished.
- A file ``model.fail`` in the agent's directory makes the next model call raise (a provider
  error), once; a file ``model.hang`` makes the next one write ``model.ready`` and hang (a turn a
  test kills before any tool ran).
- With ``$LEGACY_AGENT_GATE`` set to a path, the script writes ``<path>.ready`` once its store is
  set up and starts the turn when ``<path>`` exists.
- With ``$LEGACY_AGENT_BLOCK_MODEL`` set, the model's call on the tool results writes
  ``model.ready`` and hangs: a test kills the process inside the model node after the tool
  node's step committed.

Effects go to ``$LEGACY_AGENT_DIR/effects.jsonl``, one JSON line each (fsync'd: the writer may be
SIGKILLed right after). Message ids are derived from the thread id (they are unique across a
Postgres database) so runs on different threads compare equal once the thread id is replaced.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tenxgraph.core.graph import StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message_block import TextBlock, ToolCallBlock
from tenxgraph.utils import END

AGENT_DIR_ENV = "LEGACY_AGENT_DIR"
BLOCK_MODEL_ENV = "LEGACY_AGENT_BLOCK_MODEL"
TURN_ENV = "LEGACY_AGENT_TURN"
GATE_ENV = "LEGACY_AGENT_GATE"
USER = "u1"


def workdir() -> Path:
    return Path(os.environ[AGENT_DIR_ENV])


def record(name: str) -> None:
    with open(workdir() / "effects.jsonl", "a") as f:
        f.write(json.dumps({"effect": name, "pid": os.getpid()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def charge(amount: int) -> str:
    """Charge the saved card."""
    record("charge")
    return f"charged {amount}"


async def email(to: str) -> str:
    """Email the receipt."""
    (workdir() / "email.ready").write_text(str(os.getpid()))
    while not (workdir() / "email.release").exists():
        await asyncio.sleep(0.05)
    record("email")
    return f"emailed {to}"


def _unanswered(context: list[Message]) -> list[str]:
    asked = [c["id"] for m in context if m.role == "assistant" and m.tools_calls for c in m.tools_calls]
    answered = {m.metadata.get("tool_call_id") for m in context if m.role == "tool"}
    return [c for c in asked if c not in answered]


def turn_suffix() -> str:
    """Ids of a later turn (``$LEGACY_AGENT_TURN`` > 1) differ from the first turn's."""
    turn = int(os.environ.get(TURN_ENV, "1"))
    return "" if turn == 1 else f"-t{turn}"


def model(state: AgentState) -> list[Message]:
    thread = f"{state.execution_meta.thread_id}{turn_suffix()}"
    pending = _unanswered(state.context)
    if pending:
        raise RuntimeError(f"unanswered tool calls: {pending}")
    fail = workdir() / "model.fail"
    if fail.exists():  # a test's provider error, once
        fail.unlink()
        raise RuntimeError("the provider answered 503")
    if (workdir() / "model.hang").exists():
        (workdir() / "model.hang").unlink()
        (workdir() / "model.ready").write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)
    if state.context[-1].role == "tool" and os.environ.get(BLOCK_MODEL_ENV):
        # The model call on the tool results hangs (until the test kills this process).
        (workdir() / "model.ready").write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)
    record("model")
    if state.context[-1].role == "tool":
        results = "; ".join(m.text() for m in state.context if m.role == "tool")
        return [Message(message_id=f"{thread}-a-2", role="assistant", content=[TextBlock(text=f"all done: {results}")])]
    charge_id, email_id = f"call_1{turn_suffix()}", f"call_2{turn_suffix()}"
    calls = [
        {"id": charge_id, "type": "function", "function": {"name": "charge", "arguments": json.dumps({"amount": 42})}},
        {"id": email_id, "type": "function", "function": {"name": "email", "arguments": json.dumps({"to": "a@b.c"})}},
    ]
    return [
        Message(
            message_id=f"{thread}-a-1",
            role="assistant",
            content=[
                TextBlock(text="charging and emailing"),
                ToolCallBlock(id=charge_id, name="charge", args={"amount": 42}),
                ToolCallBlock(id=email_id, name="email", args={"to": "a@b.c"}),
            ],
            tools_calls=calls,
        )
    ]


def route(state: AgentState) -> str:
    last = state.context[-1]
    return "tools" if last.role == "assistant" and last.tools_calls else END


def build(checkpointer: Any, interrupt_before: list[str] | None = None) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([charge, email]))
    g.set_entry_point("model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer, interrupt_before=interrupt_before)


def user_message(thread: str) -> Message:
    return Message(message_id=f"{thread}{turn_suffix()}-u-1", role="user", content=[TextBlock(text="charge 42 and email me")])


async def _main(mode: str) -> None:
    # 10xGraph's own PgCheckpointer (this script runs on the real 10xGraph).
    from tenxgraph.storage.checkpointer import PgCheckpointer

    thread = os.environ["THREAD"]
    config: dict[str, Any] = {"thread_id": thread, "user_id": USER}
    if os.environ.get("NONDURABLE"):
        config["durable_checkpoint_every_step"] = False
    cp = PgCheckpointer(postgres_dsn=os.environ["PG_DSN"], redis_url=os.environ["REDIS_URL"])
    await cp.asetup()
    gate = os.environ.get(GATE_ENV)
    if gate:  # the test says when the turn starts (its store is set up by then)
        Path(gate + ".ready").write_text(str(os.getpid()))
        while not Path(gate).exists():
            await asyncio.sleep(0.05)
    pause = os.environ.get("INTERRUPT_BEFORE")
    app = build(cp, interrupt_before=[pause] if pause else None)
    if mode == "start":
        out = await app.ainvoke({"messages": [user_message(thread)]}, config=config)
    else:
        out = await app.ainvoke({}, config=config)
    state = await cp.aget_state({"thread_id": thread, "user_id": USER})
    print("RESULT " + json.dumps({
        "messages": [m.model_dump(mode="json") for m in out["messages"]],
        "context": [m.model_dump(mode="json") for m in state.context],
        "status": str(state.execution_meta.status.value),
    }), flush=True)
    await cp.arelease()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1]))
