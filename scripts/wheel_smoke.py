"""Smoke test of an installed wheel, run by scripts/wheel_smoke.sh with ``python -I`` in a clean
virtualenv and a temp directory: no source tree, no PYTHONPATH. Exits non-zero on any failure."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import tenxgraph
from tenxgraph import END, START, AgentState, Message, StateGraph, ToolNode, metrics
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"smoke test failed: {what}")
    print(f"ok  {what}")


def installed_here(abi3: bool) -> None:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    pkg = Path(tenxgraph.__file__).resolve()
    check(site in pkg.parents, f"tenxgraph imported from the virtualenv ({pkg})")
    core = Path(tenxgraph._core.__file__).name
    if abi3:
        check(core == "_core.abi3.so", f"the native module is the abi3 build ({core})")
    check(tenxgraph.__version__ == tenxgraph._core.__version__, f"version {tenxgraph.__version__}")


def graph(checkpointer: object, counter: dict[str, int]) -> object:
    async def charge(amount: int) -> str:
        """Charge a card."""
        counter["charge"] = counter.get("charge", 0) + 1
        return f"charged {amount}"

    async def model(state: AgentState) -> Message:
        if state.context[-1].role == "user":
            msg = Message.text_message("charging", role="assistant")
            msg.tools_calls = [{"id": "c1", "type": "function",
                                "function": {"name": "charge", "arguments": json.dumps({"amount": 5})}}]
            return msg
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([charge]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else END)
    g.add_edge("tools", "model")
    return g.compile(checkpointer=checkpointer)


async def runs(db: Path) -> None:
    for cp in (InMemoryCheckpointer(), SqliteCheckpointer(db)):
        counter: dict[str, int] = {}
        app = graph(cp, counter)
        cfg = {"thread_id": "smoke-1", "user_id": "u"}
        r = await app.ainvoke({"messages": [Message.text_message("pay")]}, cfg)
        check(r["messages"][-1].text() == "done" and counter == {"charge": 1}, f"a run with a tool ({type(cp).__name__})")
        # Back to the tool node with the same call: answered from the ledger, not run again.
        state = await cp.aget_state(cfg)
        ask = next(m for m in state.context if m.tools_calls)
        state.context = state.context[: state.context.index(ask) + 1]
        await cp.aput_state(cfg, state)
        await app.ainvoke({"state": {"current_node": "tools"}}, cfg)
        check(counter == {"charge": 1}, f"a replayed tool call comes from the ledger ({type(cp).__name__})")
        chunks = [c async for c in app.astream({"messages": [Message.text_message("again")]}, {"thread_id": "smoke-2"})]
        check(any(c.message is not None and c.message.text() == "done" for c in chunks), "astream")
        await cp.arelease()


def main() -> None:
    installed_here(abi3="--abi3" in sys.argv[1:])
    work = Path(tempfile.mkdtemp(prefix="tenxgraph-smoke-"))
    db = work / "smoke.db"
    asyncio.run(runs(db))
    snap = metrics.snapshot()
    check(snap["tenxgraph.tool.replayed"] >= 2 and snap["tenxgraph.ledger.hits"] >= 2, "metrics.snapshot()")
    for extra in ("prometheus", "otel"):
        try:
            __import__(f"tenxgraph.contrib.{extra}")
            print(f"ok  tenxgraph.contrib.{extra} (its extra is installed)")
        except ImportError as exc:
            check(f"10xgraph[{extra}]" in str(exc), f"tenxgraph.contrib.{extra} names its extra when missing")
    script = Path(sys.executable).parent / "tenxgraph"
    out = subprocess.run([str(script), "--sqlite", str(db), "--json", "threads", "list"],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode == 0 and {t["thread_id"] for t in json.loads(out.stdout)} == {"smoke-1", "smoke-2"},
          "the tenxgraph console script lists the threads")
    out = subprocess.run([sys.executable, "-I", "-m", "tenxgraph", "--sqlite", str(db), "ledger", "smoke-1", "--json"],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode == 0 and json.loads(out.stdout)[0]["tool"] == "charge", "python -m tenxgraph ledger")
    out = subprocess.run([str(script), "--sqlite", str(db), "threads", "show", "missing"],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode == 3 and "not found" in out.stderr, "an unknown thread exits 3")
    print("wheel smoke test passed")


if __name__ == "__main__":
    main()
