"""Bad constructor arguments of the prebuilt agents, rerankers without their package and
AudioAgent: typed errors with codes, each also the builtin type 10xGraph raises."""

from __future__ import annotations

import importlib.util

import pytest

from tenxgraph.core.graph import Agent
from tenxgraph.prebuilt.agent import (
    AudioAgent,
    BaseReranker,
    CohereReranker,
    CrossEncoderReranker,
    RAGAgent,
    SupervisorTeamAgent,
    SwarmAgent,
    SwarmMemberConfig,
    WorkerConfig,
)
from tenxgraph.prebuilt.errors import PrebuiltConfigError, PrebuiltExtraMissingError, PrebuiltNotSupportedError

M = "openai/gpt-4o-mini"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")


class _Store:
    async def asearch(self, config, query, **kw):
        return []


def test_bad_constructor_arguments_are_typed() -> None:
    worker = WorkerConfig(agent=Agent(model=M))
    cases = [
        lambda: SupervisorTeamAgent(supervisor_model=M, workers={}),
        lambda: SupervisorTeamAgent(supervisor_model=M, workers={"SUPERVISOR": worker}),
        lambda: SupervisorTeamAgent(supervisor_model=M, workers={"PRE_SUPERVISOR": worker}),
        lambda: SwarmAgent(members={}, entry="A"),
        lambda: SwarmAgent(members={"A": SwarmMemberConfig(agent=Agent(model=M))}, entry="B"),
        lambda: SwarmAgent(members={"A": SwarmMemberConfig(agent=Agent(model=M), can_handoff_to=["NOBODY"])},
                           entry="A").compile(),
        lambda: RAGAgent(store=_Store(), agent=Agent(model=M), top_k=0),
        lambda: RAGAgent(store=_Store(), agent=Agent(model=M), top_n=0),
        lambda: RAGAgent(store=object(), agent=Agent(model=M)),
        lambda: RAGAgent(store=_Store(), agent=Agent(model=M), reranker=object()),  # type: ignore[arg-type]
    ]
    for make in cases:
        with pytest.raises(PrebuiltConfigError) as info:
            make()
        assert isinstance(info.value, ValueError)
        assert info.value.error_code == "PREBUILT_001"


@pytest.mark.parametrize(("make", "package", "extra"), [
    (lambda: CohereReranker(api_key="k"), "cohere", "cohere"),
    (lambda: CrossEncoderReranker(), "sentence-transformers", "rerank"),
], ids=["cohere", "cross-encoder"])
def test_rerankers_without_their_package_name_the_extra(make, package: str, extra: str) -> None:
    if importlib.util.find_spec(package.replace("-", "_")) is not None:
        pytest.skip(f"{package} is installed here; the missing-package error cannot be observed")
    with pytest.raises(PrebuiltExtraMissingError) as info:
        make()
    assert isinstance(info.value, ImportError)
    assert info.value.error_code == "PREBUILT_002"
    assert f'pip install "10xgraph[{extra}]"' in str(info.value) and package in str(info.value)


def test_a_users_own_reranker_is_a_base_reranker() -> None:
    class Mine:
        async def arerank(self, query: str, documents: list[str], top_n: int) -> list[str]:
            return documents[:top_n]

    assert isinstance(Mine(), BaseReranker)
    assert not isinstance(object(), BaseReranker)
    RAGAgent(store=_Store(), agent=Agent(model=M), reranker=Mine()).compile()


def test_audio_agent_imports_and_says_it_is_not_supported() -> None:
    with pytest.raises(PrebuiltNotSupportedError) as info:
        AudioAgent(model="gpt-realtime", system_prompt=[])
    assert isinstance(info.value, NotImplementedError)
    assert info.value.error_code == "PREBUILT_003"
    assert "AudioAgent" in str(info.value) and "not supported" in str(info.value)


def test_every_10xgraph_prebuilt_name_imports() -> None:
    import tenxgraph.prebuilt as prebuilt
    import tenxgraph.prebuilt.agent as agent_pkg
    import tenxgraph.prebuilt.tools as tools_pkg

    # 10xGraph 0.10's lists.
    assert set(agent_pkg.__all__) == {
        "AudioAgent", "BaseReranker", "CohereReranker", "CrossEncoderReranker", "PlanActReflectAgent", "RAGAgent",
        "ReactAgent", "StructuredOutputAgent", "SupervisorTeamAgent", "SwarmAgent", "SwarmMemberConfig",
        "WorkerConfig"}
    assert set(tools_pkg.__all__) == {
        "create_handoff_tool", "fetch_url", "file_read", "file_search", "file_write", "google_web_search",
        "is_handoff_tool", "make_agent_memory_tool", "make_user_memory_tool", "memory_tool", "safe_calculator",
        "vertex_ai_search"}
    for name in prebuilt.__all__:
        assert getattr(prebuilt, name) is not None
    assert {"MessageContextManager", "SummaryContextManager"} <= set(prebuilt.__all__)
