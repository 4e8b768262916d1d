"""The prebuilt agents as graph factories for the crash kit's child processes, each with a tool
that records its side effect in the test's EffectCounter (``charge_card``), so a test can count
charges across killed processes. The model is the test's OpenAIStandIn (``OPENAI_BASE_URL``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tenxgraph.core.graph import Agent, ToolNode
from tenxgraph.prebuilt.agent import (
    PlanActReflectAgent,
    RAGAgent,
    StructuredOutputAgent,
    SupervisorTeamAgent,
    SwarmAgent,
    SwarmMemberConfig,
    WorkerConfig,
)
from tenxgraph.testing import EffectCounter

MODEL = "openai/gpt-4o-mini"
SYSTEM = [{"role": "system", "content": "You are a billing assistant."}]


def charge_card(order_id: str, amount: float) -> str:
    """Charge the customer's card for an order."""
    EffectCounter.from_env().record("charge_card", order_id=order_id, amount=amount)
    return f"Charged ${amount} for {order_id}."


class Invoice(BaseModel):
    order_id: str
    amount: float


class KnowledgeBase:
    """A store with 10xGraph's ``asearch`` signature over a fixed list; each search is recorded,
    so a test sees whether RETRIEVE ran again after a crash."""

    DOCS = ("Refunds take 5 business days.", "Charges appear as TENX on statements.", "Support is open 9-5.")

    async def asearch(self, config: dict[str, Any], query: str, limit: int = 10, score_threshold: Any = None,
                      retrieval_strategy: Any = None, **_: Any) -> list[Any]:
        EffectCounter.from_env().record("kb_search", query=query, limit=limit)
        words = {w.strip("?.,").lower() for w in query.split()}
        hits = [d for d in self.DOCS if words & {w.strip(".").lower() for w in d.split()}]
        return [type("Hit", (), {"content": d})() for d in hits[:limit]]


class KeepTwo:
    """A user's own reranker (BaseReranker): the last ``top_n`` documents, reversed."""

    async def arerank(self, query: str, documents: list[str], top_n: int) -> list[str]:
        return list(reversed(documents))[:top_n]


def build_plan_act_reflect(checkpointer: Any):
    return PlanActReflectAgent(model=MODEL, tools=[charge_card], max_iterations=3).compile(checkpointer=checkpointer)


def build_structured_output(checkpointer: Any):
    return StructuredOutputAgent(model=MODEL, output_schema=Invoice, tools=[charge_card], system_prompt=SYSTEM,
                                 max_attempts=2).compile(checkpointer=checkpointer)


def build_rag(checkpointer: Any):
    return RAGAgent(store=KnowledgeBase(), agent=Agent(model=MODEL, system_prompt=SYSTEM), reranker=KeepTwo(),
                    top_k=3, top_n=2).compile(checkpointer=checkpointer)


def build_supervisor(checkpointer: Any):
    return SupervisorTeamAgent(
        supervisor_model=MODEL,
        workers={
            "BILLER": WorkerConfig(agent=Agent(model=MODEL, system_prompt=SYSTEM, tool_node=ToolNode([charge_card])),
                                   description="Charges cards."),
            "WRITER": WorkerConfig(agent=Agent(model=MODEL), description="Writes the reply to the customer."),
        },
        max_rounds=4,
    ).compile(checkpointer=checkpointer)


def build_swarm(checkpointer: Any):
    return SwarmAgent(
        members={
            "TRIAGE": SwarmMemberConfig(agent=Agent(model=MODEL, system_prompt=SYSTEM), can_handoff_to=["BILLER"],
                                        description="Routes requests."),
            "BILLER": SwarmMemberConfig(agent=Agent(model=MODEL, tool_node=ToolNode([charge_card])),
                                        can_handoff_to=[], description="Charges cards."),
        },
        entry="TRIAGE",
    ).compile(checkpointer=checkpointer)


def build_file_writer(checkpointer: Any):
    """A ReactAgent with the prebuilt file tools; the root comes from the run config."""
    from tenxgraph.prebuilt.agent import ReactAgent
    from tenxgraph.prebuilt.tools import file_read, file_write

    return ReactAgent(model=MODEL, tools=[file_read, file_write]).compile(checkpointer=checkpointer)


def approve_charge(order_id: str, amount: float) -> str:
    """Charge a card after a reviewer approves."""
    from tenxgraph.utils import interrupt

    decision = interrupt({"amount": amount}, message=f"Charge ${amount}?")
    if not decision.get("approved"):
        return "Charge declined by reviewer."
    EffectCounter.from_env().record("charge_card", order_id=order_id, amount=amount)
    return f"Charged ${amount} for {order_id}."


def build_supervisor_with_approval(checkpointer: Any):
    return SupervisorTeamAgent(
        supervisor_model=MODEL,
        workers={"BILLER": WorkerConfig(agent=Agent(model=MODEL, tool_node=ToolNode([approve_charge])),
                                        description="Charges cards.")},
        max_rounds=2,
    ).compile(checkpointer=checkpointer)
