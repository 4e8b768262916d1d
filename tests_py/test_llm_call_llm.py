"""``tenxgraph.core.llm``: ``call_llm``, ``create_llm_client`` and the default request timeout
(``get_default_llm_timeout`` / ``set_default_llm_timeout`` / ``$AGENTFLOW_LLM_TIMEOUT``), through the
real SDKs against the local stand-ins, compared with 10xGraph 0.10 where both can run."""

from __future__ import annotations

import asyncio
import logging

import pytest

pytest.importorskip("openai")

from tenxgraph.core.llm import (  # noqa: E402
    DEFAULT_LLM_TIMEOUT_SECONDS,
    ModelConfigError,
    call_llm,
    create_llm_client,
    get_default_llm_timeout,
    set_default_llm_timeout,
)
from tenxgraph.core.llm import providers  # noqa: E402
from tenxgraph.testing.providers import AnthropicStandIn, GoogleStandIn, OpenAIStandIn  # noqa: E402
from tests_py.llm_agents.stand_in_env import serving  # noqa: E402

OTHER_ENV = ("ANTHROPIC_AUTH_TOKEN", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "AGENTFLOW_LLM_TIMEOUT")


@pytest.fixture(autouse=True)
def _no_override():  # type: ignore[no-untyped-def]
    set_default_llm_timeout(None)
    yield
    set_default_llm_timeout(None)


# --- the default timeout ----------------------------------------------------------------------


def test_timeout_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTFLOW_LLM_TIMEOUT", raising=False)
    assert get_default_llm_timeout() == DEFAULT_LLM_TIMEOUT_SECONDS == 600.0
    monkeypatch.setenv("AGENTFLOW_LLM_TIMEOUT", "42.5")
    assert get_default_llm_timeout() == 42.5
    set_default_llm_timeout(7)
    assert get_default_llm_timeout() == 7.0  # the override beats the environment
    set_default_llm_timeout(None)
    assert get_default_llm_timeout() == 42.5


@pytest.mark.parametrize("raw", ["abc", "0", "-3", "nan", "inf", "  "])
def test_a_bad_environment_timeout_is_ignored(monkeypatch: pytest.MonkeyPatch, raw: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("AGENTFLOW_LLM_TIMEOUT", raw)
    with caplog.at_level(logging.WARNING, logger="tenxgraph.llm"):
        assert get_default_llm_timeout() == 600.0
    if raw.strip():
        assert "AGENTFLOW_LLM_TIMEOUT" in caplog.text


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "10", True])
def test_a_bad_override_is_refused_and_changes_nothing(bad: object) -> None:
    set_default_llm_timeout(9)
    with pytest.raises(ModelConfigError) as err:
        set_default_llm_timeout(bad)  # type: ignore[arg-type]
    assert err.value.error_code == "LLM_CONFIG_003" and isinstance(err.value, ValueError)
    assert get_default_llm_timeout() == 9.0


def test_the_provider_layer_has_one_timeout_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    assert providers.default_timeout is get_default_llm_timeout
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    set_default_llm_timeout(12)
    # The Agent's clients are built by the same function: they get the override.
    agent_client = providers.create_client("openai", model="gpt-4o-mini", base_url=None, api_key=None, options={})
    assert agent_client.timeout == 12.0
    assert create_llm_client("openai").timeout == 12.0
    assert create_llm_client("openai", timeout=3).timeout == 3  # an explicit timeout wins


TIMEOUT_SCRIPT = """
import os
from tenxgraph.core.llm import get_default_llm_timeout, set_default_llm_timeout, DEFAULT_LLM_TIMEOUT_SECONDS
out = [DEFAULT_LLM_TIMEOUT_SECONDS, get_default_llm_timeout()]
os.environ["AGENTFLOW_LLM_TIMEOUT"] = "33"
out.append(get_default_llm_timeout())
os.environ["AGENTFLOW_LLM_TIMEOUT"] = "bad"
out.append(get_default_llm_timeout())
set_default_llm_timeout(5)
out.append(get_default_llm_timeout())
try:
    set_default_llm_timeout(-1)
except ValueError:
    out.append("ValueError")
set_default_llm_timeout(None)
out.append(get_default_llm_timeout())
emit(out)
"""


def test_timeout_rules_match_10xgraph(oracle) -> None:  # type: ignore[no-untyped-def]
    theirs, ours = oracle.run_both(TIMEOUT_SCRIPT, env={"AGENTFLOW_LLM_TIMEOUT": ""})
    assert ours == theirs == [600.0, 600.0, 33.0, 600.0, 5, "ValueError", 600.0]


# --- create_llm_client ------------------------------------------------------------------------


def test_create_llm_client_builds_each_sdk_client(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("anthropic")
    pytest.importorskip("google.genai")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("GEMINI_API_KEY", "g-test")
    monkeypatch.delenv("GOOGLE_GENAI_USE_VERTEXAI", raising=False)
    from anthropic import AsyncAnthropic
    from google import genai
    from openai import AsyncOpenAI

    o = create_llm_client("openai", base_url="http://127.0.0.1:9/v1")
    assert isinstance(o, AsyncOpenAI) and str(o.base_url).startswith("http://127.0.0.1:9")
    assert o.max_retries == 2  # the SDK's own default: a client the user asked for keeps it
    assert isinstance(create_llm_client("anthropic"), AsyncAnthropic)
    assert isinstance(create_llm_client("google"), genai.Client)


def test_create_llm_client_bad_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelConfigError) as err:
        create_llm_client("cohere")
    assert err.value.error_code == "LLM_CONFIG_002" and isinstance(err.value, ValueError)
    with pytest.raises(ModelConfigError) as err:
        create_llm_client("openai")
    assert err.value.error_code == "LLM_CONFIG_001"
    with pytest.raises(ModelConfigError) as err:
        create_llm_client("anthropic", api_key="k", anthropic_backend="bedrock")
    assert err.value.error_code == "LLM_CONFIG_002"
    pytest.importorskip("google.genai")
    with pytest.raises(ModelConfigError) as err:
        create_llm_client("google", use_vertex_ai=True)
    assert err.value.error_code == "LLM_CONFIG_002"


# --- call_llm ---------------------------------------------------------------------------------

CASES = {
    "openai-responses": (OpenAIStandIn, "gpt-4o-mini", "responses"),
    "openai-chat": (OpenAIStandIn, "openai/gpt-4o-mini", "chat"),
    "anthropic": (AnthropicStandIn, "claude-sonnet-4-5", "responses"),
    "google": (GoogleStandIn, "gemini/gemini-2.5-flash", "responses"),
}

CALL_SCRIPT = """
import asyncio
from tenxgraph.core.llm import call_llm
out = asyncio.run(call_llm({model!r}, "What happened?", system_prompt="Be brief.", max_tokens=77,
                           temperature=0.5, api_style={style!r}))
emit(list(out))
"""


def _sent(req) -> dict:  # type: ignore[no-untyped-def]
    """What a request says, in each API's own field names. A Responses ``input`` given as a bare
    string (10xGraph's) is the same request as the one user item our adapter sends."""
    b = req.body
    keys = ("model", "instructions", "input", "messages", "system", "max_output_tokens", "max_tokens",
            "temperature", "systemInstruction", "contents", "generationConfig")
    out = {k: b[k] for k in keys if k in b}
    if isinstance(out.get("input"), str):
        out["input"] = [{"role": "user", "content": out["input"]}]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_call_llm_sends_and_returns_what_10xgraph_does(case: str, oracle, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    if case != "openai-responses":
        pytest.importorskip("anthropic")
        pytest.importorskip("google.genai")
    stand_in, model, style = CASES[case]
    for llm in serving(stand_in, monkeypatch, drop=OTHER_ENV):
        script = CALL_SCRIPT.format(model=model, style=style)
        llm.reply_text("It rained.")
        ours = oracle.run_ours(script, env=llm.env)
        assert ours[0] == "It rained." and ours[3] == 0
        assert ours[1] > 0 and ours[2] > 0  # the stand-in's usage reached the tuple
        if case == "anthropic":
            # 10xGraph 0.10's call_llm cannot call Anthropic with the SDK its install resolves (2.x
            # has no ``temperature``; 10xGraph passes it: a TypeError), so ours alone, without it.
            import anthropic

            body = llm.requests[0].body
            assert (body["model"], body["max_tokens"]) == ("claude-sonnet-4-5", 77)
            assert body.get("temperature") == (None if anthropic.__version__.startswith("2.") else 0.5)
            assert body["system"][0]["text"] == "Be brief."
            assert body["messages"] == [{"role": "user", "content": "What happened?"}]
            return
        llm.reply_text("It rained.")
        theirs = oracle.run_theirs(script, env=llm.env)
        assert [r.reply for r in llm.requests] == ["text", "text"]
        assert _sent(llm.requests[0]) == _sent(llm.requests[1]), (llm.requests[0].body, llm.requests[1].body)
        # The same reply back; token counts are the stand-in's word counts of each request's JSON,
        # whose shapes differ (see _sent), so only the text and cache count are compared.
        assert (ours[0], ours[3]) == (theirs[0], theirs[3]), (theirs, ours)


def test_call_llm_in_process_and_its_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for llm in serving(OpenAIStandIn, monkeypatch, drop=OTHER_ENV):
        llm.reply_text("hello there")
        text, inp, out, cached = asyncio.run(call_llm("gpt-4o-mini", "hi", api_style="chat"))
        assert (text, cached) == ("hello there", 0) and inp > 0 and out > 0
        assert llm.requests[-1].body["max_tokens"] == 1024 and llm.requests[-1].body["temperature"] == 0.3
        with pytest.raises(ModelConfigError) as err:
            asyncio.run(call_llm("gpt-4o-mini", "hi", api_style="graphql"))  # type: ignore[arg-type]
        assert err.value.error_code == "LLM_CONFIG_003"
        assert len(llm.requests) == 1  # refused before any request
        llm.reply_error(400, "bad request")
        import openai

        with pytest.raises(openai.BadRequestError):
            asyncio.run(call_llm("gpt-4o-mini", "hi"))
