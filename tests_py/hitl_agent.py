"""Red team B: a human-in-the-loop agent for random-moment SIGKILLs, and its child-process driver.

The model asks, in ONE assistant message, for four tools:
  l1 lookup  (sync, runs in a thread; effect in the middle, sleeps on both sides)
  n1 notify  (async; effect in the middle, sleeps on both sides)
  r1 refund  (async; interrupt() for approval, effect after the approval)
  w1 wire    (sync; interrupt() for approval; declined by the human: never an effect)
then answers with the tool outputs. Knobs (environment of the child):
  HITL_STATIC=1      compile(interrupt_before=["tools"]): a human reviews the tool calls first
  HITL_WIRE_AMO=1    wire is @tool(side_effects="at_most_once") (the node then writes intent rows)
  HITL_SIMPLE=1      the model asks for l1 and n1 only (no approvals)
  HITL_HANG=<path>   notify touches <path> after its effect and then hangs (until cancelled)
  HITL_SLOW=<secs>   notify sleeps that long after its effect (default 0.02)
  HITL_SYNC_MID=<path> lookup touches <path> right after its effect, then sleeps 0.5 s
Effects go to the EffectCounter at $TENXGRAPH_EFFECTS (O_APPEND + flock + fsync per line), with
the answer a tool got, so a misapplied answer is visible ("for" names the question it answers).

Child: ``python hitl_agent.py SPEC.json``. Spec keys: db (sqlite path or DSN), redis (url or
None), thread_id, mode ("flow": act like a client until the thread completes; "once": send
``input`` once; "resume_running": send {} once if the thread is running), input, text, config,
stream (None or "low"/"partial"/"full"), ready (a file touched right before the first run),
barrier (dir, index, workers: start together), chunks (a JSON-lines file of streamed chunks),
result (the JSON result file).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.testing import EffectCounter
from tenxgraph.utils import interrupt, pending_interrupt
from tenxgraph.utils.tool_decorator import tool

APPROVE_REFUND = {"approved": True, "for": "refund"}
DECLINE_WIRE = {"approved": False, "for": "wire"}


def effect(name: str, **data: Any) -> None:
    EffectCounter.from_env().record(name, **data)


def lookup(order_id: str) -> str:
    """Look the order up (sync: runs in a thread)."""
    time.sleep(0.03)
    effect("lookup", order_id=order_id)
    mid = os.environ.get("HITL_SYNC_MID")
    if mid:  # a file the parent waits for, to kill while the sync tool is mid-effect
        Path(mid).touch()
        time.sleep(0.5)
    time.sleep(0.03)
    return f"found {order_id}"


async def notify(order_id: str) -> str:
    """Notify the customer."""
    await asyncio.sleep(0.02)
    effect("notify", order_id=order_id)
    hang = os.environ.get("HITL_HANG")
    if hang:
        Path(hang).touch()
        await asyncio.Event().wait()
    await asyncio.sleep(float(os.environ.get("HITL_SLOW") or 0.02))
    return f"notified {order_id}"


async def refund(order_id: str, amount_cents: int) -> str:
    """Refund an order once a human approved it."""
    answer = interrupt({"order_id": order_id, "amount_cents": amount_cents}, message="approve the refund?")
    if not isinstance(answer, dict) or answer.get("for") != "refund":
        effect("misapplied", tool="refund", answer=answer)
    if not (isinstance(answer, dict) and answer.get("approved")):
        return f"refund of {order_id} declined"
    await asyncio.sleep(0.02)
    effect("refund", order_id=order_id, answer=answer)
    await asyncio.sleep(0.02)
    return f"refunded {amount_cents} for {order_id}"


def wire_tool() -> Any:
    """A fresh function per build: @tool marks the function it is given."""

    def wire(account: str, amount_cents: int) -> str:
        """Wire money once a human approved it (sync: runs in a thread)."""
        answer = interrupt({"account": account, "amount_cents": amount_cents}, message="approve the wire?")
        if not isinstance(answer, dict) or answer.get("for") != "wire":
            effect("misapplied", tool="wire", answer=answer)
        if not (isinstance(answer, dict) and answer.get("approved")):
            return f"wire to {account} declined"
        time.sleep(0.02)
        effect("wire", account=account, answer=answer)
        time.sleep(0.02)
        return f"wired {amount_cents} to {account}"

    if os.environ.get("HITL_WIRE_AMO") == "1":
        return tool(side_effects="at_most_once")(wire)
    return wire


def _call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def calls(order: str) -> list[dict[str, Any]]:
    out = [_call("l1", "lookup", order_id=order), _call("n1", "notify", order_id=order)]
    if os.environ.get("HITL_SIMPLE") != "1":
        out += [_call("r1", "refund", order_id=order, amount_cents=1299),
                _call("w1", "wire", account="acc-9", amount_cents=500)]
    return out


def tool_outputs(messages: list[Message]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in messages:
        for b in m.content:
            if getattr(b, "type", None) == "tool_result":
                out[b.call_id] = b.output
    return out


async def model(state: AgentState) -> Message:
    await asyncio.sleep(0.01)
    last = state.context[-1]
    if last.role == "user":
        msg = Message.text_message(f"working on: {last.text()}", role="assistant")
        msg.tools_calls = calls(last.text())
        return msg
    asked = max(i for i, m in enumerate(state.context) if m.role == "assistant" and m.tools_calls)
    outs = tool_outputs(state.context[asked + 1:])
    return Message.text_message("done: " + " | ".join(f"{k}={outs[k]}" for k in sorted(outs)), role="assistant")


def route(state: AgentState) -> str:
    return "tools" if state.context[-1].tools_calls else END


def build(checkpointer: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([lookup, notify, refund, wire_tool()]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    static = ["tools"] if os.environ.get("HITL_STATIC") == "1" else None
    return g.compile(checkpointer=checkpointer, interrupt_before=static)


# --------------------------------------------------------------------------- the client


def next_input(state: Any, text: str = "o-7") -> dict[str, Any] | None:
    """What a well-behaved client sends next, judged from the stored thread (None: done)."""
    if state is None:
        return {"messages": [Message.text_message(text)]}
    meta = state.execution_meta
    status = str(meta.status).split(".")[-1].lower()
    if status == "completed":
        return None
    pending = pending_interrupt(state)
    if pending is not None:
        # interrupt_id: the question answered, so a retried answer cannot land on the next one
        if pending.tool_call_id == "r1":
            return {"resume": dict(APPROVE_REFUND), "interrupt_id": pending.id}
        if pending.tool_call_id == "w1":
            return {"resume": dict(DECLINE_WIRE), "interrupt_id": pending.id}
        raise AssertionError(f"unexpected pending interrupt {pending}")
    return {}  # running (crashed), a static interrupt_before, a stop, an error


def open_checkpointer(db: str, redis: str | None = None) -> Any:
    from tenxgraph.storage.checkpointer import PgCheckpointer, SqliteCheckpointer

    if db.startswith("postgres"):
        return PgCheckpointer(db, redis_url=redis)
    return SqliteCheckpointer(db)


def _append(path: str | None, obj: dict[str, Any]) -> None:
    if not path:
        return
    line = (json.dumps(obj, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def chunk_record(run: int, chunk: Any) -> dict[str, Any]:
    m = chunk.message
    rec: dict[str, Any] = {"run": run, "pid": os.getpid(), "event": str(chunk.event.value),
                           "status": (chunk.data or {}).get("status") or chunk.metadata.get("status"),
                           "node": chunk.metadata.get("node") or (chunk.data or {}).get("node")}
    if m is not None:
        rec.update(id=str(m.message_id), role=m.role, text=m.text(), delta=bool(m.delta),
                   calls=[c.get("id") for c in (m.tools_calls or [])], results=tool_outputs([m]))
    return rec


async def run_one(app: Any, inp: dict[str, Any], cfg: dict[str, Any], stream: str | None, chunks: str | None,
                  index: int) -> None:
    if isinstance(inp.get("messages"), list):
        inp = {**inp, "messages": [m if isinstance(m, Message) else Message.model_validate(m) for m in inp["messages"]]}
    _append(chunks, {"run": index, "pid": os.getpid(), "begin": json.loads(json.dumps(inp, default=str))})
    if stream:
        async for chunk in app.astream(inp, dict(cfg), stream):
            _append(chunks, chunk_record(index, chunk))
    else:
        await app.ainvoke(inp, dict(cfg))
    _append(chunks, {"run": index, "pid": os.getpid(), "end": True})


def _wait_barrier(b: dict[str, Any]) -> None:
    d = Path(b["dir"])
    (d / f"ready.{b['index']}").touch()
    deadline = time.monotonic() + 120
    while not all((d / f"ready.{i}").exists() for i in range(int(b["workers"]))):
        if time.monotonic() > deadline:
            raise RuntimeError("barrier timeout")
        time.sleep(0.001)


async def child(spec: dict[str, Any]) -> dict[str, Any]:
    cp = open_checkpointer(spec["db"], spec.get("redis"))
    app = build(cp)
    tid = spec["thread_id"]
    cfg = {"thread_id": tid, **(spec.get("config") or {})}
    report: dict[str, Any] = {"pid": os.getpid(), "sent": []}
    if spec.get("barrier"):
        _wait_barrier(spec["barrier"])
    if spec.get("ready"):
        Path(spec["ready"]).touch()
    try:
        mode = spec["mode"]
        if mode == "once":
            report["sent"].append(spec["input"])
            await run_one(app, spec["input"], cfg, spec.get("stream"), spec.get("chunks"), 0)
        elif mode == "resume_running":
            state = await cp.aget_state({"thread_id": tid})
            if state is not None and str(state.execution_meta.status).split(".")[-1].lower() == "running":
                report["sent"].append({})
                await run_one(app, {}, cfg, spec.get("stream"), spec.get("chunks"), 0)
        else:  # flow
            for i in range(20):
                state = await cp.aget_state({"thread_id": tid})
                inp = next_input(state, spec.get("text", "o-7"))
                if inp is None and i == 0 and spec.get("stream") and spec.get("reconnect"):
                    inp = {}  # a streaming client that reconnects to a finished thread: {} for the answer
                elif inp is None:
                    break
                report["sent"].append(json.loads(json.dumps(inp, default=lambda o: o.model_dump(mode="json"))))
                await run_one(app, inp, cfg, spec.get("stream"), spec.get("chunks"), i)
                if inp == {} and state is not None and str(state.execution_meta.status).endswith("completed"):
                    break
            else:
                raise AssertionError("the flow did not complete in 20 runs")
        report["outcome"] = "ok"
    except Exception as exc:  # noqa: BLE001
        report["outcome"] = "error"
        report["error"] = {"type": type(exc).__name__, "code": getattr(exc, "error_code", None),
                           "message": str(getattr(exc, "message", exc))}
        report["traceback"] = traceback.format_exc()
    try:
        state = await cp.aget_state({"thread_id": tid})
        report["status"] = None if state is None else str(state.execution_meta.status).split(".")[-1].lower()
    except Exception:  # noqa: BLE001
        pass
    try:
        await app.aclose()
    except Exception:  # noqa: BLE001
        pass
    return report


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    report = asyncio.run(child(spec))
    tmp = spec["result"] + ".tmp"
    Path(tmp).write_text(json.dumps(report, default=str))
    os.replace(tmp, spec["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
