"""A live state kept between runs must be what a load of the thread would give the next turn.

A kept state holds the Python objects the last turn left in it; a load (another process, after a
deploy) gets their JSON round trip. Where the model declares ``Any`` (a state field, a message's
``metadata``) or a value does not match its declared type, the two differ: a tuple came back a
list, an int key a str, a datetime its text. Before session 16 the kept state carried the
objects into the next turn, so a node saw other values in a warm process than after a restart
(docs/differences.md said so). Now a run whose commits held such a value keeps no live state.
Each case runs the same two turns on a graph that keeps live states and on one that does not
(``live_states=0``, what a fresh process sees) and compares what the second turn's node saw.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Any

import pytest
from pydantic import BaseModel, Field

from tenxgraph import END, START, AgentState, Message, StateGraph, metrics

pytestmark = pytest.mark.asyncio


class Colour(str, enum.Enum):
    RED = "red"


class Point(BaseModel):
    x: int = 0


@dataclasses.dataclass
class Pair:
    a: int
    b: int


class Board(AgentState):
    bag: Any = None
    by_id: dict = {}
    count: int = 0
    pair: tuple[int, int] = (0, 0)
    when: datetime.datetime | None = None
    point: Point | None = None


class BoardWithScratch(Board):
    scratch: str = Field(default="", exclude=True)


def _set(field: str, value: Any) -> Any:
    def put(state: Board) -> None:
        setattr(state, field, value)
    return put


def _meta(value: Any) -> Any:
    def put(state: Board) -> None:
        m = Message.text_message("with metadata", role="assistant")
        m.metadata = {"v": value}
        state.context.append(m)
    return put


# (what turn 1 leaves in the state, whether a load gives it back unchanged)
CASES: dict[str, tuple[Any, bool]] = {
    "tuple-in-any": (_set("bag", (1, 2)), False),
    "set-in-any": (_set("bag", {3}), False),
    "int-key-in-dict": (_set("by_id", {1: "one"}), False),
    "enum-in-any": (_set("bag", Colour.RED), False),
    "model-in-any": (_set("bag", Point(x=1)), False),
    "dataclass-in-any": (_set("bag", Pair(1, 2)), False),
    "nested-tuple-in-any": (_set("bag", {"k": [1, (2, 3)]}), False),
    "datetime-in-metadata": (_meta(datetime.datetime(2026, 1, 2, 3, 4, 5)), False),
    "tuple-in-metadata": (_meta((1, 2)), False),
    "str-assigned-to-int": (_set("count", "5"), False),
    # Postgres stores U+0000 as U+FFFD; kept nowhere, so every backend answers alike.
    "nul-in-any": (_set("bag", "a\x00b"), False),
    "nul-in-metadata": (_meta("a\x00b"), False),
    "excluded-field": (_set("scratch", "left by turn 1"), False),
    # Declared types a load restores: these states are kept.
    "declared-tuple": (_set("pair", (1, 2)), True),
    "declared-datetime": (_set("when", datetime.datetime(2026, 1, 2)), True),
    "declared-model": (_set("point", Point(x=3)), True),
    "plain-json-in-any": (_set("bag", {"a": [1, 2.5, None, True, "s"]}), True),
    "plain-metadata": (_meta({"n": 1, "l": ["x"]}), True),
}


def shape(v: Any) -> Any:
    """A value's types and contents, dict keys in any order: Postgres's jsonb gives a dict's keys
    back in its own order (as for 10xGraph on Postgres), which is not what this file is about."""
    if isinstance(v, BaseModel):
        return (type(v).__name__, shape(v.__dict__))
    if isinstance(v, dict):
        return (type(v).__name__, sorted((repr(k), repr(shape(x))) for k, x in v.items()))
    if isinstance(v, (list, tuple, set, frozenset)):
        items = [shape(x) for x in v]
        return (type(v).__name__, sorted(map(repr, items)) if isinstance(v, (set, frozenset)) else items)
    return (type(v).__name__, repr(v))


def graph(cp: Any, seen: list[Any], change: Any, cls: type[Board], **compile_kw: Any) -> Any:
    async def node(state: Board, config: dict[str, Any]) -> Board:
        turn = sum(1 for m in state.context if m.role == "user")
        seen.append(shape({
            "bag": state.bag, "by_id": state.by_id, "count": state.count, "pair": state.pair, "when": state.when,
            "point": state.point, "scratch": getattr(state, "scratch", None),
            "meta": [m.metadata for m in state.context if m.role == "assistant"],
        }))
        if turn == 1:
            change(state)
        state.context.append(Message.text_message(f"reply {turn}", role="assistant"))
        return state

    g = StateGraph(cls())
    g.add_node("n", node)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    return g.compile(checkpointer=cp, **compile_kw)


def reuses() -> float:
    return metrics.snapshot()["tenxgraph.storage.live_state_reuses"]


@pytest.mark.parametrize("case", list(CASES))
async def test_the_next_turn_sees_what_a_load_gives(checkpointer: Any, make_thread: Any, case: str) -> None:
    change, kept = CASES[case]
    cls = BoardWithScratch if case == "excluded-field" else Board
    warm_seen: list[Any] = []
    cold_seen: list[Any] = []
    warm = graph(checkpointer, warm_seen, change, cls)
    cold = graph(checkpointer, cold_seen, change, cls, live_states=0)
    tw, tc = make_thread("warm"), make_thread("cold")
    for app, t in ((warm, tw), (cold, tc)):
        await app.ainvoke({"messages": [Message.text_message("one")]}, {"thread_id": t})
    before = reuses()
    await warm.ainvoke({"messages": [Message.text_message("two")]}, {"thread_id": tw})
    reused = reuses() - before
    await cold.ainvoke({"messages": [Message.text_message("two")]}, {"thread_id": tc})
    assert warm_seen[1] == cold_seen[1], f"{case}: a warm turn saw {warm_seen[1]}, a load gives {cold_seen[1]}"
    # The cases a load gives back unchanged still keep their live state (the cache is not off).
    assert reused == (1 if kept else 0), case
