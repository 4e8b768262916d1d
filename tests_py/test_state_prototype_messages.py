"""Messages in the state prototype (``StateGraph(AgentState(context=[system prompt]))``) are a new
thread's first messages: stored with its input, seen by every later turn, by any worker. They
were counted as stored and never written: the first turn's nodes saw the system prompt, every
later turn (loaded from the store) ran without it, and ``aget_state`` lacked it (differential
red-team, session 38). Each thread gets them under ids of its own (a message id names one
message of one thread in the store; 10xGraph keeps the prototype's ids)."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph

SCRIPT = """
import asyncio
from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

seen = []

def answer(state):
    seen.append([(m.role, m.text()) for m in state.context])
    return Message.text_message(f"answer {len(seen)}", role="assistant")

def build(cp):
    fresh_container()
    proto = AgentState(context=[Message.text_message("You are terse.", role="system")])
    g = StateGraph(proto)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=cp)

async def main():
    cp = InMemoryCheckpointer()
    out = {}
    for thread in ("t1", "t2"):
        returned = []
        for word in ("hi", "again"):
            r = await build(cp).ainvoke({"messages": [Message.text_message(word)]}, {"thread_id": thread})
            returned.append([(m.role, m.text()) for m in r["messages"]])
        stored = await cp.aget_state({"thread_id": thread})
        out[thread] = {"returned": returned, "stored": [(m.role, m.text()) for m in stored.context]}
    out["seen"] = seen
    emit(out)

asyncio.run(main())
"""


def test_the_prototypes_messages_are_stored_and_seen_as_10xgraph_does(oracle: Any) -> None:
    theirs, ours = oracle.run_both(SCRIPT)
    assert ours == theirs
    # What the test is about, on both sides: the second turn (a graph compiled again, as another
    # worker would) still starts with the system prompt.
    assert theirs["seen"][1][0] == ["system", "You are terse."]
    assert theirs["t2"]["stored"][0] == ["system", "You are terse."]


def _graph(checkpointer: Any, seen: list[list[str]]) -> Any:
    def answer(state: AgentState) -> Message:
        seen.append([m.role for m in state.context])
        return Message.text_message("ok", role="assistant")

    g = StateGraph(AgentState(context=[Message.text_message("You are terse.", role="system")]))
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
async def test_every_thread_stores_the_prototypes_messages_under_ids_of_its_own(checkpointer: Any,
                                                                                make_thread: Any) -> None:
    seen: list[list[str]] = []
    threads = [make_thread(), make_thread()]
    for thread in threads:
        for word in ("hi", "again"):
            await _graph(checkpointer, seen).ainvoke({"messages": [Message.text_message(word)]}, {"thread_id": thread})
    assert seen == [["system", "user"], ["system", "user", "assistant", "user"]] * 2
    firsts = []
    for thread in threads:
        stored = await checkpointer.aget_state({"thread_id": thread})
        assert [m.role for m in stored.context] == ["system", "user", "assistant", "user", "assistant"]
        firsts.append(stored.context[0].message_id)
        listed = await checkpointer.alist_messages({"thread_id": thread})
        assert [m.role for m in listed][:2] == ["system", "user"]
    assert firsts[0] != firsts[1]
