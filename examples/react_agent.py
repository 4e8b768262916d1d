"""10xGraph's quick start, the refund agent with its approval step, on tenxgraph (no key, no network).

The model is a local stand-in for the OpenAI API (tenxgraph.testing.providers.OpenAIStandIn) that
this script starts on 127.0.0.1 and scripts: the real ``openai`` SDK talks to it through
``OPENAI_BASE_URL``. (pip install "10xgraph[openai]".)

    python examples/react_agent.py

1. The customer asks for a refund; the agent looks the order up and calls refund_order, which
   pauses at ``interrupt()`` for a reviewer. The thread is saved (SQLite).
2. The reviewer approves. The resume runs in a child process, which is killed with SIGKILL right
   after the refund was issued (and its result recorded in the tool ledger), before the tool
   node's step committed. A crash at the worst moment.
3. This process resumes the thread with ``ainvoke({}, config)``: refund_order is answered from the
   ledger, not run again, and the model writes the reply. The refund was issued exactly once.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.testing import EFFECTS_ENV, EffectCounter, run_until_crash
from tenxgraph.testing.providers import OpenAIStandIn
from tenxgraph.utils import interrupt

THREAD = "order-A-1001"


def lookup_order(order_id: str) -> dict:
    """Look up an order by id."""
    return {"order_id": order_id, "status": "delivered", "total": 42.00}


def refund_order(order_id: str, amount: float) -> str:
    """Refund an order. Requires approval."""
    decision = interrupt({"amount": amount}, message=f"Refund ${amount}?")
    if not decision.get("approved"):
        return "Refund declined by reviewer."
    # The side effect, after the interrupt (code before it runs again on resume). It goes to a
    # file outside this process, so the demo can count refunds across the killed process.
    EffectCounter.from_env().record("refund", order_id=order_id, amount=amount, pid=os.getpid())
    return f"Refunded ${amount} for order {order_id}."


def build(checkpointer: Any):
    """The quick start's agent (the model string names an OpenAI model: the stand-in speaks OpenAI)."""
    return ReactAgent(
        model="openai/gpt-4o-mini",
        system_prompt=[{"role": "system", "content": "You are a support agent for an online store."}],
        tools=[lookup_order, refund_order],
    ).compile(checkpointer=checkpointer)


def show(messages: list[Message]) -> None:
    for m in messages:
        calls = f"  -> calls {[c['function']['name'] for c in m.tools_calls]}" if m.tools_calls else ""
        print(f"   {m.role:>9}: {m.text()}{calls}")


async def first_turn(db: str) -> None:
    app = build(SqliteCheckpointer(db))
    config = {"thread_id": THREAD}
    result = await app.ainvoke(
        {"messages": [Message.text_message("Order A-1001 arrived broken, please refund it.")]},
        config=config, response_granularity="full",
    )
    show(result["messages"])
    meta = result["state"].execution_meta
    pending = (meta.interrupt_data or {}).get("interrupt", {})
    print(f"   paused ({meta.status.value}) in {pending.get('node')}: {pending.get('message')!r} "
          f"value={pending.get('value')}")
    await app.aclose()


async def resume_after_crash(db: str) -> None:
    app = build(SqliteCheckpointer(db))
    result = await app.ainvoke({}, {"thread_id": THREAD})
    show(result["messages"])
    await app.aclose()


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="tenxgraph-react-"))
    db = str(work / "agent.db")
    refunds = EffectCounter(work / "effects.jsonl")
    os.environ[EFFECTS_ENV] = str(refunds.path)  # the child process inherits it
    with OpenAIStandIn() as llm:
        os.environ.update(llm.env)
        llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
        llm.reply_tool_calls(("refund_order", {"order_id": "A-1001", "amount": 42.0}))

        print(f"== 1. first turn (this process, pid {os.getpid()}); model stand-in at {llm.base_url}")
        asyncio.run(first_turn(db))

        print("== 2. the reviewer approves; the resume runs in a child process that is killed with SIGKILL")
        print("      right after refund_order returned and its result reached the tool ledger")
        crashed = run_until_crash(f"{Path(__file__).stem}:build", THREAD, db=db,
                                  input={"resume": {"approved": True}},
                                  failpoints="after_record:refund_order=kill", env=llm.env)
        assert crashed.killed, crashed.stderr
        print(f"   child killed (exit {crashed.returncode}); refunds issued so far: {refunds.count('refund')}")

        print("== 3. resume the thread in this process: ainvoke({}, config)")
        llm.reply_text("I have refunded $42.00 for order A-1001. Sorry it arrived broken!")
        asyncio.run(resume_after_crash(db))

        issued = refunds.count("refund")
        print(f"== refunds issued: {issued} (model requests: {len(llm.requests)})")
        assert issued == 1, issued
        print("refund_order ran once: after the crash its result came from the ledger, not a second refund.")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the child imports build() from here
    main()
