"""Prebuilt agents: graphs of ordinary nodes (Agents, ToolNodes, handoffs and small functions),
so every durable guarantee of the runtime holds in them. 10xGraph 0.10's set; ``AudioAgent``
imports but is not supported (see docs/migrating-from-10xgraph.md)."""

from tenxgraph.prebuilt.agent.audio import AudioAgent
from tenxgraph.prebuilt.agent.plan_act_reflect import PlanActReflectAgent
from tenxgraph.prebuilt.agent.rag import BaseReranker, CohereReranker, CrossEncoderReranker, RAGAgent
from tenxgraph.prebuilt.agent.react import ReactAgent
from tenxgraph.prebuilt.agent.structured_output import StructuredOutputAgent
from tenxgraph.prebuilt.agent.supervisor_team import SupervisorTeamAgent, WorkerConfig
from tenxgraph.prebuilt.agent.swarm import SwarmAgent, SwarmMemberConfig

__all__ = [
    "AudioAgent",
    "BaseReranker",
    "CohereReranker",
    "CrossEncoderReranker",
    "PlanActReflectAgent",
    "RAGAgent",
    "ReactAgent",
    "StructuredOutputAgent",
    "SupervisorTeamAgent",
    "SwarmAgent",
    "SwarmMemberConfig",
    "WorkerConfig",
]
