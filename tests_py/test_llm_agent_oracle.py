"""Differential: the quick start (ReactAgent) on 10xGraph 0.10.0 and on tenxgraph, each through its
own OpenAI path and the real SDK, against the same scripted stand-in. The requests the model gets
and the messages the caller gets must match (ids aside: a user message's id is random)."""

from __future__ import annotations

import os

import pytest

from tenxgraph.testing.providers import OpenAIStandIn

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
    model="openai/gpt-4o-mini",
    system_prompt=[{"role": "system", "content": "You are a support agent for an online store."}],
    tools=[lookup_order, refund_order],
).compile(checkpointer=InMemoryCheckpointer())


async def main():
    config = {"thread_id": "1"}
    r1 = await app.ainvoke({"messages": [Message.text_message("Order A-1001 arrived broken, please refund it.")]},
                           config=config)
    r2 = await app.ainvoke({"resume": {"approved": True}}, config)
    return r1, r2


def view(m):
    d = m.model_dump(mode="json")
    for k in ("timestamp", "raw"):
        d.pop(k, None)
    if m.role != "assistant":
        d.pop("message_id")  # random
    return d


r1, r2 = asyncio.run(main())
emit({"first": [view(m) for m in r1["messages"]], "second": [view(m) for m in r2["messages"]],
      "usage": [r1["token_usage"], r2["token_usage"]]})
"""

SYNC_TWICE = """
from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import ReactAgent
app = ReactAgent(model="openai/gpt-4o-mini", system_prompt=[{"role": "system", "content": "hi"}]).compile()
out = []
for text in ("a", "b"):
    try:
        out.append(app.invoke({"messages": [Message.text_message(text)]}, {"thread_id": "s"})["messages"][-1].text())
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
emit(out)
"""


def _script(llm: OpenAIStandIn) -> None:
    llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
    llm.reply_tool_calls(("refund_order", {"order_id": "A-1001", "amount": 42.0}))
    llm.reply_text("Refunded $42.0 for order A-1001.")


def _oracle_has_openai(oracle) -> None:
    probe = oracle.run_theirs("import importlib.util as u\nemit(u.find_spec('openai') is not None)")
    if not probe:
        pytest.skip("the 10xGraph venv has no openai SDK: "
                    f"{oracle.python} -m pip install openai")


def test_quick_start_same_requests_and_messages(oracle) -> None:
    _oracle_has_openai(oracle)
    runs = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn(id_prefix="oracle") as llm:
            _script(llm)
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            runs[side] = (run(QUICK_START, env=llm.env), [r.body for r in llm.requests])
    (theirs, their_requests), (ours, our_requests) = runs["theirs"], runs["ours"]
    assert len(their_requests) == 3
    assert our_requests == their_requests
    assert ours == theirs


def test_sync_invoke_twice(oracle) -> None:
    """10xGraph 0.10's sync invoke fails the second call of an OpenAI agent ('Event loop is
    closed': its SDK client outlives the loop of the first call). Ours answers both."""
    _oracle_has_openai(oracle)
    results = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn() as llm:
            llm.reply_text("one")
            llm.reply_text("two")
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            results[side] = run(SYNC_TWICE, env=llm.env)
    assert results["ours"] == ["one", "two"]
    assert results["theirs"][0] == "one" and "Event loop is closed" in results["theirs"][1]


STREAM = """
import asyncio
from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


def lookup_order(order_id: str) -> str:
    \"\"\"Look up an order by id.\"\"\"
    return f"order {order_id}: delivered"


app = ReactAgent(model="openai/gpt-4o-mini", system_prompt=[{"role": "system", "content": "S"}],
                 tools=[lookup_order]).compile(checkpointer=InMemoryCheckpointer())


async def main():
    out = []
    async for c in app.astream({"messages": [Message.text_message("Where is A-1001?")]}, {"thread_id": "2"}):
        m = c.message
        if m is not None and m.role != "user":
            out.append({"role": m.role, "delta": m.delta, "text": m.text(), "calls": m.tools_calls or None,
                        "node": (c.metadata or {}).get("node")})
    return out

emit(asyncio.run(main()))
"""


def _stream_both(oracle, script_replies) -> dict:
    out = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn() as llm:
            script_replies(llm)
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            out[side] = (run(STREAM, env=llm.env), [r.body for r in llm.requests])
    return out


def test_streamed_text_turn_same_deltas_and_message(oracle) -> None:
    _oracle_has_openai(oracle)
    runs = _stream_both(oracle, lambda llm: llm.reply_text("It was delivered yesterday.", pieces=3))
    (theirs, their_requests), (ours, our_requests) = runs["theirs"], runs["ours"]
    assert their_requests[0]["stream"] is True and our_requests[0]["stream"] is True

    def deltas(chunks):  # 10xGraph also yields empty deltas (the role and finish chunks); we do not
        return [c["text"] for c in chunks if c["delta"] and c["text"]]

    def finals(chunks):
        return [(c["role"], c["text"], c["calls"]) for c in chunks if not c["delta"]]

    assert deltas(ours) == deltas(theirs) == ["It was de", "livered y", "esterday."]
    assert finals(ours) == finals(theirs) == [("assistant", "It was delivered yesterday.", None)]
    assert all(c["node"] == "MAIN" for c in ours + theirs)


def test_streamed_tool_call_in_pieces(oracle) -> None:
    """OpenAI streams a tool call as its id and name, then its arguments in pieces. 10xGraph 0.10
    keeps only a call whose id and complete arguments come in one chunk, so it loses the call and
    the turn ends without running the tool; we put it back together and run it."""
    _oracle_has_openai(oracle)

    def script(llm):
        llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
        llm.reply_text("Delivered.")

    runs = _stream_both(oracle, script)
    (theirs, their_requests), (ours, our_requests) = runs["theirs"], runs["ours"]
    assert len(their_requests) == 1 and [c["calls"] for c in theirs if not c["delta"]] == [None]
    assert len(our_requests) == 2
    assert [(c["role"], c["text"]) for c in ours if not c["delta"]] == [
        ("assistant", ""), ("tool", "order A-1001: delivered"), ("assistant", "Delivered.")]
    assert our_requests[1]["messages"][-1] == {"role": "tool", "content": "order A-1001: delivered",
                                               "tool_call_id": "call_1"}


OWN_GRAPH = QUICK_START.replace('''app = ReactAgent(
    model="openai/gpt-4o-mini",
    system_prompt=[{"role": "system", "content": "You are a support agent for an online store."}],
    tools=[lookup_order, refund_order],
).compile(checkpointer=InMemoryCheckpointer())''', '''from tenxgraph.core.graph import Agent, StateGraph, ToolNode
from tenxgraph.core.state import AgentState
from tenxgraph.utils.constants import END

graph = StateGraph()
graph.add_node("MAIN", Agent(
    model="openai/gpt-4o-mini",
    system_prompt=[{"role": "system", "content": "You are a support agent for an online store."}],
    tool_node="TOOL",
))
graph.add_node("TOOL", ToolNode([lookup_order, refund_order]))


def route(state: AgentState) -> str:
    if state.context and state.context[-1].tools_calls:
        return "TOOL"
    return END


graph.add_conditional_edges("MAIN", route, {"TOOL": "TOOL", END: END})
graph.add_edge("TOOL", "MAIN")
graph.set_entry_point("MAIN")
app = graph.compile(checkpointer=InMemoryCheckpointer())''')


def test_own_graph_same_requests_and_messages(oracle) -> None:
    assert OWN_GRAPH != QUICK_START
    _oracle_has_openai(oracle)
    runs = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn(id_prefix="oracle") as llm:
            _script(llm)
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            runs[side] = (run(OWN_GRAPH, env=llm.env), [r.body for r in llm.requests])
    assert len(runs["theirs"][1]) == 3
    assert runs["ours"] == runs["theirs"]


STRUCTURED_AND_NO_KEY = """
import asyncio, os
from pydantic import BaseModel
from tenxgraph.core.graph import Agent, StateGraph
from tenxgraph.core.state import Message
from tenxgraph.utils.constants import END


class Verdict(BaseModel):
    refund: bool
    reason: str


g = StateGraph()
g.add_node("MAIN", Agent(model="gpt-4o-mini", output_schema=Verdict, retry_config=False))
g.set_entry_point("MAIN")
g.add_edge("MAIN", END)
app = g.compile()


async def main():
    try:
        out = await app.ainvoke({"messages": [Message.text_message("Refund?")]}, {"thread_id": "so"})
        return {"parsed": repr(out["messages"][-1].parsed_content)}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}

r = asyncio.run(main())
os.environ.pop("OPENAI_API_KEY")
try:
    Agent(model="gpt-4o-mini")
    r["no_key"] = "constructed"
except Exception as e:
    r["no_key"] = type(e).__name__
    r["no_key_code"] = getattr(e, "error_code", None)
emit(r)
"""


def test_structured_output_and_a_missing_key(oracle) -> None:
    """With the openai SDK installed here, 10xGraph 0.10's structured output fails before any
    request (it passes ``stream=`` to ``parse``); ours parses. Without a key both refuse at
    construction: 10xGraph with the SDK's untyped OpenAIError, ours with LLM_CONFIG_001."""
    _oracle_has_openai(oracle)
    out = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn() as llm:
            llm.reply_json({"refund": True, "reason": "broken"})
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            out[side] = (run(STRUCTURED_AND_NO_KEY, env=llm.env), len(llm.requests))
    (theirs, their_requests), (ours, our_requests) = out["theirs"], out["ours"]
    assert ours["parsed"] == "Verdict(refund=True, reason='broken')" and our_requests == 1
    assert "unexpected keyword argument 'stream'" in theirs["error"] and their_requests == 0
    assert theirs["no_key"] == "OpenAIError"
    assert (ours["no_key"], ours["no_key_code"]) == ("ModelConfigError", "LLM_CONFIG_001")


PARALLEL = """
import asyncio
from tenxgraph.core.state import AgentState, Message
from tenxgraph.prebuilt.agent import ReactAgent
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


class Trip(AgentState):
    traveller: str = "Ada"


def weather(city: str) -> str:
    \"\"\"Current weather for a city.\"\"\"
    return f"sunny in {city}"


def local_time(city: str, twenty_four_hours: bool = True) -> str:
    \"\"\"The local time in a city.\"\"\"
    return f"14:00 in {city}"


app = ReactAgent(model="gpt-4o-mini", state=Trip(), temperature=0.1,
                 system_prompt=[{"role": "system", "content": "You help {traveller} travel."}],
                 tools=[weather, local_time]).compile(checkpointer=InMemoryCheckpointer())


def view(m):
    d = m.model_dump(mode="json")
    for k in ("timestamp", "raw"):
        d.pop(k, None)
    if m.role != "assistant":
        d.pop("message_id")
    return d


async def main():
    out = []
    for text in ("Weather and time in Oslo?", "And in Rome?"):
        r = await app.ainvoke({"messages": [Message.text_message(text)]}, {"thread_id": "p"})
        out.append([view(m) for m in r["messages"]])
    return out

emit(asyncio.run(main()))
"""


def test_parallel_calls_state_prompt_and_two_turns(oracle) -> None:
    _oracle_has_openai(oracle)
    runs = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn(id_prefix="par") as llm:
            for city in ("Oslo", "Rome"):
                llm.reply_tool_calls(("weather", {"city": city}), ("local_time", {"city": city}))
                llm.reply_text(f"{city}: sunny, 14:00.")
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            runs[side] = (run(PARALLEL, env=llm.env), [r.body for r in llm.requests])
    (theirs, their_requests), (ours, our_requests) = runs["theirs"], runs["ours"]
    assert len(their_requests) == 4
    assert their_requests[0]["messages"][0] == {"role": "system", "content": "You help Ada travel."}
    assert our_requests == their_requests
    assert ours == theirs


def test_quick_start_on_the_responses_api(oracle) -> None:
    """The quick start with ``api_style="responses"``: the same Responses requests, the same messages."""
    _oracle_has_openai(oracle)
    script = QUICK_START.replace('model="openai/gpt-4o-mini",', 'model="openai/gpt-4o-mini", api_style="responses",')
    assert script != QUICK_START
    runs = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn(id_prefix="resp") as llm:
            _script(llm)
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            runs[side] = (run(script, env=llm.env), [(r.path, r.body) for r in llm.requests])
    (theirs, their_requests), (ours, our_requests) = runs["theirs"], runs["ours"]
    assert [p for p, _ in their_requests] == ["/v1/responses"] * 3
    assert our_requests == their_requests
    assert ours == theirs


def test_streamed_responses_turn_with_a_tool_call(oracle) -> None:
    _oracle_has_openai(oracle)
    script = STREAM.replace('model="openai/gpt-4o-mini",', 'model="openai/gpt-4o-mini", api_style="responses",')
    assert script != STREAM
    out = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn() as llm:
            llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
            llm.reply_text("It was delivered yesterday.", pieces=3)
            run = oracle.run_theirs if side == "theirs" else oracle.run_ours
            out[side] = (run(script, env=llm.env), [(r.path, r.body) for r in llm.requests])
    (theirs, their_requests), (ours, our_requests) = out["theirs"], out["ours"]
    assert our_requests == their_requests and len(our_requests) == 2

    def deltas(chunks):
        return [c["text"] for c in chunks if c["delta"] and c["text"]]

    def finals(chunks):
        return [(c["role"], c["text"], c["calls"]) for c in chunks if not c["delta"]]

    assert deltas(ours) == deltas(theirs) == ["It was de", "livered y", "esterday."]
    assert finals(ours) == finals(theirs)
    assert finals(ours)[0][2][0]["function"] == {"name": "lookup_order", "arguments": '{"order_id": "A-1001"}'}
