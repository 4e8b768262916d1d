"""A sync entry point is not held by a call its run handed to a thread (helper red-team, session 30).

A node that awaits a blocking call through ``asyncio.to_thread`` (a sync HTTP client with no
timeout on a hung server) is cut off by ``node_timeout``: ``ainvoke`` raised NodeTimeoutError at
once, but ``invoke()`` and ``stream()`` never returned: ``asyncio.run`` waited for its default
executor's threads without a limit. Same for a publisher whose send hangs in a thread. The call
is now left behind, as a sync tool cut off by its timeout is, and the process still exits.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent("""
    import asyncio, sys, threading
    from tenxgraph import END, START, AgentState, Message, StateGraph
    from tenxgraph.core.exceptions import NodeTimeoutError
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    never = threading.Event()

    async def model(state):
        await asyncio.to_thread(never.wait)
        return Message.text_message("never", role="assistant")

    async def quick(state):
        # Work that returns: still awaited and its answer kept.
        text = await asyncio.to_thread(lambda: "from a thread")
        return Message.text_message(text, role="assistant")

    def app(node):
        g = StateGraph(AgentState)
        g.add_node("model", node)
        g.add_edge(START, "model")
        g.add_edge("model", END)
        return g.compile(checkpointer=InMemoryCheckpointer())

    hi = lambda: {"messages": [Message.text_message("hi")]}
    entry = sys.argv[1]
    call = {
        "invoke": lambda a, c: a.invoke(hi(), c),
        "stream": lambda a, c: list(a.stream(hi(), c)),
    }[entry]
    try:
        call(app(model), {"thread_id": "hung", "node_timeout": 1.0})
        print("RETURNED")
    except NodeTimeoutError as e:
        print("TIMEOUT", e.error_code)
    out = app(quick).invoke(hi(), {"thread_id": "quick"})
    print("QUICK", out["messages"][-1].text())
    sys.stdout.flush()
    # The hung thread is still there: the interpreter must exit anyway.
""")


@pytest.mark.parametrize("entry", ["invoke", "stream"])
def test_a_sync_entry_point_returns_the_timeout_while_a_thread_call_hangs(entry: str) -> None:
    # The bound is the test's guard against a hang (the run needs about a second), not a timing.
    done = subprocess.run([sys.executable, "-c", _CHILD, entry], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert "TIMEOUT NODE_TIMEOUT_001" in lines, done.stdout + done.stderr[-3000:]
    assert "QUICK from a thread" in lines, done.stdout
