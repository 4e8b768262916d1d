"""Prebuilt teams: limits that are per turn, and names and settings checked at construction
(helper red-team, session 31), against the local OpenAI stand-in.

- ``SupervisorTeamAgent``'s round count and route history, and ``PlanActReflectAgent``'s
  iteration count, were kept across the thread's turns (10xGraph the same): once a thread had
  used ``max_rounds`` rounds in all, its supervisor was never asked again and the thread never
  answered again; turn 2's supervisor saw turn 1's routing decisions after the new question.
- a worker or member named ``<OTHER>_TOOL`` replaced the other's tool node (its tool calls went to
  the wrong agent's model, and were left unanswered); int or empty names, a worker named
  ``FINISH``, ``max_rounds="3"`` or ``-1``, ``can_handoff_to=[None]``: accepted, or a bare
  ``ValueError``/``AttributeError``/``TypeError``. Now ``PrebuiltConfigError`` ``PREBUILT_001``.
- ``StructuredOutputAgent``'s repair attempts were counted across turns too (session 32): once
  a thread had used ``max_attempts``, no later invalid reply was repaired. Its own correction is
  a user message, so it must not count as a new turn (or the repairs would never end).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest

pytest.importorskip("openai")

from tenxgraph.core.graph import Agent  # noqa: E402
from tenxgraph.core.state import Message  # noqa: E402
from tenxgraph.prebuilt.agent import (  # noqa: E402
    PlanActReflectAgent,
    StructuredOutputAgent,
    SupervisorTeamAgent,
    SwarmAgent,
    SwarmMemberConfig,
    WorkerConfig,
)
from tenxgraph.prebuilt.errors import PrebuiltConfigError  # noqa: E402
from tenxgraph.storage.checkpointer import InMemoryCheckpointer  # noqa: E402
from tenxgraph.testing.providers import OpenAIStandIn  # noqa: E402
from tests_py.llm_agents.stand_in_env import serving  # noqa: E402


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    yield from serving(OpenAIStandIn, monkeypatch, drop=("AGENTFLOW_LLM_TIMEOUT",))


def _turn(app: Any, n: int) -> Any:
    return asyncio.run(app.ainvoke({"messages": [Message.text_message(f"question {n}")]}, {"thread_id": "t"}))


def test_a_supervisor_teams_rounds_are_counted_per_turn(llm: OpenAIStandIn) -> None:
    app = SupervisorTeamAgent(supervisor_model="openai/m-sup", max_rounds=2, workers={
        "WRITER": WorkerConfig(agent=Agent(model="openai/m-w"), description="writes")}).compile(
        checkpointer=InMemoryCheckpointer())
    for n in range(1, 4):
        llm.reply_text("WRITER", model="m-sup")
        llm.reply_text("FINISH", model="m-sup")
        llm.reply_text(f"writer answer {n}", model="m-w")
        before = len(llm.requests)
        out = _turn(app, n)
        assert out["messages"][-1].text() == f"writer answer {n}"
        asked = llm.requests[before:]
        assert [r.model for r in asked] == ["m-sup", "m-w", "m-sup"], n
        # Its past decisions are this turn's only: turn n's first request holds no "WRITER".
        assert not [m for m in asked[0].messages if m.get("content") == "WRITER"], asked[0].messages
    assert llm.unscripted == 0


def test_plan_act_reflect_iterations_are_counted_per_turn(llm: OpenAIStandIn) -> None:
    app = PlanActReflectAgent(model="openai/m-plan", reflect_model="openai/m-ref", max_iterations=2).compile(
        checkpointer=InMemoryCheckpointer())
    for n in range(1, 4):
        llm.reply_text(f"plan a {n}", model="m-plan")
        llm.reply_text(f"plan b {n}", model="m-plan")
        llm.reply_text(f"not yet {n}", model="m-ref")
        llm.reply_text(f"ok {n} [DONE]", model="m-ref")
        before = len(llm.requests)
        out = _turn(app, n)
        assert out["messages"][-1].text() == f"ok {n} [DONE]"
        assert [r.model for r in llm.requests[before:]] == ["m-plan", "m-ref", "m-plan", "m-ref"], n


class Total(pydantic.BaseModel):
    total: int


@pytest.mark.parametrize("repair_agent", [False, True], ids=["correction_message", "repair_agent"])
def test_structured_output_repairs_are_counted_per_turn(llm: OpenAIStandIn, repair_agent: bool) -> None:
    extra = {"repair_system_prompt": [{"role": "system", "content": "fix it"}]} if repair_agent else {}
    app = StructuredOutputAgent(model="openai/m-gen", output_schema=Total, max_attempts=2, **extra).compile(
        checkpointer=InMemoryCheckpointer())
    for n in range(1, 4):
        # Every reply is invalid: each turn asks once, then repairs twice, then ends as is.
        for i in range(1 + 2 * (2 if repair_agent else 1)):
            llm.reply_text(f"not json {n}.{i}", model="m-gen")
        before = len(llm.requests)
        out = _turn(app, n)
        assert len(llm.requests) - before == (5 if repair_agent else 3), n
        assert out["messages"][-1].text().startswith(f"not json {n}.")
    assert llm.unscripted == 0


def test_a_structured_reply_that_validates_ends_the_turn(llm: OpenAIStandIn) -> None:
    app = StructuredOutputAgent(model="openai/m-gen", output_schema=Total, max_attempts=2).compile(
        checkpointer=InMemoryCheckpointer())
    llm.reply_text("nope", model="m-gen")
    llm.reply_text('{"total": 7}', model="m-gen")
    out = _turn(app, 1)
    assert out["messages"][-1].text() == '{"total": 7}'
    corrections = [m for m in out["messages"] if m.role == "user" and m.text().startswith("Your previous")]
    assert len(corrections) == 1
    assert llm.unscripted == 0


def _agent() -> Agent:
    return Agent(model="openai/m")


def charge(order: str) -> str:
    """Charge an order."""
    return f"charged {order}"


BAD_TEAMS = {
    "tool_node_name": lambda: {"workers": {"BILLER": WorkerConfig(Agent(model="openai/m", tools=[charge])),
                                           "BILLER_TOOL": WorkerConfig(_agent())}},
    "int_name": lambda: {"workers": {1: WorkerConfig(_agent())}},
    "empty_name": lambda: {"workers": {"": WorkerConfig(_agent())}},
    "finish": lambda: {"workers": {"FINISH": WorkerConfig(_agent())}},
    "an_agent_not_a_config": lambda: {"workers": {"A": _agent()}},
    "rounds_str": lambda: {"workers": {"A": WorkerConfig(_agent())}, "max_rounds": "3"},
    "rounds_negative": lambda: {"workers": {"A": WorkerConfig(_agent())}, "max_rounds": -1},
}
BAD_SWARMS = {
    "tool_node_name": lambda: {"members": {"A": SwarmMemberConfig(_agent()), "A_TOOL": SwarmMemberConfig(_agent())}},
    "int_name": lambda: {"members": {"A": SwarmMemberConfig(_agent()), 2: SwarmMemberConfig(_agent())}},
    "empty_name": lambda: {"members": {"A": SwarmMemberConfig(_agent()), "": SwarmMemberConfig(_agent())}},
    "handoff_to_none": lambda: {"members": {"A": SwarmMemberConfig(_agent(), can_handoff_to=[None]),
                                            "B": SwarmMemberConfig(_agent())}},
}


@pytest.mark.parametrize("case", sorted(BAD_TEAMS))
def test_a_team_with_bad_workers_is_refused_at_construction(case: str, llm: OpenAIStandIn) -> None:
    with pytest.raises(PrebuiltConfigError) as err:
        SupervisorTeamAgent(supervisor_model="openai/m-sup", **BAD_TEAMS[case]())
    assert err.value.error_code == "PREBUILT_001"


@pytest.mark.parametrize("case", sorted(BAD_SWARMS))
def test_a_swarm_with_bad_members_is_refused_at_construction(case: str, llm: OpenAIStandIn) -> None:
    with pytest.raises(PrebuiltConfigError) as err:
        SwarmAgent(entry="A", **BAD_SWARMS[case]())
    assert err.value.error_code == "PREBUILT_001"
