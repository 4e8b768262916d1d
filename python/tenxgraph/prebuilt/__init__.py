"""Prebuilt agents (``tenxgraph.prebuilt.agent``) and tools (``tenxgraph.prebuilt.tools``).

The names 10xGraph 0.10 re-exports here load on first access (PEP 562), so importing
``tenxgraph.prebuilt.tools`` never pulls in the LLM layer.
"""

from __future__ import annotations


from tenxgraph._lazy import lazy_exports

_AGENTS = ("AudioAgent", "BaseReranker", "CohereReranker", "CrossEncoderReranker", "PlanActReflectAgent", "RAGAgent",
           "ReactAgent", "StructuredOutputAgent", "SupervisorTeamAgent", "SwarmAgent", "SwarmMemberConfig",
           "WorkerConfig")
_TOOLS = ("create_handoff_tool", "fetch_url", "file_read", "file_search", "file_write", "google_web_search",
          "is_handoff_tool", "make_agent_memory_tool", "make_user_memory_tool", "memory_tool", "safe_calculator",
          "vertex_ai_search")
# 10xGraph re-exports its context managers here too.
_FROM = {**dict.fromkeys(_AGENTS, "tenxgraph.prebuilt.agent"), **dict.fromkeys(_TOOLS, "tenxgraph.prebuilt.tools"),
         "MessageContextManager": "tenxgraph.core.state.context_manager",
         "SummaryContextManager": "tenxgraph.core.state.summary_context_manager"}

__all__ = sorted(_FROM)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _FROM)
