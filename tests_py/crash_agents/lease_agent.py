"""The support agent with a chosen side-effect class for ``charge_card``, for the lease and
intent-record tests (tests_py/test_leases.py). Importable (factories for the crash kit) and
runnable as a child process:

    lease_agent.py rounds DB WORKER BARRIER_DIR ROUNDS ON_BUSY
        One of two long-lived workers. Round r: both meet at a file barrier, then each sends
        "charge order r" to thread "round-r" with the given ``on_busy``. Prints one JSON line,
        {"worker", "pid", "rounds": [{"round", "outcome", "started", "finished"}]}.
    lease_agent.py run DB THREAD CONFIG_JSON [TEXT]
        One ainvoke (TEXT: a new user message; none: resume with {}). Prints {"outcome", ...}.

DB is a SQLite path or a postgresql:// DSN. Tools record their effects in $TENXGRAPH_EFFECTS
(``EffectCounter``) with the order id, which is the round number. ``LEASE_MODEL_SLEEP`` (s) and
``LEASE_MODEL_MARKER`` (a file touched when the first model call starts) let a test hold a run
inside its first node; ``LEASE_TURN_SLEEP`` (s) slows every turn's first model call.
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
from tenxgraph.testing import EffectCounter
from tenxgraph.utils.tool_decorator import tool
from tests_py.kit_agents.support import DONE, route, tool_call

__all__ = ["DONE", "build_at_most_once", "build_idempotent", "build_interrupt", "open_db"]


async def lookup_order(order_id: str) -> str:
    """Look up an order by id."""
    EffectCounter.from_env().record("lookup_order", order_id=order_id)
    return f"order {order_id}: 1 x headphones, 129.00 USD, card on file"


async def send_receipt(order_id: str) -> str:
    """Email the receipt for an order."""
    EffectCounter.from_env().record("send_receipt", order_id=order_id)
    return f"receipt for order {order_id} sent"


def charge_tool(side_effects: Any, on_unknown: Any = "error") -> Any:
    @tool(name="charge_card", side_effects=side_effects, on_unknown=on_unknown)
    async def charge_card(order_id: str, amount_cents: int, idempotency_key: str) -> str:
        """Charge the customer's saved card for an order."""
        EffectCounter.from_env().record("charge_card", order_id=order_id, key=idempotency_key)
        return f"charged {amount_cents / 100:.2f} USD for order {order_id}"

    return charge_card


_first_model_call = True
# Set by ``rounds`` in reject mode: the file the other worker writes when its turn of this round has
# ended. The winner holds its lease inside the model call until then, so the two turns overlap on
# any machine load (a sleep only made overlap likely; under load the loser could arrive after the
# winner had finished).
_hold_until: Path | None = None


async def model(state: AgentState) -> Message:
    """Three tool calls for a user message ("... order N": N is the order id); then the summary."""
    global _first_model_call
    last = state.context[-1]
    if last.role == "user":
        if _first_model_call:
            _first_model_call = False
            marker = os.environ.get("LEASE_MODEL_MARKER")
            if marker:
                Path(marker).touch()
            await asyncio.sleep(float(os.environ.get("LEASE_MODEL_SLEEP", "0")))
        # Every turn's first model call takes this long, so two racing turns overlap.
        await asyncio.sleep(float(os.environ.get("LEASE_TURN_SLEEP", "0")))
        hold = _hold_until
        if hold is not None:
            deadline = time.monotonic() + 60  # a bound, not a margin: a broken lease fails the assert
            while not hold.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.002)
        order = last.text().split()[-1]
        msg = Message.text_message("Let me take care of that.", role="assistant")
        msg.tools_calls = [
            tool_call("call_1", "lookup_order", order_id=order),
            tool_call("call_2", "charge_card", order_id=order, amount_cents=12900),
            tool_call("call_3", "send_receipt", order_id=order),
        ]
        return msg
    return Message.text_message(DONE, role="assistant")


def _build(checkpointer: Any, charge: Any) -> Any:
    graph = StateGraph(AgentState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lookup_order, charge, send_receipt]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)


def build_idempotent(checkpointer: Any) -> Any:
    return _build(checkpointer, charge_tool("idempotent"))


def build_at_most_once(checkpointer: Any) -> Any:
    return _build(checkpointer, charge_tool("at_most_once"))


def build_interrupt(checkpointer: Any) -> Any:
    return _build(checkpointer, charge_tool("at_most_once", on_unknown="interrupt"))


def open_db(db: str) -> Any:
    if db.startswith("postgres"):
        from tenxgraph.storage.checkpointer import PgCheckpointer

        return PgCheckpointer(db)
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    return SqliteCheckpointer(db)


def _outcome(result: Any = None, exc: BaseException | None = None) -> dict[str, Any]:
    if exc is not None:
        return {"outcome": f"{type(exc).__name__}/{getattr(exc, 'error_code', None)}", "message": str(exc)}
    return {"outcome": "completed", "status": str(result["state"].execution_meta.status),
            "messages": [m.text() for m in result["messages"]]}


async def rounds(db: str, worker: str, barrier: Path, n: int, on_busy: str) -> dict[str, Any]:
    global _hold_until
    app = build_at_most_once(open_db(db))
    other = "b" if worker == "a" else "a"
    out = []
    for r in range(n):
        (barrier / f"{r}.{worker}").touch()
        deadline = time.monotonic() + 30
        while not (barrier / f"{r}.{other}").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {worker}: barrier of round {r} timed out")
            await asyncio.sleep(0.0005)
        cfg = {"thread_id": f"round-{r}", "on_busy": on_busy, "busy_timeout": 30}
        _hold_until = barrier / f"{r}.{other}.done" if on_busy == "reject" else None
        started = time.time()
        try:
            res = _outcome(await app.ainvoke({"messages": [Message.text_message(f"charge order {r}")]}, cfg,
                                             response_granularity="full"))
        except Exception as exc:  # the outcome is the result: the parent asserts on it
            res = _outcome(exc=exc)
        (barrier / f"{r}.{worker}.done").touch()
        out.append({"round": r, "outcome": res["outcome"], "started": started, "finished": time.time()})
    return {"worker": worker, "pid": os.getpid(), "rounds": out}


async def run_once(db: str, thread: str, config: dict[str, Any], text: str | None) -> dict[str, Any]:
    app = build_at_most_once(open_db(db))
    data = {"messages": [Message.text_message(text)]} if text else {}
    try:
        return _outcome(await app.ainvoke(data, {"thread_id": thread, **config}, response_granularity="full"))
    except Exception as exc:
        return _outcome(exc=exc)


async def main(argv: list[str]) -> None:
    if argv[0] == "rounds":
        db, worker, barrier, n, on_busy = argv[1:6]
        print(json.dumps(await rounds(db, worker, Path(barrier), int(n), on_busy)), flush=True)
    elif argv[0] == "run":
        db, thread, config = argv[1:4]
        text = argv[4] if len(argv) > 4 else None
        print(json.dumps(await run_once(db, thread, json.loads(config), text)), flush=True)
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
