"""The prebuilt agents against the local OpenAI stand-in: a full run of each on every backend,
and a SIGKILL in the middle of each whose resume does not repeat a side effect that happened
(the charge, or RAG's search), on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest

from tenxgraph.core.state import Message
from tenxgraph.testing import CrashKit, EffectCounter
from tenxgraph.testing.providers import OpenAIStandIn
from tests_py.llm_agents import prebuilt as agents

PKG = "tests_py.llm_agents.prebuilt"
CHARGE = ("charge_card", {"order_id": "A1", "amount": 5.0})


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch):
    with OpenAIStandIn() as server:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, sqlite_db: str) -> str:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else sqlite_db


def _invoke(app, text: str, thread: str = "t1") -> list[Message]:
    return app.invoke({"messages": [Message.text_message(text)]}, config={"thread_id": thread})["messages"]


def _texts(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.text()) for m in messages]


def _roles(request_messages: list[dict]) -> list[str]:
    return [m["role"] for m in request_messages]


# -- full runs ------------------------------------------------------------------------------


def test_plan_act_reflect_full_run(checkpointer, llm: OpenAIStandIn, effects: EffectCounter) -> None:
    llm.reply_tool_calls(CHARGE)                        # PLAN
    llm.reply_text("The charge is not confirmed yet.")  # REFLECT: not done -> INCREMENT -> PLAN
    llm.reply_text("Confirmed: A1 was charged $5.")     # PLAN, no tools -> REFLECT
    llm.reply_text("A1 charged $5. [DONE]")             # REFLECT -> END
    app = agents.build_plan_act_reflect(checkpointer)
    out = _invoke(app, "Charge A1 $5")
    assert _texts(out)[-1] == ("assistant", "A1 charged $5. [DONE]")
    assert effects.count("charge_card") == 1
    state = checkpointer.get_state({"thread_id": "t1"})
    assert state.execution_meta.internal_data["par_iterations"] == 1
    # The reflector sees neither the tool result nor the unanswered call that asked for it.
    reflect_first = llm.requests[1].messages
    assert _roles(reflect_first) == ["system", "user"]
    assert "[DONE]" in reflect_first[0]["content"]
    # The planner sees everything, the tool round included.
    assert _roles(llm.requests[2].messages) == ["system", "user", "assistant", "tool", "assistant"]
    assert llm.pending == 0 and llm.unscripted == 0


def test_plan_act_reflect_stops_at_max_iterations(checkpointer, llm: OpenAIStandIn, effects: EffectCounter) -> None:
    for _ in range(4):  # PLAN, REFLECT x 4: max_iterations=3 ends after the fourth REFLECT
        llm.reply_text("working")
        llm.reply_text("still not done")
    app = agents.build_plan_act_reflect(checkpointer)
    _invoke(app, "Never finish")
    assert len(llm.requests) == 8
    assert checkpointer.get_state({"thread_id": "t1"}).execution_meta.internal_data["par_iterations"] == 3
    assert effects.count("charge_card") == 0


def test_structured_output_full_run_with_tool_and_repair(checkpointer, llm: OpenAIStandIn,
                                                         effects: EffectCounter) -> None:
    llm.reply_tool_calls(CHARGE)            # GENERATE -> TOOL
    llm.reply_text("Charged it, all good")  # GENERATE: not JSON -> REPAIR
    llm.reply_json({"order_id": "A1", "amount": 5.0})
    app = agents.build_structured_output(checkpointer)
    out = _invoke(app, "Invoice for A1")
    assert json.loads(out[-1].text()) == {"order_id": "A1", "amount": 5.0}
    assert effects.count("charge_card") == 1
    # The repair prompt is a user message in the thread, in its place, with the error and the schema.
    roles = [m.role for m in out]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert out[0].text() == "Invoice for A1"
    repair = out[4].text()
    assert "not valid JSON" in repair and '"order_id"' in repair
    assert checkpointer.get_state({"thread_id": "t1"}).execution_meta.internal_data["soa_attempts"] == 1
    assert llm.requests[0].body["response_format"]["type"] == "json_schema"


def test_structured_output_gives_up_after_max_attempts(checkpointer, llm: OpenAIStandIn) -> None:
    for _ in range(3):
        llm.reply_text("no json here")
    app = agents.build_structured_output(checkpointer)
    out = _invoke(app, "Invoice for A1")
    assert out[-1].text() == "no json here"
    assert len(llm.requests) == 3  # the first try and max_attempts=2 repairs
    assert llm.pending == 0


def test_rag_full_run(checkpointer, llm: OpenAIStandIn, effects: EffectCounter) -> None:
    llm.reply_text("Refunds take 5 business days.")
    app = agents.build_rag(checkpointer)
    out = _invoke(app, "How long do refunds take and what do charges look like?")
    assert out[-1].text() == "Refunds take 5 business days."
    assert effects.count("kb_search") == 1
    # RERANK (the user's own BaseReranker) reversed the hits; the model got them numbered.
    sent = llm.requests[0].messages[-1]["content"]
    assert sent == ("<context>\n[1] Charges appear as TENX on statements.\n[2] Refunds take 5 business days.\n"
                    "</context>\n\nHow long do refunds take and what do charges look like?")
    data = checkpointer.get_state({"thread_id": "t1"}).execution_meta.internal_data
    assert data["rag_docs"] == ["Charges appear as TENX on statements.", "Refunds take 5 business days."]


def test_supervisor_full_run(checkpointer, llm: OpenAIStandIn, effects: EffectCounter) -> None:
    llm.reply_text("BILLER")
    llm.reply_tool_calls(CHARGE)
    llm.reply_text("Charged A1.")
    llm.reply_text("WRITER.")
    llm.reply_text("Dear customer, we charged $5.")
    llm.reply_text("FINISH")
    app = agents.build_supervisor(checkpointer)
    out = _invoke(app, "Charge A1 and tell the customer")
    # The routing words never enter the conversation.
    assert _texts(out)[-2:] == [("assistant", "Charged A1."), ("assistant", "Dear customer, we charged $5.")]
    assert all(m.text() not in ("BILLER", "WRITER.", "FINISH") for m in out)
    assert effects.count("charge_card") == 1
    data = checkpointer.get_state({"thread_id": "t1"}).execution_meta.internal_data
    assert data["sta_route_history"] == ["BILLER", "WRITER"] and data["sta_rounds"] == 2
    # The supervisor is reminded of its past decisions, privately.
    third_decision = llm.requests[5].messages
    assert [m["content"] for m in third_decision[-2:]] == ["BILLER", "WRITER"]
    assert "- BILLER: Charges cards." in llm.requests[0].messages[0]["content"]


def test_swarm_full_run_answers_the_handoff(checkpointer, llm: OpenAIStandIn, effects: EffectCounter) -> None:
    llm.reply_tool_calls(("transfer_to_biller", {}))
    llm.reply_tool_calls(CHARGE)
    llm.reply_text("Charged.")
    app = agents.build_swarm(checkpointer)
    out = _invoke(app, "Charge A1")
    assert out[-1].text() == "Charged."
    assert effects.count("charge_card") == 1
    assert [t["function"]["name"] for t in llm.requests[0].body["tools"]] == ["transfer_to_biller"]
    assert [t["function"]["name"] for t in llm.requests[1].body["tools"]] == ["charge_card"]
    # BILLER's first request: the handoff call has its answer (10xGraph leaves it unanswered).
    biller = llm.requests[1].messages
    assert _roles(biller) == ["user", "assistant", "tool"]
    assert biller[-1]["content"] == "Handoff to BILLER"


# -- SIGKILL and resume ---------------------------------------------------------------------


def _kit(tmp_path, db: str, effects: EffectCounter) -> CrashKit:
    return CrashKit(tmp_path / "kit", db=db, effects=effects)


def test_plan_act_reflect_killed_after_the_charge(db: str, llm: OpenAIStandIn, tmp_path,
                                                  effects: EffectCounter) -> None:
    kit = _kit(tmp_path, db, effects)
    llm.reply_tool_calls(CHARGE)
    crashed = kit.run_until_crash(f"{PKG}:build_plan_act_reflect", "t", input="Charge A1 $5",
                                  failpoints="after_record:charge_card=kill", env=llm.env)
    assert crashed.killed and effects.count("charge_card") == 1
    llm.reply_text("Charged. [DONE]")
    resumed = kit.resume(f"{PKG}:build_plan_act_reflect", "t", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert resumed.last == "Charged. [DONE]"
    assert effects.count("charge_card") == 1
    assert len(llm.requests) == 2 and llm.unscripted == 0


def test_structured_output_killed_after_the_charge(db: str, llm: OpenAIStandIn, tmp_path,
                                                   effects: EffectCounter) -> None:
    kit = _kit(tmp_path, db, effects)
    llm.reply_tool_calls(CHARGE)
    crashed = kit.run_until_crash(f"{PKG}:build_structured_output", "t", input="Invoice A1",
                                  failpoints="after_record:charge_card=kill", env=llm.env)
    assert crashed.killed and effects.count("charge_card") == 1
    llm.reply_json({"order_id": "A1", "amount": 5.0})
    resumed = kit.resume(f"{PKG}:build_structured_output", "t", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert json.loads(resumed.last) == {"order_id": "A1", "amount": 5.0}
    assert effects.count("charge_card") == 1
    assert _roles(llm.requests[-1].messages) == ["system", "user", "assistant", "tool"]


def test_rag_killed_after_retrieve_does_not_search_again(db: str, llm: OpenAIStandIn, tmp_path,
                                                         effects: EffectCounter) -> None:
    kit = _kit(tmp_path, db, effects)
    crashed = kit.run_until_crash(f"{PKG}:build_rag", "t", input="How long do refunds take?",
                                  failpoints="after_step:RERANK=kill", env=llm.env)
    assert crashed.killed and effects.count("kb_search") == 1 and not llm.requests
    llm.reply_text("5 business days.")
    resumed = kit.resume(f"{PKG}:build_rag", "t", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert resumed.last == "5 business days."
    assert effects.count("kb_search") == 1
    assert "[1] Refunds take 5 business days." in llm.requests[0].messages[-1]["content"]


def test_supervisor_killed_after_the_workers_charge(db: str, llm: OpenAIStandIn, tmp_path,
                                                    effects: EffectCounter) -> None:
    kit = _kit(tmp_path, db, effects)
    llm.reply_text("BILLER")
    llm.reply_tool_calls(CHARGE)
    crashed = kit.run_until_crash(f"{PKG}:build_supervisor", "t", input="Charge A1",
                                  failpoints="after_record:charge_card=kill", env=llm.env)
    assert crashed.killed and effects.count("charge_card") == 1
    llm.reply_text("Charged A1.")
    llm.reply_text("FINISH")
    resumed = kit.resume(f"{PKG}:build_supervisor", "t", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert resumed.last == "Charged A1."
    assert effects.count("charge_card") == 1
    # Not asked again who acts: the supervisor's decision was committed before the kill.
    assert len(llm.requests) == 4 and llm.pending == 0


def test_swarm_killed_after_the_charge_resumes_in_the_target(db: str, llm: OpenAIStandIn, tmp_path,
                                                             effects: EffectCounter) -> None:
    kit = _kit(tmp_path, db, effects)
    llm.reply_tool_calls(("transfer_to_biller", {}))
    llm.reply_tool_calls(CHARGE)
    crashed = kit.run_until_crash(f"{PKG}:build_swarm", "t", input="Charge A1",
                                  failpoints="after_record:charge_card=kill", env=llm.env)
    assert crashed.killed and effects.count("charge_card") == 1
    llm.reply_text("Charged.")
    resumed = kit.resume(f"{PKG}:build_swarm", "t", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert resumed.last == "Charged."
    assert effects.count("charge_card") == 1
    assert [t["function"]["name"] for t in llm.requests[-1].body["tools"]] == ["charge_card"]


USER_MESSAGE_FROM_A_NODE = """
from tenxgraph.core.state import Message
from tenxgraph.core.graph import StateGraph
from tenxgraph.utils import END
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

async def first(state, config):
    return Message.text_message("first", role="assistant")

async def repair(state, config):
    return [Message.text_message("repair", role="user")]

async def second(state, config):
    return Message.text_message("second", role="assistant")

g = StateGraph()
g.add_node("A", first); g.add_node("U", repair); g.add_node("B", second)
g.set_entry_point("A"); g.add_edge("A", "U"); g.add_edge("U", "B"); g.add_edge("B", END)
out = g.compile(checkpointer=InMemoryCheckpointer()).invoke({"messages": [Message.text_message("hi")]},
                                                            config={"thread_id": "t"})
emit([[m.role, m.text()] for m in out["messages"]])
"""


def test_a_user_message_a_node_adds_is_returned_in_its_place_as_in_10xgraph(oracle) -> None:
    """StructuredOutputAgent's REPAIR adds a user message: invoke's result keeps the caller's
    message first and the added one in order (it used to replace the caller's and move first)."""
    theirs, ours = oracle.run_both(USER_MESSAGE_FROM_A_NODE)
    assert theirs == [["user", "hi"], ["assistant", "first"], ["user", "repair"], ["assistant", "second"]]
    assert ours == theirs


def test_an_interrupt_in_a_workers_tool_pauses_and_resumes(db: str, llm: OpenAIStandIn, tmp_path,
                                                            effects: EffectCounter) -> None:
    """interrupt() inside a SupervisorTeamAgent worker's tool pauses the thread; a fresh process
    resumes it with the approval, and a kill after the charge does not charge twice."""
    target = f"{PKG}:build_supervisor_with_approval"
    kit = _kit(tmp_path, db, effects)
    llm.reply_text("BILLER")
    llm.reply_tool_calls(("approve_charge", {"order_id": "A1", "amount": 5.0}))
    paused = kit.resume(target, "t", input="Charge A1", env=llm.env)
    assert paused.status.startswith("interrupted"), paused.status
    assert effects.count("charge_card") == 0 and len(llm.requests) == 2
    crashed = kit.run_until_crash(target, "t", input={"resume": {"approved": True}},
                                  failpoints="after_record:approve_charge=kill", env=llm.env)
    assert crashed.killed and effects.count("charge_card") == 1
    llm.reply_text("Charged A1.")
    llm.reply_text("FINISH")
    resumed = kit.resume(target, "t", env=llm.env)
    assert resumed.status == "completed", resumed.stderr[-2000:]
    assert resumed.last == "Charged A1."
    assert effects.count("charge_card") == 1 and llm.pending == 0


def test_the_supervisors_routing_word_is_never_streamed(checkpointer, llm: OpenAIStandIn) -> None:
    import asyncio

    llm.reply_text("WRITER")
    llm.reply_text("Dear customer, all done.")
    llm.reply_text("FINISH")
    app = agents.build_supervisor(checkpointer)

    async def collect() -> list:
        return [c async for c in app.astream({"messages": [Message.text_message("Write to the customer")]},
                                             {"thread_id": "t-stream"})]

    chunks = asyncio.run(collect())
    # Every message and delta the caller was shown (node names aside); deltas come in pieces.
    messages = [c.message for c in chunks if c.message is not None]
    assert [m.text() for m in messages if not m.delta] == ["Write to the customer", "Dear customer, all done."]
    assert "".join(m.text() for m in messages if m.delta) == "Dear customer, all done."
    assert [r.stream for r in llm.requests] == [False, True, False]


RUNS_ON_BOTH = """
from tenxgraph.core.graph import Agent
from tenxgraph.core.state import Message
from tenxgraph.prebuilt.agent import PlanActReflectAgent, RAGAgent, SupervisorTeamAgent, WorkerConfig
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

M = "openai/gpt-4o-mini"

class Hit:
    def __init__(self, content):
        self.content = content

class Store:
    async def asearch(self, config, query, **kw):
        return [Hit("Refunds take 5 business days."), Hit("Support is open 9-5.")]

class Reverse:
    async def arerank(self, query, documents, top_n):
        return list(reversed(documents))[:top_n]

def texts(messages):
    return [[m.role, m.text()] for m in messages]

out = {}
# One checkpointer for the three graphs: 10xGraph binds the first one it sees process-wide.
cp = InMemoryCheckpointer()
app = RAGAgent(store=Store(), agent=Agent(model=M, system_prompt=[{"role": "system", "content": "Answer."}]),
               reranker=Reverse(), top_k=2, top_n=2).compile(checkpointer=cp)
res = app.invoke({"messages": [Message.text_message("How long do refunds take?")]}, config={"thread_id": "r"})
out["rag"] = texts(res["messages"])
out["rag_thread"] = texts(cp.get_state({"thread_id": "r"}).context)
app = PlanActReflectAgent(model=M, plan_system_prompt=[{"role": "system", "content": "Plan."}],
                          reflect_system_prompt=[{"role": "system", "content": "Reflect."}]).compile(checkpointer=cp)
out["par"] = texts(app.invoke({"messages": [Message.text_message("Refund policy?")]},
                              config={"thread_id": "p"})["messages"])
out["par_internal"] = cp.get_state({"thread_id": "p"}).execution_meta.internal_data
app = SupervisorTeamAgent(supervisor_model=M, supervisor_system_prompt=[{"role": "system", "content": "Route."}],
                          workers={"WRITER": WorkerConfig(agent=Agent(model=M), description="Writes.")}
                          ).compile(checkpointer=cp)
out["sup"] = texts(app.invoke({"messages": [Message.text_message("Write to them")]},
                              config={"thread_id": "s"})["messages"])
out["sup_internal"] = cp.get_state({"thread_id": "s"}).execution_meta.internal_data
emit(out)
"""


def _script_both_sides(llm: OpenAIStandIn) -> None:
    llm.reply_text("Refunds take 5 days.")                                   # RAG: SYNTHESIZE
    for text in ("Plan: check the policy.", "Not yet.", "Policy: 5 days.", "Done. [DONE]"):
        llm.reply_text(text)                                                 # PLAN, REFLECT, PLAN, REFLECT
    for text in ("WRITER", "Dear customer.", "FINISH"):
        llm.reply_text(text)                                                 # SUPERVISOR, WRITER, SUPERVISOR


def test_runs_match_10xgraph(oracle) -> None:
    """RAGAgent, PlanActReflectAgent and SupervisorTeamAgent (tool-free, so none of our documented
    differences applies) on 10xGraph 0.10 and on tenxgraph, each against its own stand-in
    scripted alike: the same results, stored threads, counters, and the same requests."""
    sides = {}
    for side in ("theirs", "ours"):
        with OpenAIStandIn() as llm:
            _script_both_sides(llm)
            result = getattr(oracle, f"run_{side}")(RUNS_ON_BOTH, env=llm.env)
            sides[side] = (result, [r.messages for r in llm.requests], llm.pending)
    (theirs, their_requests, their_pending), (ours, our_requests, our_pending) = sides["theirs"], sides["ours"]
    assert their_pending == 0 and our_pending == 0
    assert theirs["rag"][0] == ["user", "How long do refunds take?"]
    assert theirs["rag_thread"][0][1].startswith("<context>\n[1] Support is open 9-5.")
    assert theirs["sup_internal"] == {"sta_route_history": ["WRITER"], "sta_rounds": 1}
    # Ours also records which turn the counters belong to (they are per turn: docs/differences.md).
    assert ours["par_internal"].pop("par_turn") and ours["sup_internal"].pop("sta_turn")
    assert ours == theirs
    assert our_requests == their_requests
