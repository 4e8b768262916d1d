"""``StateGraph(id_generator=...)``: the graph's generator names the messages made in its runs.

10xGraph binds the generator in its process-wide container, so the last graph constructed names
every message of the process, in every graph's runs. Pinned here: with one graph, ids inside and
outside its runs are 10xGraph's (differential test); with two graphs, each one's runs (their
nodes, sync nodes in threads, tools) get that graph's generator, whichever graph was constructed
last, while code outside any run keeps the process-wide one (the last installed, as in 10xGraph).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.state.message import generate_id, set_id_generator
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils.id_generator import BaseIDGenerator

ONE_GRAPH = """
import asyncio, itertools
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.core.state.message import generate_id
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils import END
from tenxgraph.utils.id_generator import BaseIDGenerator

class Prefixed(BaseIDGenerator):
    def __init__(self, prefix):
        self.prefix, self.n = prefix, itertools.count(1)
    @property
    def id_type(self):
        return "string"
    def generate(self):
        return f"{self.prefix}-{next(self.n)}"

def model(state: AgentState):
    return [Message.text_message("reply", role="assistant")]

g = StateGraph(id_generator=Prefixed("a"))
g.add_node("model", model); g.set_entry_point("model"); g.add_edge("model", END)
app = g.compile(checkpointer=InMemoryCheckpointer())
before = generate_id(None)
r = asyncio.run(app.ainvoke({"messages": [Message.text_message("hi", message_id="in-1")]}, config={"thread_id": "t"}))
emit({"before": before, "ids": [m.message_id for m in r["messages"]], "after": generate_id(None)})
"""


@pytest.mark.asyncio
async def test_one_graph_names_messages_as_10xgraph_does(oracle: Any) -> None:
    theirs, ours = oracle.run_both(ONE_GRAPH)
    # The generator names every message, the input's too (its value wins over an explicit id).
    assert theirs["before"] == "a-1" and all(str(i).startswith("a-") for i in theirs["ids"])
    assert ours == theirs


class Prefixed(BaseIDGenerator):
    def __init__(self, prefix: str) -> None:
        self.prefix, self.n = prefix, itertools.count(1)

    @property
    def id_type(self) -> str:
        return "string"

    def generate(self) -> str:
        return f"{self.prefix}-{next(self.n)}"


def two_node_graph(prefix: str) -> Any:
    """An async node, a sync node (run in a thread) and a tool, each making a message without an id."""

    async def ask(state: AgentState) -> list[Message]:
        reply = Message.text_message("calling", role="assistant")
        reply.tools_calls = [{"id": f"call-{prefix}", "type": "function",
                              "function": {"name": "note", "arguments": "{}"}}]
        return [reply]

    def note() -> Message:
        return Message.text_message("from the tool", role="tool")

    def close(state: AgentState) -> list[Message]:
        return [Message.text_message("done", role="assistant")]

    g = StateGraph(AgentState, id_generator=Prefixed(prefix))
    g.add_node("ask", ask)
    g.add_node("tools", ToolNode([note]))
    g.add_node("close", close)
    g.add_edge(START, "ask")
    g.add_edge("ask", "tools")
    g.add_edge("tools", "close")
    g.add_edge("close", END)
    return g.compile(checkpointer=InMemoryCheckpointer())


@pytest.mark.asyncio
async def test_two_graphs_name_their_own_messages() -> None:
    try:
        a = two_node_graph("a")
        b = two_node_graph("b")  # constructed last: the process-wide generator
        for app, prefix in ((a, "a"), (b, "b"), (a, "a")):
            r = await app.ainvoke({"messages": [Message.text_message("hi", message_id=f"in-{prefix}")]},
                                  {"thread_id": f"t-{prefix}-{id(app)}-{asyncio.get_running_loop().time()}"})
            made = [m.message_id for m in r["messages"]][1:]
            assert len(made) == 3 and all(str(i).startswith(f"{prefix}-") for i in made), (prefix, made)
        # Concurrent runs of the two graphs keep to their own.
        ra, rb = await asyncio.gather(
            a.ainvoke({"messages": [Message.text_message("x", message_id="in-a2")]}, {"thread_id": "conc-a"}),
            b.ainvoke({"messages": [Message.text_message("y", message_id="in-b2")]}, {"thread_id": "conc-b"}))
        assert all(str(m.message_id).startswith("a-") for m in ra["messages"][1:])
        assert all(str(m.message_id).startswith("b-") for m in rb["messages"][1:])
        # Outside any run: the last generator installed, as in 10xGraph.
        assert str(generate_id(None)).startswith("b-")
    finally:
        set_id_generator(None)


GRAPH_WITHOUT_ONE_AFTER = ONE_GRAPH.split("before = generate_id(None)")[0] + """
b = StateGraph()
b.add_node("model", model); b.set_entry_point("model"); b.add_edge("model", END)
app_b = b.compile(checkpointer=InMemoryCheckpointer())
rb = asyncio.run(app_b.ainvoke({"messages": [Message.text_message("hi", message_id="in-2")]}, config={"thread_id": "t"}))
emit({"b_reply_random": rb["messages"][-1].message_id.count("-") == 4, "outside_random": generate_id(None).count("-") == 4})
"""


def test_a_graph_built_without_a_generator_binds_random_ids_again_as_10xgraph_does(oracle: Any) -> None:
    """10xGraph binds its DefaultIDGenerator for a graph built without one: that graph's runs and
    code outside any run get random ids again. Until session 24 the earlier graph's generator
    stayed installed, and named the second graph's messages."""
    theirs, ours = oracle.run_both(GRAPH_WITHOUT_ONE_AFTER)
    assert theirs == {"b_reply_random": True, "outside_random": True}
    assert ours == theirs


@pytest.mark.asyncio
async def test_a_graph_without_a_generator_gets_random_ids_in_its_runs_whatever_was_built_after() -> None:
    def reply(state: AgentState) -> Message:
        return Message.text_message("reply", role="assistant")

    def build(**kw: Any) -> Any:
        g = StateGraph(AgentState, **kw)
        g.add_node("reply", reply)
        g.set_entry_point("reply")
        g.add_edge("reply", END)
        return g.compile(checkpointer=InMemoryCheckpointer())

    class Fixed(BaseIDGenerator):
        @property
        def id_type(self) -> str:
            return "string"

        def generate(self) -> str:
            return f"fixed-{next(counter)}"

    counter = itertools.count(1)
    plain = build()
    build(id_generator=Fixed())  # installed process-wide after `plain` was built
    try:
        out = await plain.ainvoke({"messages": [Message.text_message("hi", message_id="in")]}, config={"thread_id": "t"})
        assert not str(out["messages"][-1].message_id).startswith("fixed-")
        assert str(generate_id(None)).startswith("fixed-")  # outside runs: the last installed
    finally:
        set_id_generator(None)
