"""The differential harness itself: the same script reaches both runtimes, and a difference shows."""

from __future__ import annotations

SCRIPT = """
import asyncio
from tenxgraph.core.graph import StateGraph
from tenxgraph.core.state import AgentState, Message
from tenxgraph.utils import END
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

def shout(state):
    last = state.context[-1]
    return [Message.text_message(last.text().upper(), role="assistant")]

g = StateGraph(AgentState)
g.add_node("shout", shout)
g.set_entry_point("shout")
g.add_edge("shout", END)
app = g.compile(checkpointer=InMemoryCheckpointer())
out = app.invoke({"messages": [Message.text_message("hello")]}, config={"thread_id": "t1"})
import tenxgraph, os
emit({"texts": [m.text() for m in out["messages"]], "roles": [m.role for m in out["messages"]],
      "where": os.path.dirname(tenxgraph.__file__)})
"""


def test_one_script_runs_on_each_runtime(oracle) -> None:
    theirs, ours = oracle.run_both(SCRIPT)
    assert theirs["where"] != ours["where"]  # two different packages answered
    assert "site-packages" in theirs["where"]
    assert ours["texts"] == theirs["texts"] and ours["roles"] == theirs["roles"], (theirs, ours)
