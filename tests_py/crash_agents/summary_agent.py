"""An Agent that trims its prompt with a SummaryContextManager, for the crash tests: the model is
whatever OPENAI_BASE_URL points at (the parent's stand-in)."""

from __future__ import annotations

from typing import Any

from tenxgraph.core.graph import Agent, StateGraph
from tenxgraph.core.state import SummaryContextManager
from tenxgraph.utils import END


def build(checkpointer: Any) -> Any:
    """``factory(checkpointer) -> CompiledGraph`` for tenxgraph.testing.crash."""
    g = StateGraph(context_manager=SummaryContextManager("gpt-4o-mini", max_messages=3, keep_recent=2,
                                                         api_style="chat"))
    g.add_node("MAIN", Agent(model="gpt-4o-mini", trim_context=True, retry_config=False,
                             system_prompt=[{"role": "system", "content": "S"}]))
    g.set_entry_point("MAIN")
    g.add_edge("MAIN", END)
    return g.compile(checkpointer=checkpointer)
