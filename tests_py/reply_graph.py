"""A one-node graph that answers the last message with ``reply to <its text>``. Oracle scripts
start with this file's own text (``SOURCE``), so 10xGraph runs the very same graph."""


from pathlib import Path
from typing import Any

from tenxgraph import END, AgentState, Message, StateGraph


def reply(state: AgentState) -> Message:
    return Message.text_message("reply to " + state.context[-1].text(), role="assistant")


def reply_graph(checkpointer: Any, **compile_kw: Any) -> Any:
    g = StateGraph(AgentState)
    g.add_node("reply", reply)
    g.set_entry_point("reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=checkpointer, **compile_kw)


SOURCE = Path(__file__).read_text()
