"""Differential: 10xGraph's quick start on a Claude model and on the README's Gemini model, run on
10xGraph 0.10.0 and on tenxgraph, each through the real SDK against the same scripted stand-in.
The requests the model gets and the messages the caller gets must match (ids aside: a user
message's id is random, and so is a Gemini tool call's, on both sides)."""

from __future__ import annotations

import pytest

from tenxgraph.testing.providers import AnthropicStandIn, GoogleStandIn

QUICK_START = """
import asyncio
from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils import interrupt


def lookup_order(order_id: str) -> str:
    \"\"\"Look up an order by id.\"\"\"
    return f"order {order_id}: delivered, total 42.00"


def refund_order(order_id: str, amount: float) -> str:
    \"\"\"Refund an order. Requires approval.\"\"\"
    decision = interrupt({"amount": amount}, message=f"Refund ${amount}?")
    if not decision.get("approved"):
        return "Refund declined by reviewer."
    return f"Refunded ${amount} for order {order_id}."


app = ReactAgent(
    model=MODEL,
    system_prompt=[{"role": "system", "content": "You are a support agent for an online store."}],
    tools=[lookup_order, refund_order],
).compile(checkpointer=InMemoryCheckpointer())


async def main():
    config = {"thread_id": "1"}
    r1 = await app.ainvoke({"messages": [Message.text_message("Order A-1001 arrived broken, please refund it.")]},
                           config=config)
    r2 = await app.ainvoke({"resume": {"approved": True}}, config)
    return r1, r2


ids = {}


def rename(value):
    if isinstance(value, dict):
        return {k: rename(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rename(v) for v in value]
    return ids.get(value, value) if isinstance(value, str) else value


def view(m):
    for call in m.tools_calls or []:
        ids.setdefault(call["id"], f"call-{len(ids) + 1}")
    d = m.model_dump(mode="json")
    for k in ("timestamp", "raw"):
        d.pop(k, None)
    if m.role != "assistant":
        d.pop("message_id")  # random
    return rename(d) if RENAME_IDS else d


r1, r2 = asyncio.run(main())
emit({"first": [view(m) for m in r1["messages"]], "second": [view(m) for m in r2["messages"]],
      "usage": [r1["token_usage"], r2["token_usage"]]})
"""

CASES = {
    "claude": (AnthropicStandIn, "anthropic/claude-sonnet-4-5", "anthropic", False),
    "gemini": (GoogleStandIn, "gemini/gemini-2.5-flash", "google.genai", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_quick_start_same_requests_and_messages(oracle, case: str) -> None:
    stand_in, model, sdk, rename_ids = CASES[case]
    probe = oracle.run_theirs(f"import importlib.util as u\nemit(u.find_spec({sdk!r}) is not None)")
    if not probe:
        pytest.skip(f"the 10xGraph venv has no {sdk} SDK: {oracle.python} -m pip install anthropic google-genai")
    script = f"MODEL = {model!r}\nRENAME_IDS = {rename_ids!r}\n" + QUICK_START
    runs = {}
    for side in ("theirs", "ours"):
        with stand_in(id_prefix="oracle") as llm:
            llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}, "toolu_1"))
            llm.reply_tool_calls(("refund_order", {"order_id": "A-1001", "amount": 42.0}, "toolu_2"))
            llm.reply_text("Refunded $42.0 for order A-1001.")
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            runs[side] = (run(script, env=llm.env), [(r.path, r.body) for r in llm.requests])
    (theirs, their_requests), (ours, our_requests) = runs["theirs"], runs["ours"]
    assert len(their_requests) == 3
    assert our_requests == their_requests
    assert ours == theirs


STREAM = """
import asyncio
from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


def lookup_order(order_id: str) -> str:
    \"\"\"Look up an order by id.\"\"\"
    return f"order {order_id}: delivered"


app = ReactAgent(model=MODEL, system_prompt=[{"role": "system", "content": "S"}],
                 tools=[lookup_order]).compile(checkpointer=InMemoryCheckpointer())
ids = {}


async def main():
    out = []
    async for c in app.astream({"messages": [Message.text_message("Where is A-1001?")]}, {"thread_id": "2"}):
        m = c.message
        if m is None or m.role == "user":
            continue
        calls = []
        for call in m.tools_calls or []:
            ids.setdefault(call["id"], f"call-{len(ids) + 1}")
            calls.append({**call, "id": ids[call["id"]]})
        out.append({"role": m.role, "delta": m.delta, "text": m.text(), "calls": calls or None,
                    "node": (c.metadata or {}).get("node")})
    return out

emit(asyncio.run(main()))
"""


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_tool_turn_same_deltas_and_messages(oracle, case: str) -> None:
    stand_in, model, sdk, _ = CASES[case]
    if not oracle.run_theirs(f"import importlib.util as u\nemit(u.find_spec({sdk!r}) is not None)"):
        pytest.skip(f"the 10xGraph venv has no {sdk} SDK")
    runs = {}
    for side in ("theirs", "ours"):
        with stand_in(id_prefix="oracle") as llm:
            llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}, "toolu_1"))
            llm.reply_text("It was delivered yesterday.", pieces=3)
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            runs[side] = (run(f"MODEL = {model!r}\n" + STREAM, env=llm.env),
                          [(r.path, r.body) for r in llm.requests])
    (theirs, their_requests), (ours, our_requests) = runs["theirs"], runs["ours"]
    assert len(their_requests) == 2 and our_requests == their_requests

    def deltas(chunks):  # text deltas (10xGraph also yields some empty ones)
        return [c["text"] for c in chunks if c["delta"] and c["text"]]

    def finals(chunks):
        return [(c["role"], c["text"], c["calls"]) for c in chunks if not c["delta"]]

    assert deltas(ours) == deltas(theirs) == ["It was de", "livered y", "esterday."]
    assert finals(ours) == finals(theirs)
    assert [f[0] for f in finals(ours)] == ["assistant", "tool", "assistant"]
    shown = [c for c in ours + theirs if c["role"] == "assistant" and (not c["delta"] or c["text"])]
    assert shown and all(c["node"] == "MAIN" for c in shown)
