"""When the id generator of ``StateGraph(id_generator=...)`` is called: once per new message, one
call at a time, as 10xGraph 0.10 calls it (helper's differential pass, session 45).

1. A state with a ``list[Message | dict]`` field: every load of the state made pydantic try the
   ``Message`` branch on each dict item, and that branch's ``message_id`` default called the
   user's generator before failing. The ids a turn handed out then depended on how many dicts the
   state held (turn 2 of a counter: ``m1, m4, m5, m6, m7`` against 10xGraph's ``m1 .. m5`` on its
   in-memory checkpointer). A load now runs without the generator; 10xGraph's own durable
   checkpointers still call it on each of their loads (docs/differences.md).
2. Parallel sync tools run in worker threads, and each made its result's id there: a generator
   was called from several threads at once, and a plain counter handed out one id twice (the
   duplicate was renamed, so a run's ids came out in a new order each time). 10xGraph makes them
   on the event-loop thread, one at a time; calls are now serialised.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

UNION_STATE = """
import asyncio, json
from tenxgraph import AgentState, Message, StateGraph, ToolNode, END
from tenxgraph.core.state import TextBlock
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils.id_generator import BaseIDGenerator

class Counter(BaseIDGenerator):
    def __init__(self):
        self.prefix, self.n, self.calls = "p0", 0, 0
    @property
    def id_type(self):
        return "string"
    def generate(self):
        self.n += 1
        self.calls += 1
        return f"{self.prefix}-m{self.n}"

class Noted(AgentState):
    note: Message | None = None
    items: list[Message | dict] = []

def add(a: int) -> int:
    '''Adds one.'''
    return a + 1

def model(state: Noted):
    if state.context[-1].role == "user":
        reply = Message(role="assistant", content=[TextBlock(text="calling")], tools_calls=[
            {"id": f"c{len(state.items)}", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1})}}])
        state.note = reply
        state.items = [*state.items, reply, {"turn": len(state.items)}]
        return [reply]
    return [Message(role="assistant", content=[TextBlock(text="done")])]

def route(s):
    return "tools" if s.context[-1].tools_calls else END

gen = Counter()
g = StateGraph(Noted(), id_generator=gen)
g.add_node("model", model); g.add_node("tools", ToolNode([add])); g.set_entry_point("model")
g.add_conditional_edges("model", route, {"tools": "tools", END: END}); g.add_edge("tools", "model")
app = g.compile(checkpointer=InMemoryCheckpointer())

async def main():
    turns = []
    for turn in (1, 2, 3):
        gen.prefix, gen.n, gen.calls = f"p{turn}", 0, 0
        r = await app.ainvoke({"messages": [Message.text_message(f"hi {turn}")]}, config={"thread_id": "u1"})
        turns.append({"ids": [m.message_id for m in r["messages"]], "calls": gen.calls})
    emit(turns)

asyncio.run(main())
"""


def test_a_load_of_a_union_state_calls_no_id_generator_as_10xgraph_in_memory(oracle: Any) -> None:
    theirs, ours = oracle.run_both(UNION_STATE)
    # 10xGraph keeps its in-memory state live: each turn calls it as the first did.
    assert all(t == like_the_first(theirs, n) for n, t in enumerate(theirs, 1)), theirs
    assert ours == theirs


def like_the_first(turns: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Turn ``n`` as it is when it calls the generator as turn 1 did (each turn's counter starts
    again with the prefix ``p<turn>``)."""
    return {"ids": [i.replace("p1-", f"p{n}-") for i in turns[0]["ids"]], "calls": turns[0]["calls"]}


UNION_DURABLE = UNION_STATE.replace("InMemoryCheckpointer()", "SqliteCheckpointer(DB)").replace(
    "import InMemoryCheckpointer", "import SqliteCheckpointer").replace("asyncio.run(main())", "")


def test_a_cold_load_on_sqlite_calls_no_id_generator(tmp_path: Path) -> None:
    """Each turn in a new process: the thread is loaded from the file, dict items and all."""
    import subprocess
    import sys

    db = tmp_path / "ids.db"
    script = ("emit = print\nDB = " + repr(str(db)) + "\n" + UNION_DURABLE + """
import sys
async def one(turn):
    gen.prefix = f"p{turn}"
    r = await app.ainvoke({"messages": [Message.text_message(f"hi {turn}")]}, config={"thread_id": "u1"})
    print(json.dumps({"ids": [m.message_id for m in r["messages"]], "calls": gen.calls}))
asyncio.run(one(int(sys.argv[1])))
""")
    path = tmp_path / "turn.py"
    path.write_text(script)
    turns = []
    for turn in (1, 2, 3):
        out = subprocess.run([sys.executable, str(path), str(turn)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        turns.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert len(turns[0]["ids"]) == 4 and turns[0]["calls"] >= 4, turns
    assert all(t == like_the_first(turns, n) for n, t in enumerate(turns, 1)), turns


PARALLEL_TOOLS = """
import asyncio, json, threading
from tenxgraph import AgentState, Message, StateGraph, ToolNode, END
from tenxgraph.core.state import TextBlock
from tenxgraph.storage.checkpointer import InMemoryCheckpointer
from tenxgraph.utils.id_generator import BaseIDGenerator

class Counter(BaseIDGenerator):
    '''Not thread-safe, as a plain counter is not; a call from a worker thread waits a moment
    for a second one to come in beside it.'''
    def __init__(self):
        self.n, self.inside, self.most, self.guard = 0, 0, 0, threading.Lock()
        self.second = threading.Event()
    @property
    def id_type(self):
        return "string"
    def generate(self):
        with self.guard:
            self.inside += 1
            self.most = max(self.most, self.inside)
            if self.inside > 1:
                self.second.set()
        if threading.current_thread() is not threading.main_thread():
            self.second.wait(0.3)
        n = self.n + 1
        self.n = n
        with self.guard:
            self.inside -= 1
        return f"m{n}"

gen = Counter()

def tool(i: int) -> int:
    '''Returns i.'''
    return i

def model(state):
    if state.context[-1].role == "user":
        return [Message(role="assistant", content=[TextBlock(text="c")], tools_calls=[
            {"id": f"c{i}", "type": "function", "function": {"name": "tool", "arguments": json.dumps({"i": i})}}
            for i in range(6)])]
    return [Message(role="assistant", content=[TextBlock(text="done")])]

def route(s):
    return "tools" if s.context[-1].tools_calls else END

g = StateGraph(AgentState(), id_generator=gen)
g.add_node("model", model); g.add_node("tools", ToolNode([tool])); g.set_entry_point("model")
g.add_conditional_edges("model", route, {"tools": "tools", END: END}); g.add_edge("tools", "model")
app = g.compile(checkpointer=InMemoryCheckpointer())
gen.n = 0
r = asyncio.run(app.ainvoke({"messages": [Message.text_message("hi")]}, config={"thread_id": "t"}))
ids = [m.message_id for m in r["messages"]]
emit({"most_at_once": gen.most, "issued": gen.n, "distinct_ids": len(set(ids)), "messages": len(ids)})
"""


def test_parallel_sync_tools_call_the_id_generator_one_at_a_time(oracle: Any) -> None:
    theirs, ours = oracle.run_both(PARALLEL_TOOLS)
    assert theirs["most_at_once"] == 1, theirs
    assert ours == theirs


def test_a_generator_is_never_entered_twice_at_once_from_threads() -> None:
    """``generate_id`` from several threads: no two calls inside the generator."""
    from tenxgraph.core.state.message import generate_id, set_id_generator

    inside, most, guard, start = 0, 0, threading.Lock(), threading.Barrier(8)

    def slow() -> str:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        threading.Event().wait(0.01)
        with guard:
            inside -= 1
        return "x"

    def call() -> None:
        start.wait(10)
        for _ in range(5):
            generate_id(None)

    set_id_generator(slow)  # restored by conftest's autouse fixture
    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most == 1
