"""Routing out of START, differential against 10xGraph 0.10.0 (helper compatibility pass,
session 33). 10xGraph runs START as a node and routes out of it like any node: conditional
edges first, then its fixed edge; a route back to START goes through START's edges again. Ours
started every turn at the fixed entry: ``add_conditional_edges(START, ...)`` next to
``set_entry_point`` was ignored (the wrong first node ran, without a word), and a route to START
failed at run time after its node had run, on every retry."""

from __future__ import annotations

import pytest

from tenxgraph import END, START, Message, StateGraph
from tenxgraph.core.exceptions import GraphError
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

SCRIPT = """
import asyncio
from tenxgraph import END, START, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


def said(text):
    def node(state):
        return Message.text_message(text, role="assistant", message_id=f"{text}{len(state.context)}")
    return node


def route_first(g):  # the usual way to choose the first node by the input
    g.add_node("a", said("a")); g.add_node("b", said("b"))
    g.set_entry_point("a")
    g.add_conditional_edges(START, lambda s: "y" if "b" in s.context[-1].text() else "x", {"x": "a", "y": "b"})
    g.add_edge("a", END); g.add_edge("b", END)


def first_by_name(g):  # a condition without a path map names the node
    g.add_node("a", said("a")); g.add_node("b", said("b"))
    g.set_entry_point("a")
    g.add_conditional_edges(START, lambda s: "b" if "b" in s.context[-1].text() else "a")
    g.add_edge("a", END); g.add_edge("b", END)


def straight_to_end(g):
    g.add_node("a", said("a"))
    g.set_entry_point("a")
    g.add_conditional_edges(START, lambda s: END if "skip" in s.context[-1].text() else "a")
    g.add_edge("a", END)


def back_to_start(g):
    g.add_node("loop", said("f"))
    g.add_edge(START, "loop")
    g.add_conditional_edges("loop", lambda s: "again" if len(s.context) < 3 else "done",
                            {"again": START, "done": END})


def back_to_start_by_edge(g):
    g.add_node("a", said("a")); g.add_node("b", said("b"))
    g.set_entry_point("a")
    g.add_conditional_edges(START, lambda s: "b" if len(s.context) >= 2 else "a")
    g.add_edge("a", START)
    g.add_edge("b", END)


async def turns(build, texts):
    fresh_container()
    g = StateGraph()
    build(g)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    out = []
    for i, text in enumerate(texts):
        r = await app.ainvoke({"messages": [Message.text_message(text, message_id=f"u{i}")]}, {"thread_id": "t"})
        out.append([m.message_id for m in r["messages"]])
    return out


async def main():
    emit({
        "route_first": await turns(route_first, ["go to b", "go to a", "b again"]),
        "first_by_name": await turns(first_by_name, ["a please", "b please"]),
        "straight_to_end": await turns(straight_to_end, ["skip", "now a"]),
        "back_to_start": await turns(back_to_start, ["hi"]),
        "back_to_start_by_edge": await turns(back_to_start_by_edge, ["hi"]),
    })

asyncio.run(main())
"""


def test_routing_out_of_and_back_to_start_is_10xgraphs(oracle) -> None:
    theirs, ours = oracle.run_both(SCRIPT)
    assert ours == theirs
    # Not vacuous: the conditions chose other nodes than the fixed entry.
    assert theirs["route_first"][0][-1].startswith("b")


def _two_start_edges() -> StateGraph:
    g = StateGraph()
    g.add_node("a", lambda s: Message.text_message("a", role="assistant"))
    g.add_node("b", lambda s: Message.text_message("b", role="assistant"))
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    g.add_edge("a", END)
    g.add_edge("b", END)
    return g


def test_two_fixed_edges_out_of_start_are_refused_at_compile() -> None:
    """As for any other node (GRAPH_005): 10xGraph follows the first and never the second."""
    with pytest.raises(GraphError) as err:
        _two_start_edges().compile(checkpointer=InMemoryCheckpointer())
    assert err.value.error_code == "GRAPH_005"


@pytest.mark.asyncio
async def test_a_start_condition_that_fails_refuses_the_turn_with_nothing_written() -> None:
    def boom(state):
        raise RuntimeError("no route")

    g = StateGraph()
    g.add_node("a", lambda s: Message.text_message("a", role="assistant"))
    g.set_entry_point("a")
    g.add_conditional_edges(START, boom)
    g.add_edge("a", END)
    cp = InMemoryCheckpointer()
    app = g.compile(checkpointer=cp)
    with pytest.raises(GraphError) as err:
        await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t"})
    assert err.value.error_code == "GRAPH_ROUTING_001"
    assert await cp.aget_state({"thread_id": "t"}) is None
    with pytest.raises(GraphError) as err:
        g2 = StateGraph()
        g2.add_node("a", lambda s: Message.text_message("a", role="assistant"))
        g2.set_entry_point("a")
        g2.add_conditional_edges(START, lambda s: "nowhere")
        g2.add_edge("a", END)
        await g2.compile(checkpointer=cp).ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t2"})
    assert err.value.error_code == "GRAPH_ROUTING_002"
    assert await cp.aget_state({"thread_id": "t2"}) is None
