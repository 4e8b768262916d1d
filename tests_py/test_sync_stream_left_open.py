"""A sync ``stream()`` generator still referenced when its thread ends (a script's last line
after ``next(gen)``) is never closed. Its worker, waiting on a full queue, kept the interpreter
from exiting for good (red-team, session 36; 10xGraph exits). The worker gives up once the
thread that consumes the stream has ended.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

SCRIPT = textwrap.dedent("""
    from tenxgraph import END, AgentState, Message, StateGraph
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    def many(state):
        return [Message.text_message(f"m{i}", role="assistant") for i in range(400)]

    g = StateGraph(AgentState)
    g.add_node("many", many)
    g.set_entry_point("many")
    g.add_edge("many", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    gen = app.stream({"messages": [Message.text_message("hi")]}, {"thread_id": "t1"})
    next(gen)
    print("script ended", flush=True)
""")


def test_a_script_that_ends_with_a_stream_open_exits() -> None:
    # Before: still alive when the timeout came (for good); a right run exits in about a second.
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "script ended"), done.stderr[-2000:]


def _many_messages_graph():  # type: ignore[no-untyped-def]
    g = StateGraph(AgentState)
    g.add_node("many", lambda s: [Message.text_message(f"m{i}", role="assistant") for i in range(400)])
    g.set_entry_point("many")
    g.add_edge("many", END)
    return g.compile(checkpointer=InMemoryCheckpointer())


def _chunks_texts(chunks: list) -> list[str]:  # type: ignore[type-arg]
    texts = [c.message.text() for c in chunks if getattr(c, "message", None) is not None]
    return [t for t in texts if t.startswith("m")]


def test_a_stream_taken_over_by_another_thread_is_served_to_its_end() -> None:
    """The consumer is the thread that last asked for a chunk: a generator started in one thread
    and read to its end in another (taking over while the first lives) gets every chunk."""
    app = _many_messages_graph()
    gen = app.stream({"messages": [Message.text_message("hi")]}, {"thread_id": "t-handed"})
    first: list = []  # type: ignore[type-arg]
    taken_over = threading.Event()

    def start() -> None:
        first.append(next(gen))
        taken_over.wait(60)

    starter = threading.Thread(target=start)
    starter.start()
    while not first:
        starter.join(0.01)
    rest = []
    for chunk in gen:  # this thread now, while the starter still lives
        taken_over.set()
        rest.append(chunk)
    starter.join()
    assert _chunks_texts([*first, *rest]) == [f"m{i}" for i in range(400)]


def test_a_stream_read_after_its_thread_ended_raises_instead_of_hanging() -> None:
    """The thread reading it ended with the stream open: the worker gives up (the run is cut, as
    when a consumer leaves), and a later read gets a clear error, not a wait for good."""
    app = _many_messages_graph()
    gen = app.stream({"messages": [Message.text_message("hi")]}, {"thread_id": "t-left"})
    starter = threading.Thread(target=lambda: next(gen))
    starter.start()
    starter.join()
    workers = [t for t in threading.enumerate() if t.name == "tenxgraph-stream"]
    for w in workers:
        w.join(60)  # before: it waited on the full queue for good
    assert not any(w.is_alive() for w in workers)
    try:
        list(gen)
    except RuntimeError as exc:
        assert "cut when the thread reading it ended" in str(exc)
    else:
        raise AssertionError("a stream cut by its reader's end read on as if whole")


def test_a_short_stream_handed_over_after_its_first_reader_ended_is_served_whole() -> None:
    """(second red-team, session 36) The worker gave up whenever it found the first reader ended,
    even with room in the queue: a generator read on a helper thread first, then by the main
    thread a moment after that helper ended, was cut. Only a full queue ever kept a process
    alive; with room, every chunk is queued for whoever reads next."""
    g = StateGraph(AgentState)
    g.add_node("few", lambda s: [Message.text_message(f"m{i}", role="assistant") for i in range(5)])
    g.set_entry_point("few")
    g.add_edge("few", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    gen = app.stream({"messages": [Message.text_message("hi")]}, {"thread_id": "t-short"})
    first: list = []  # type: ignore[type-arg]
    starter = threading.Thread(target=lambda: first.append(next(gen)))
    starter.start()
    starter.join()
    for w in [t for t in threading.enumerate() if t.name == "tenxgraph-stream"]:
        w.join(60)  # the run ends with every chunk queued, the reader gone meanwhile
    assert _chunks_texts([*first, *list(gen)]) == [f"m{i}" for i in range(5)]
