"""A node that rewrites the history (trims it and sets ``context_summary``, deletes, reorders,
replaces a message) and appends its reply: the reply is the node's output, returned by
``ainvoke``, streamed, and handed to the hooks (helper red-team, session 37).

It was reported as nothing: the run took a history that no longer started as it did for an
edit, and an edit adds nothing; and a summary put in place of the first message, with the last
one left where it was, was never reported (the check looked at the last message only); and a
message appended under an id the context held, or two under one id, were reported. ``ainvoke`` answered with the user's message alone on every turn
of the usual summarising node, while the reply was stored. 10xGraph reports the messages whose ids
the context did not hold before the node (its ``process_node_result``), which this test compares.
"""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.utils import Command

SCRIPT = """
import asyncio
from tenxgraph import END, START, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils import Command

def reply(state, text):
    state.context.append(Message.text_message(text, role="assistant", message_id=f"r{len(state.context)}-{text}"))

def trim(state):
    if len(state.context) > 2:
        state.context_summary = "s"
        state.context = state.context[-2:]
    reply(state, "trimmed")
    return state

def delete_first(state):
    if len(state.context) > 1:
        del state.context[0]
    reply(state, "deleted")
    return state

def reverse(state):
    state.context.reverse()
    reply(state, "reversed")
    return state

def replace_first(state):
    first = state.context[0]
    state.context[0] = Message.text_message("edited " + first.text(), role=first.role, message_id=first.message_id)
    reply(state, "replaced")
    return state

def command_state(state):
    state.context = state.context[-1:]
    reply(state, "cmd")
    return Command(update=state)

def summary_in_place(state):
    # The oldest message becomes a summary under a new id; the last one stays where it was.
    if len(state.context) > 2:
        state.context[0] = Message.text_message("summary", role="system", message_id=f"sum{len(state.context)}")
    reply(state, "summed")
    return state

def insert_in_middle(state):
    state.context.insert(len(state.context) // 2, Message.text_message("note", role="system",
                                                                          message_id=f"n{len(state.context)}"))
    if len(state.context) > 3:
        del state.context[0]
    reply(state, "inserted")
    return state

def two_under_one_id(state):
    state.context.append(Message.text_message("a", role="assistant", message_id=f"x{len(state.context)}"))
    state.context.append(Message.text_message("b", role="assistant", message_id=f"x{len(state.context) - 1}"))
    return state

def under_a_held_id(state):
    state.context.append(Message.text_message("dup", role="assistant", message_id=state.context[-1].message_id))
    reply(state, "after-dup")
    return state

def replace_by_new_id(state):
    state.context[0] = Message.text_message("new first", role="user", message_id="fresh-first")
    return state

async def run(node):
    fresh_container()
    g = StateGraph()
    g.add_node("n", node)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    out = []
    for i in range(3):
        r = await app.ainvoke({"messages": [Message.text_message(f"u{i}", message_id=f"u{i}")]}, {"thread_id": "t"})
        out.append([m.text() for m in r["messages"]])
    return out

async def main():
    emit({node.__name__: await run(node)
          for node in (trim, delete_first, reverse, replace_first, command_state, replace_by_new_id,
                       summary_in_place, insert_in_middle, two_under_one_id, under_a_held_id)})

asyncio.run(main())
"""


def test_the_reply_of_a_node_that_rewrote_the_history_is_reported_as_10xgraph_reports_it(oracle) -> None:
    theirs, ours = oracle.run_both(SCRIPT)
    assert ours == theirs
    assert theirs["trim"][1] == ["u1", "trimmed"]  # the cases the test is for, on both sides
    assert theirs["summary_in_place"][1] == ["u1", "summary", "summed"]


def _summarising_graph(checkpointer: Any, *, by_command: bool) -> Any:
    def summarise(state: AgentState) -> Any:
        if len(state.context) > 2:
            state.context_summary = " / ".join(m.text() for m in state.context[:-2])
            state.context = state.context[-2:]
        state.context.append(Message.text_message(f"reply to {state.context[-1].text()}", role="assistant"))
        return Command(update=state) if by_command else state

    g = StateGraph(AgentState)
    g.add_node("bot", summarise)
    g.add_edge(START, "bot")
    g.add_edge("bot", END)
    return g.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
@pytest.mark.parametrize("by_command", [False, True], ids=["state", "command"])
async def test_a_summarising_nodes_reply_is_returned_and_streamed(checkpointer: Any, make_thread: Any,
                                                                  by_command: bool) -> None:
    app = _summarising_graph(checkpointer, by_command=by_command)
    cfg = {"thread_id": make_thread()}
    for word in ("one", "two", "three"):
        out = await app.ainvoke({"messages": [Message.text_message(word)]}, dict(cfg))
        assert [m.text() for m in out["messages"]] == [word, f"reply to {word}"]
    streamed = [c.message.text() async for c in app.astream({"messages": [Message.text_message("four")]}, dict(cfg))
                if getattr(c, "message", None) is not None]
    assert "reply to four" in streamed
    stored = await checkpointer.aget_state(dict(cfg))
    assert [m.text() for m in stored.context] == ["reply to three", "four", "reply to four"]
    assert stored.context_summary == "reply to two / three"


@pytest.mark.asyncio
async def test_a_message_replaced_by_id_with_a_tombstone_is_replaced(checkpointer: Any, make_thread: Any) -> None:
    """``[RemoveMessage(x), Message(id=x)]`` from a node: tombstones apply in order, as in
    ``add_messages``, so x is replaced. The new message was deduplicated against the tombstone and
    dropped: x was deleted. The tombstone itself is an edit, not a message of the turn."""
    from tenxgraph.core.state.reducers import REMOVE_ALL_MESSAGES, RemoveMessage, add_messages

    def correct(state: AgentState) -> list[Message]:
        typo = state.context[0].message_id
        return [RemoveMessage(message_id=typo), Message.text_message("corrected", message_id=typo),
                Message.text_message("ok", role="assistant")]

    def restart(state: AgentState) -> list[Message]:
        typo = state.context[0].message_id
        return [RemoveMessage(message_id=REMOVE_ALL_MESSAGES), Message.text_message("fresh", message_id=typo),
                Message.text_message("ok", role="assistant")]

    for node, want in ((correct, ["corrected", "ok"]), (restart, ["fresh", "ok"])):
        g = StateGraph(AgentState)
        g.add_node("n", node)
        g.add_edge(START, "n")
        g.add_edge("n", END)
        app = g.compile(checkpointer=checkpointer)
        cfg = {"thread_id": make_thread(node.__name__)}
        typo = Message.text_message("typo")  # ids are unique across threads on Postgres
        out = await app.ainvoke({"messages": [typo]}, dict(cfg))
        stored = await checkpointer.aget_state(dict(cfg))
        assert [m.text() for m in stored.context] == want
        assert want == [m.text() for m in add_messages([typo], node(AgentState(context=[typo])))]
        assert [type(m).__name__ for m in out["messages"]] == ["Message"] * 3
