"""Dependency injection into nodes and tools with InjectQ, as 10xGraph 0.10 does it (the ``di``
extra). Skipped, with a message, where injectq is not installed."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import AgentState, StateGraph

DI = """
import asyncio
from injectq import Inject, InjectQ
from tenxgraph.core.graph import StateGraph, ToolNode
from tenxgraph.core.state import AgentState, Message, ToolCallBlock
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer
from tenxgraph.utils import END

class Greeter:
    def __init__(self, word):
        self.word = word

    def greet(self, who):
        return f"{self.word}, {who}"

def lookup(who: str, greeter: Greeter = Inject[Greeter]) -> str:
    \"\"\"Greets someone.\"\"\"
    return greeter.greet(who) + " (tool)"

def model(state, config, greeter: Greeter = Inject[Greeter]):
    if state.context[-1].role == "tool":
        return [Message.text_message(greeter.greet("done"), role="assistant")]
    return [Message(role="assistant", content=[ToolCallBlock(id="c1", name="lookup", args={"who": "ann"})],
                    tools_calls=[{"id": "c1", "type": "function",
                                  "function": {"name": "lookup", "arguments": '{"who": "ann"}'}}])]

async def uses_checkpointer(state, config, checkpointer: BaseCheckpointer = Inject[BaseCheckpointer]):
    stored = await checkpointer.aget_state(config)
    return [Message.text_message(f"stored {len(stored.context)} as {checkpointer.state_type.__name__}", role="assistant")]

async def main():
    container = InjectQ()
    container.bind_instance(Greeter, Greeter("hello"))
    g = StateGraph(AgentState, container=container)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([lookup]))
    g.add_node("cp", uses_checkpointer)
    g.set_entry_point("model")
    g.add_conditional_edges("model", lambda s: "tools" if s.context[-1].tools_calls else "cp",
                            {"tools": "tools", "cp": "cp"})
    g.add_edge("tools", "model")
    g.add_edge("cp", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    r = await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t"})
    schema = await ToolNode([lookup]).all_tools()
    return {"texts": [m.text() for m in r["messages"]],
            "schema_params": sorted(schema[0]["function"]["parameters"]["properties"])}

emit(asyncio.run(main()))
"""


def test_inject_defaults_in_nodes_and_tools_as_10xgraph(oracle: Any) -> None:
    pytest.importorskip("injectq", reason="injectq is not installed (pip install '10xgraph[di]')")
    theirs, ours = oracle.run_both(DI)
    assert ours == theirs
    assert ours["texts"] == ["hi", "", "hello, ann (tool)", "hello, done", "stored 4 as AgentState"]
    assert ours["schema_params"] == ["who"]  # the injected parameter is hidden from the model


def test_a_container_that_is_not_injectq_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="injectq"):
        StateGraph(AgentState, container=object())


BINDINGS = """
import asyncio
from injectq import Inject, InjectQ
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.runtime.publisher import BasePublisher
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils import END, CallbackManager
from tenxgraph.utils.id_generator import UUIDGenerator

class Rec(BasePublisher):
    def __init__(self):
        super().__init__({})
    async def publish(self, e):
        pass
    async def close(self):
        pass
    def sync_close(self):
        pass

seen = {}

def node(state, config, publisher: BasePublisher = Inject[BasePublisher],
         callbacks: CallbackManager = Inject[CallbackManager]):
    # Inject[...] defaults are proxies: compare through an attribute of the bound object.
    seen["publisher_is_graphs"] = publisher.tag == "the graph's"
    seen["callbacks_is_compiles"] = callbacks.tag == "compile's"
    return [Message.text_message("ok", role="assistant")]

async def main():
    global PUB, CBM
    PUB, CBM = Rec(), CallbackManager()
    PUB.tag, CBM.tag = "the graph's", "compile's"
    container = InjectQ()
    g = StateGraph(AgentState, publisher=PUB, container=container, id_generator=UUIDGenerator())
    g.add_node("n", node)
    g.set_entry_point("n"); g.add_edge("n", END)
    app = g.compile(checkpointer=InMemoryCheckpointer(), callback_manager=CBM)
    await app.ainvoke({"messages": [Message.text_message("hi")]}, {"thread_id": "t"})
    a, b = container.get("generated_id"), container.get("generated_id")
    seen["generated_id"] = [type(a).__name__, len(a), a != b]
    seen["generated_id_type"] = container.get("generated_id_type")

    # No publisher of its own: a publisher the app bound before compile is kept.
    other = InjectQ()
    mine = Rec()
    other.bind_instance(BasePublisher, mine, allow_concrete=True)
    g2 = StateGraph(AgentState, container=other)
    g2.add_node("n", lambda state: [Message.text_message("x", role="assistant")])
    g2.set_entry_point("n"); g2.add_edge("n", END)
    g2.compile(checkpointer=InMemoryCheckpointer())
    seen["prebound_kept"] = other.get(BasePublisher) is mine
    return seen

emit(asyncio.run(main()))
"""


def test_graph_binds_publisher_callbacks_and_generated_id_as_10xgraph(oracle: Any) -> None:
    pytest.importorskip("injectq", reason="injectq is not installed (pip install '10xgraph[di]')")
    theirs, ours = oracle.run_both(BINDINGS)
    assert ours == theirs
    assert ours == {"publisher_is_graphs": True, "callbacks_is_compiles": True,
                    "generated_id": ["str", 36, True], "generated_id_type": "string", "prebound_kept": True}
