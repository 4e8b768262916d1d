"""The support agent of the design note, on the embedded SQLite default (no API key needed).

A scripted model answers "please charge my card for order 4821 and email me the receipt" with
three tool calls in one message: lookup_order, charge_card and send_receipt. Every tool appends
what it did to an "external system" log next to the database, so we can count side effects
across processes.

    python examples/support_agent.py              # the demo: run, crash mid-node, resume
    python examples/support_agent.py --run        # one normal turn
    python examples/support_agent.py --run --hang-in send_receipt   # hangs there (kill it)
    python examples/support_agent.py --resume     # continue a crashed thread

The demo starts a child process that hangs inside send_receipt after charge_card has returned,
kills it with SIGKILL, and resumes the thread in this process: charge_card is answered from the
tool ledger and the card is charged exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.storage.checkpointer import SqliteCheckpointer

THREAD = "order-4821"
EFFECTS = Path(os.environ.get("SUPPORT_EFFECTS", Path(tempfile.gettempdir()) / "support-effects.jsonl"))


class SupportState(AgentState):
    order_id: str | None = None


def record_effect(tool: str, phase: str, **data: object) -> None:
    """The "external system": an append-only log outside this process."""
    with open(EFFECTS, "a") as f:
        f.write(json.dumps({"tool": tool, "phase": phase, "pid": os.getpid(), **data}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def effects() -> list[dict]:
    return [json.loads(line) for line in EFFECTS.read_text().splitlines()] if EFFECTS.exists() else []


async def lookup_order(order_id: str) -> str:
    """Look up an order by id."""
    record_effect("lookup_order", "done", order_id=order_id)
    return f"order {order_id}: 1 x headphones, 129.00 USD, card on file"


async def charge_card(order_id: str, amount_cents: int, idempotency_key: str) -> str:
    """Charge the customer's saved card for an order."""
    # idempotency_key is injected by tenxgraph (stable across replays); a real payment API takes it.
    record_effect("charge_card", "done", order_id=order_id, amount_cents=amount_cents, key=idempotency_key)
    return f"charged {amount_cents / 100:.2f} USD for order {order_id}"


async def send_receipt(order_id: str) -> str:
    """Email the receipt for an order."""
    record_effect("send_receipt", "start", order_id=order_id)
    if os.environ.get("SUPPORT_HANG_IN") == "send_receipt":
        record_effect("send_receipt", "hanging")
        await asyncio.sleep(3600)  # a stuck SMTP server; the process gets killed here
    record_effect("send_receipt", "done", order_id=order_id)
    return f"receipt for order {order_id} sent"


def tool_call(call_id: str, name: str, **args: object) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


async def model(state: SupportState) -> Message:
    """A scripted model: three tool calls for a user message, a summary after tool results."""
    last = state.context[-1]
    if last.role == "user":
        state.order_id = "4821"
        msg = Message.text_message("Let me take care of that.", role="assistant")
        msg.tools_calls = [
            tool_call("call_1", "lookup_order", order_id="4821"),
            tool_call("call_2", "charge_card", order_id="4821", amount_cents=12900),
            tool_call("call_3", "send_receipt", order_id="4821"),
        ]
        return msg
    return Message.text_message("Done: charged and emailed.", role="assistant")


def route(state: SupportState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def build(db_path: str):
    graph = StateGraph(SupportState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup_order, charge_card, send_receipt]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=SqliteCheckpointer(db_path))


async def run_turn(db: str, resume: bool, stream: bool = False) -> dict:
    app = build(db)
    config = {"thread_id": THREAD, "user_id": "customer-118"}
    data = {} if resume else {"messages": [Message.text_message(
        "Please charge my saved card for order 4821 and email me the receipt.")]}
    if stream:  # the same guarantees: messages arrive as steps commit and tools are recorded
        async for chunk in app.astream(data, config):
            if chunk.message is not None:
                print(f"{chunk.message.role:>9}: {chunk.message.text()}  [streamed]", flush=True)
        return {}
    result = await app.ainvoke(data, config, response_granularity="full")
    for m in result["messages"]:
        calls = f"  -> {[c['function']['name'] for c in m.tools_calls]}" if m.tools_calls else ""
        print(f"{m.role:>9}: {m.text()}{calls}")
    return result


def ledger_has(db: str, call_id: str) -> bool:
    """Whether a result is recorded for the call (ledger keys are ``["<message id>", "<call id>"]``)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
            rows = c.execute("SELECT tool_call_id FROM tool_executions WHERE json_extract(result, '$.__kind__') IS NOT 'started'").fetchall()
    except sqlite3.Error:
        return False
    return any(json.loads(r[0])[1] == call_id for r in rows)


def demo(db: str) -> None:
    if EFFECTS.exists():
        EFFECTS.unlink()
    print(f"== run 1 (child process), hangs in send_receipt; database {db}")
    env = dict(os.environ, SUPPORT_HANG_IN="send_receipt", SUPPORT_EFFECTS=str(EFFECTS))
    child = subprocess.Popen([sys.executable, __file__, "--run", "--db", db], env=env)
    deadline = time.monotonic() + 60
    while not (any(e["phase"] == "hanging" for e in effects()) and ledger_has(db, "call_2")):
        if time.monotonic() > deadline or child.poll() is not None:
            child.kill()
            raise SystemExit("the child did not reach send_receipt")
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    print(f"== killed the child with SIGKILL (exit {child.returncode}) while send_receipt was running")
    print("== run 2 (this process): resume the thread with ainvoke({}, config)")
    asyncio.run(run_turn(db, resume=True))
    done = [e["tool"] for e in effects() if e["phase"] == "done"]
    counts = {t: done.count(t) for t in ("lookup_order", "charge_card", "send_receipt")}
    print(f"== side effects in the external system: {counts}")
    assert counts == {"lookup_order": 1, "charge_card": 1, "send_receipt": 1}, counts
    print("charge_card ran once: after the crash it was answered from the ledger, not repeated.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default=None, help="SQLite file (default: a fresh temporary one for the demo)")
    parser.add_argument("--run", action="store_true", help="run one turn")
    parser.add_argument("--resume", action="store_true", help="resume the thread after a crash")
    parser.add_argument("--hang-in", choices=["send_receipt"], help="hang inside this tool (to be killed)")
    parser.add_argument("--stream", action="store_true", help="use astream instead of ainvoke")
    args = parser.parse_args()
    if args.hang_in:
        os.environ["SUPPORT_HANG_IN"] = args.hang_in
    if args.run or args.resume:
        db = args.db or os.path.join(tempfile.gettempdir(), "support-agent.db")
        asyncio.run(run_turn(db, resume=args.resume, stream=args.stream))
    else:
        demo(args.db or os.path.join(tempfile.mkdtemp(prefix="tenxgraph-demo-"), "agent.db"))


if __name__ == "__main__":
    main()
