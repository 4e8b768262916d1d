"""Static pauses at START and END, differential against 10xGraph 0.10.0. 10xGraph takes START
and END in ``interrupt_before`` / ``interrupt_after``: a pause before START gates every turn (its
input stored, nothing run; ``{}`` runs it), a pause after START stops once the first node is
routed, and END's pauses never fire. Ours refused all four at ``compile()`` (GRAPH_004)."""

from __future__ import annotations

import pytest

from tenxgraph import END, START, AgentState, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

SCRIPT = """
import asyncio
from tenxgraph import END, START, Message, StateGraph
from tenxgraph.storage.checkpointer import InMemoryCheckpointer


def build(first_by_condition):
    g = StateGraph()
    g.add_node("a", lambda s: Message.text_message("a", role="assistant", message_id=f"a{len(s.context)}"))
    g.add_node("b", lambda s: Message.text_message("b", role="assistant", message_id=f"b{len(s.context)}"))
    if first_by_condition:
        g.set_entry_point("a")
        g.add_conditional_edges(START, lambda s: "b" if "b" in s.context[-1].text() else "a")
    else:
        g.add_edge(START, "a")
    g.add_edge("a", END); g.add_edge("b", END)
    return g


async def turns(before, after, first_by_condition, inputs):
    fresh_container()
    app = build(first_by_condition).compile(checkpointer=InMemoryCheckpointer(), interrupt_before=before,
                                            interrupt_after=after)
    out = []
    for i, text in enumerate(inputs):
        data = {} if text is None else {"messages": [Message.text_message(text, message_id=f"u{i}")]}
        r = await app.ainvoke(data, {"thread_id": "t"}, response_granularity="full")
        meta = r["state"].execution_meta
        out.append([[m.message_id for m in r["state"].context], meta.status.value, meta.current_node,
                    meta.interrupted_node])
    return out


async def loop_back(before, after):
    # A node that routes back to START until it has answered twice.
    fresh_container()
    g = StateGraph()
    g.add_node("a", lambda s: Message.text_message("a", role="assistant", message_id=f"a{len(s.context)}"))
    g.add_edge(START, "a")
    g.add_conditional_edges("a", lambda s: START if sum(m.role == "assistant" for m in s.context) < 2 else END,
                            {START: START, END: END})
    app = g.compile(checkpointer=InMemoryCheckpointer(), interrupt_before=before, interrupt_after=after)
    out = []
    for data in ({"messages": [Message.text_message("go", message_id="u0")]}, {}, {}):
        r = await app.ainvoke(data, {"thread_id": "t"}, response_granularity="full")
        meta = r["state"].execution_meta
        out.append([[m.message_id for m in r["state"].context], meta.status.value, meta.current_node,
                    meta.interrupted_node])
        if meta.status.value == "completed":
            break
    return out


async def straight_to_end():
    fresh_container()
    g = StateGraph()
    g.add_node("a", lambda s: Message.text_message("a", role="assistant", message_id=f"a{len(s.context)}"))
    g.set_entry_point("a")
    g.add_conditional_edges(START, lambda s: END if "skip" in s.context[-1].text() else "a")
    g.add_edge("a", END)
    app = g.compile(checkpointer=InMemoryCheckpointer())
    r = await app.ainvoke({"messages": [Message.text_message("skip", message_id="u0")]}, {"thread_id": "t"},
                          response_granularity="full")
    meta = r["state"].execution_meta
    return [meta.status.value, meta.current_node]


async def main():
    # No `{}` on a completed thread: there tenxgraph runs nothing by design (differences.md).
    script = ["go", None, "to b", None, "again"]
    emit({
        "before_start": await turns([START], [], False, script),
        "after_start": await turns([], [START], False, script),
        "both": await turns([START], [START], False, ["go", None, None, "to b", None]),
        "before_start_routed": await turns([START], [], True, script),
        "after_start_routed": await turns([], [START], True, script),
        "end": await turns([END], [END], False, ["go", "again"]),
        "start_to_end": await straight_to_end(),
        "loop_back_before": await loop_back([START], []),
        "loop_back_after": await loop_back([], [START]),
    })

asyncio.run(main())
"""


def test_pauses_at_start_and_end_are_10xgraphs(oracle) -> None:
    theirs, ours = oracle.run_both(SCRIPT)
    assert ours == theirs
    # Not vacuous: the turn paused at START, then ran the node the condition chose.
    first, resumed = theirs["before_start_routed"][0], theirs["before_start_routed"][1]
    assert first[1:] == ["interrupted_before", START, START]
    assert resumed[1] == "completed"
    assert theirs["after_start_routed"][2][1:3] == ["interrupted_after", "b"]
    # A loop back to START stops at the gate before it.
    assert theirs["loop_back_before"][1][1:3] == ["interrupted_before", START]


@pytest.mark.asyncio
async def test_a_turn_paused_before_start_has_its_input_stored_and_runs_on_resume() -> None:
    ran: list[str] = []

    def model(state: AgentState) -> Message:
        ran.append(state.context[-1].text())
        return Message.text_message("done", role="assistant")

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    cp = InMemoryCheckpointer()
    app = g.compile(checkpointer=cp, interrupt_before=[START])
    config = {"thread_id": "gate"}
    await app.ainvoke({"messages": [Message.text_message("refund 4821")]}, config)
    stored = await cp.aget_state(config)
    assert ran == [] and [m.text() for m in stored.context] == ["refund 4821"]
    assert stored.execution_meta.status.value == "interrupted_before"
    result = await app.ainvoke({}, config)
    assert ran == ["refund 4821"] and result["messages"][-1].text() == "done"


@pytest.mark.asyncio
@pytest.mark.parametrize("gate", ["before", "after"])
async def test_a_crash_right_after_a_gated_turn_is_stored_leaves_it_paused(
        tmp_path, effects, monkeypatch, gate: str) -> None:
    """The gated turn made two commits, its input and then its pause: a kill between them left
    the turn `running`, and recovery ran the node behind `interrupt_after=[START]` unapproved
    (behind `interrupt_before=[START]` the thread stayed running at START, skipped by every
    recovery pass). The input commit is the pause now (helper red-team, session 34)."""
    from tenxgraph.storage.checkpointer import SqliteCheckpointer
    from tenxgraph.testing import run_until_crash
    from tests_py.crash_agents import start_gate_agent

    monkeypatch.setenv("START_GATE", gate)
    db = tmp_path / "gate.db"
    crash = run_until_crash("tests_py.crash_agents.start_gate_agent:build", "t-gate", db=db, input="refund please",
                            failpoints="after_step:__input__=kill", timeout=60)
    assert crash.killed, (crash.stdout, crash.stderr)
    cp = SqliteCheckpointer(str(db))
    app = start_gate_agent.build(cp)
    try:
        report = await app.arecover()
        assert not report.resumed, report
        meta = (await cp.aget_state({"thread_id": "t-gate"})).execution_meta
        assert (meta.status.value, meta.interrupted_node) == (f"interrupted_{gate}", START)
        assert effects.all("charge") == []
        # The reviewer's go-on runs it, once.
        result = await app.ainvoke({}, {"thread_id": "t-gate"})
        assert result["messages"][-1].text() == "charged"
        effects.assert_exactly_once("charge")
    finally:
        await cp.arelease()
