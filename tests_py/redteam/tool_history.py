"""Tool calls, turns and the shape of a well-formed history, for the tests of tool nodes that
failed or were closed."""
from __future__ import annotations

import json
from typing import Any

from tenxgraph import Message
from tenxgraph.core.state.message_block import ToolResultBlock


def call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def turn(text: str) -> dict[str, Any]:
    return {"messages": [Message.text_message(text)]}


def results(msg: Message) -> list[ToolResultBlock]:
    return [b for b in msg.content if isinstance(b, ToolResultBlock)]


def check_history(ctx: list[Message]) -> None:
    """Each assistant message with tool calls is followed by exactly one result per call, in
    order; no tool message anywhere else."""
    i = 0
    while i < len(ctx):
        m = ctx[i]
        if m.role == "tool":
            raise AssertionError(f"stray tool message at {i}: {[x.role for x in ctx]}")
        if m.role == "assistant" and m.tools_calls:
            want = [c["id"] for c in m.tools_calls]
            got = []
            j = i + 1
            while j < len(ctx) and ctx[j].role == "tool":
                got += [b.call_id for b in results(ctx[j])]
                j += 1
            assert got == want, (i, got, want, [x.role for x in ctx])
            i = j
            continue
        i += 1


def order_turn_message(state: Any) -> Message:
    """The scripted model of the order tests: a user's order gets `charge` and `ship` calls for it
    (ids `charge-<order>`, `ship-<order>`), anything else the answer "done"."""
    last = state.context[-1]
    if last.role == "user":
        order = last.text()
        msg = Message.text_message(f"on it: {order}", role="assistant")
        msg.tools_calls = [call(f"charge-{order}", "charge", order_id=order), call(f"ship-{order}", "ship", order_id=order)]
        return msg
    return Message.text_message("done", role="assistant")
