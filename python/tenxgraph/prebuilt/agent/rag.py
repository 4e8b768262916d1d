"""RAGAgent: RETRIEVE (``store.asearch``) -> RERANK (only with a reranker) -> SYNTHESIZE (the
given agent, the documents put before the user's question in a ``<context>`` block) -> END.
10xGraph's constructor, node names and edges.

The documents found are kept in ``state.execution_meta.internal_data["rag_docs"]`` (a list of
str), committed with the RETRIEVE (and RERANK) step: a crash after RETRIEVE does not search
again, and SYNTHESIZE answers from the same documents.

The store is anything with 10xGraph's ``BaseStore.asearch`` signature (``config``, ``query``,
``limit``, ``score_threshold``, ``retrieval_strategy``) returning results with a ``content``
attribute (or plain str); tenxgraph ships no vector store.
"""

from __future__ import annotations

import asyncio
import logging
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.prebuilt.agent._base import PrebuiltGraph, last_user_text
from tenxgraph.prebuilt.errors import PrebuiltConfigError, PrebuiltExtraMissingError
from tenxgraph.utils.constants import END

__all__ = ["BaseReranker", "CohereReranker", "CrossEncoderReranker", "RAGAgent", "RetrievalStrategy"]

_log = logging.getLogger("tenxgraph.prebuilt.rag")
StateT = TypeVar("StateT", bound=AgentState)
DOCS_KEY = "rag_docs"


class RetrievalStrategy(str, Enum):
    """The strategies 10xGraph's stores accept (its ``store_schema.RetrievalStrategy`` values)."""

    SIMILARITY = "similarity"
    TEMPORAL = "temporal"
    RELEVANCE = "relevance"
    HYBRID = "hybrid"
    GRAPH_TRAVERSAL = "graph_traversal"


@runtime_checkable
class BaseReranker(Protocol):
    """A reranker: ``await arerank(query, documents, top_n)`` returns at most ``top_n`` of the
    documents, best first. Any object with that method is one (a structural protocol)."""

    async def arerank(self, query: str, documents: list[str], top_n: int) -> list[str]:
        """The ``top_n`` documents most relevant to ``query``, best first."""
        ...


def _missing(what: str, package: str, extra: str) -> PrebuiltExtraMissingError:
    return PrebuiltExtraMissingError(
        f"{what} needs the '{package}' package, which is not installed: pip install \"10xgraph[{extra}]\" "
        f"(or pip install {package})", context={"package": package, "extra": extra})


class CohereReranker:
    """Reranks with Cohere's Rerank API (``pip install "10xgraph[cohere]"``; a network service
    and an API key). Without the package the constructor raises
    :class:`PrebuiltExtraMissingError` (an ``ImportError``, ``PREBUILT_002``)."""

    def __init__(self, api_key: str, model: str = "rerank-v4.0-pro") -> None:
        try:
            import cohere  # noqa: F401
        except ImportError as exc:
            raise _missing("CohereReranker", "cohere", "cohere") from exc
        self._api_key = api_key
        self._model = model
        self._client: Any = None

    async def arerank(self, query: str, documents: list[str], top_n: int) -> list[str]:
        """The ``top_n`` documents Cohere ranks highest for ``query``."""
        if not documents:
            return []
        if self._client is None:
            import cohere

            self._client = cohere.AsyncClientV2(self._api_key)
        response = await self._client.rerank(model=self._model, query=query, documents=documents,
                                             top_n=min(top_n, len(documents)))
        return [documents[r.index] for r in response.results]


class CrossEncoderReranker:
    """Reranks with a local sentence-transformers CrossEncoder (``pip install
    "10xgraph[rerank]"``; the model is downloaded from its hub on first use). Without the
    package the constructor raises :class:`PrebuiltExtraMissingError` (``PREBUILT_002``)."""

    def __init__(self, model: str = "cross-encoder/ms-marco-MiniLM-L-6-v2") -> None:
        try:
            from sentence_transformers import CrossEncoder  # noqa: F401
        except ImportError as exc:
            raise _missing("CrossEncoderReranker", "sentence-transformers", "rerank") from exc
        self._model_name = model
        self._encoder: Any = None

    async def arerank(self, query: str, documents: list[str], top_n: int) -> list[str]:
        """The ``top_n`` documents the CrossEncoder scores highest (scored off the event loop)."""
        if not documents:
            return []
        if self._encoder is None:
            from sentence_transformers import CrossEncoder

            self._encoder = CrossEncoder(self._model_name)
        scores = await asyncio.to_thread(self._encoder.predict, [[query, d] for d in documents])
        ranked = sorted(zip(scores, documents, strict=False), key=lambda x: x[0], reverse=True)
        return [doc for _, doc in ranked[:top_n]]


def _content(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        return str(result.get("content") or "")
    return str(getattr(result, "content", "") or "")


def context_block(docs: list[str], question: str) -> str:
    """The user message SYNTHESIZE sends: numbered documents in ``<context>``, then the question."""
    numbered = "\n".join(f"[{i + 1}] {doc.strip()}" for i, doc in enumerate(docs))
    return f"<context>\n{numbered}\n</context>\n\n{question}"


class RAGAgent(PrebuiltGraph, Generic[StateT]):
    """Retrieve -> (rerank) -> synthesize. RETRIEVE searches ``store`` for the last user
    message (``top_k`` results); RERANK (only with ``reranker``) keeps ``top_n``; SYNTHESIZE runs
    ``agent`` (an :class:`Agent` or any BaseAgent) with the last user message replaced by the
    documents and the question, as 10xGraph does (the replaced message is what the thread keeps).
    ``top_k`` or ``top_n`` below 1 raises :class:`PrebuiltConfigError` (a ``ValueError``)."""

    def __init__(  # noqa: PLR0913 - 10xGraph's signature
        self,
        store: Any,
        agent: Any,
        reranker: BaseReranker | None = None,
        top_k: int = 5,
        top_n: int = 3,
        retrieval_strategy: RetrievalStrategy | str = RetrievalStrategy.SIMILARITY,
        score_threshold: float | None = None,
        store_config: dict[str, Any] | None = None,
        state: StateT | None = None,
        context_manager: Any = None,
        publisher: Any = None,
        id_generator: Any = None,
        container: Any = None,
    ) -> None:
        if top_k < 1:
            raise PrebuiltConfigError("top_k must be >= 1", context={"top_k": top_k})
        if top_n < 1:
            raise PrebuiltConfigError("top_n must be >= 1", context={"top_n": top_n})
        if not callable(getattr(store, "asearch", None)):
            raise PrebuiltConfigError(f"store must have an async asearch(config, query, ...) method, got "
                                      f"{type(store).__name__}", context={"store": type(store).__name__})
        if reranker is not None and not callable(getattr(reranker, "arerank", None)):
            raise PrebuiltConfigError(f"reranker must have an async arerank(query, documents, top_n) method, got "
                                      f"{type(reranker).__name__}", context={"reranker": type(reranker).__name__})
        self._store = store
        self._agent = agent
        self._reranker = reranker
        self._top_k = top_k
        self._top_n = top_n
        self._retrieval_strategy = retrieval_strategy
        self._score_threshold = score_threshold
        self._store_config = dict(store_config or {})
        self._init_graph(state, context_manager, publisher, id_generator, container)

    async def _retrieve(self, state: AgentState, config: dict[str, Any]) -> AgentState:
        query = last_user_text(state)
        docs: list[str] = []
        if not query:
            _log.warning("RAGAgent RETRIEVE: no user message in the context")
        else:
            results = await self._store.asearch(config=self._store_config, query=query, limit=self._top_k,
                                                score_threshold=self._score_threshold,
                                                retrieval_strategy=self._retrieval_strategy)
            docs = [c for c in (_content(r) for r in results or []) if c]
        state.execution_meta.internal_data[DOCS_KEY] = docs
        return state

    async def _rerank(self, state: AgentState, config: dict[str, Any]) -> AgentState:
        docs = state.execution_meta.internal_data.get(DOCS_KEY) or []
        if docs:
            ranked = await self._reranker.arerank(last_user_text(state), list(docs), top_n=self._top_n)  # type: ignore[union-attr]
            state.execution_meta.internal_data[DOCS_KEY] = list(ranked)
        return state

    async def _synthesize(self, state: AgentState, config: dict[str, Any]) -> Any:
        docs = state.execution_meta.internal_data.get(DOCS_KEY) or []
        if docs:
            context = list(state.context)
            index = next((i for i in range(len(context) - 1, -1, -1) if context[i].role == "user"), -1)
            question = context[index].text() if index >= 0 else ""
            if question:
                context[index] = Message.text_message(context_block(docs, question), role="user")
                state.context = context
        return await self._agent.execute(state, config)

    def _configure_graph(self) -> None:
        g = self._graph = self._new_graph()
        g.add_node("RETRIEVE", self._retrieve)
        g.add_node("SYNTHESIZE", self._synthesize)
        g.set_entry_point("RETRIEVE")
        if self._reranker is not None:
            g.add_node("RERANK", self._rerank)
            g.add_edge("RETRIEVE", "RERANK")
            g.add_edge("RERANK", "SYNTHESIZE")
        else:
            g.add_edge("RETRIEVE", "SYNTHESIZE")
        g.add_edge("SYNTHESIZE", END)
