"""Example: a support agent on the embedded SQLite default, with a scripted model (no API key).

    python examples/support_agent.py [--db PATH] [--thread ID]

Runs one turn (user -> model -> action -> model -> END), prints the messages and where the
thread's state lives. Running it again with the same --thread continues the conversation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import SqliteCheckpointer


class SupportState(AgentState):
    order_id: str | None = None
    refunded: bool = False


async def model(state: SupportState) -> Message:
    """A scripted model: asks for the refund, then confirms it."""
    if not state.refunded:
        state.order_id = "4821"
        return Message.text_message("Let me refund order 4821 for you.", role="assistant")
    return Message.text_message(f"Order {state.order_id} is refunded. Anything else?", role="assistant")


def refund(state: SupportState) -> str:
    """A sync node: runs in a worker thread, off the event loop."""
    state.refunded = True
    return f"refund issued for order {state.order_id}"


def route(state: SupportState) -> str:
    return "refund" if not state.refunded else END


def build(db_path: str):
    graph = StateGraph(SupportState)
    graph.add_node("model", model)
    graph.add_node("refund", refund)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, {"refund": "refund", END: END})
    graph.add_edge("refund", "model")
    return graph.compile(checkpointer=SqliteCheckpointer(db_path))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default=os.path.join(tempfile.gettempdir(), "tenxgraph-example.db"))
    parser.add_argument("--thread", default="support-4821")
    args = parser.parse_args()

    app = build(args.db)
    config = {"thread_id": args.thread, "user_id": "customer-118"}
    result = await app.ainvoke(
        {"messages": [Message.text_message("Please refund my order 4821.")]},
        config,
        response_granularity="full",
    )
    for m in result["messages"]:
        print(f"{m.role:>9}: {m.text()}")
    state = result["state"]
    print(f"\nthread {args.thread}: status={state.execution_meta.status}, steps={state.execution_meta.step}")
    stored = await app._checkpointer.alist_messages(config)
    print(f"{len(stored)} messages stored durably in {args.db}")
    assert state.refunded and str(state.execution_meta.status) == "completed"


if __name__ == "__main__":
    asyncio.run(main())
