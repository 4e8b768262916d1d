"""Context managers and model-call settings that misbehaved (session 31 red-team), against the
local OpenAI stand-in:

- ``SummaryContextManager`` remembered summaries by the ids of the messages they cover, so a
  thread whose ids were another thread's (per-thread counters 1, 2, 3) was given that thread's
  summary: another conversation's content in its prompt;
- its cut was a plain count: it kept tool results whose assistant call was summarised away, an
  orphaned result every provider refuses, on every later turn of the thread;
- ``MessageContextManager`` took ``max_messages=1.5``, ``"3"`` or ``None`` and failed on a later
  turn with a bare ``TypeError``;
- a large back-off (``backoff_factor=1e200``, or 2.0 past 1,024 retries) ended the retries in a
  bare ``OverflowError``;
- a Responses API stream without one event of the API was ``LLM_PROVIDER_003`` (the endpoint
  "could not be reached"), where the other providers say ``LLM_PROVIDER_005``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("openai")

from tenxgraph.core.exceptions import NodeError  # noqa: E402
from tenxgraph.core.graph import RetryConfig  # noqa: E402
from tenxgraph.core.llm import ModelConfigError  # noqa: E402
from tenxgraph.core.llm.errors import ModelCallError  # noqa: E402
from tenxgraph.core.llm.retry import backoff_delay  # noqa: E402
from tenxgraph.core.state import AgentState, Message, MessageContextManager, SummaryContextManager  # noqa: E402
from tenxgraph.prebuilt.agent import ReactAgent  # noqa: E402
from tenxgraph.storage.checkpointer import InMemoryCheckpointer  # noqa: E402
from tenxgraph.testing.providers import OpenAIStandIn  # noqa: E402
from tests_py.llm_agents.stand_in_env import serving  # noqa: E402


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    yield from serving(OpenAIStandIn, monkeypatch, drop=("AGENTFLOW_LLM_TIMEOUT",))


def numbered(owner: str, n: int) -> list[Message]:
    """n turns whose ids are 1..n, as a per-thread counter makes them."""
    out = []
    for i in range(1, n + 1):
        m = Message.text_message(f"{owner} says secret {owner.upper()}-{i}", role="user" if i % 2 else "assistant")
        m.message_id = str(i)
        out.append(m)
    return out


def summary_request_text(llm: OpenAIStandIn, index: int) -> str:
    body = llm.requests[index].body
    items = body["input"]
    return items if isinstance(items, str) else json.dumps(items)


def test_a_summary_is_never_given_to_another_thread_whose_ids_match(llm: OpenAIStandIn) -> None:
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=4, keep_recent=2)
    llm.reply_text("alice's summary")
    llm.reply_text("bob's summary")
    alice = asyncio.run(mgr.atrim_context(AgentState(context=numbered("alice", 6))))
    bob = asyncio.run(mgr.atrim_context(AgentState(context=numbered("bob", 6))))
    assert alice.context_summary == "alice's summary"
    assert bob.context_summary == "bob's summary"
    assert len(llm.requests) == 2
    assert "ALICE" not in summary_request_text(llm, 1) and "BOB-1" in summary_request_text(llm, 1)
    # The same thread's next turn still reuses its own summary (one request for the new messages).
    llm.reply_text("alice's later part")
    later = asyncio.run(mgr.atrim_context(AgentState(context=numbered("alice", 8))))
    assert later.context_summary == "alice's summary\n\nalice's later part"
    assert "ALICE-1" not in summary_request_text(llm, 2) and "ALICE-5" in summary_request_text(llm, 2)


def tool_exchange() -> list[Message]:
    ask = Message.text_message("checking both", role="assistant")
    ask.tools_calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                       for i in (1, 2)]
    results = [Message.tool_message(content=[], meta={"tool_call_id": f"c{i}"}) for i in (1, 2)]
    return [Message.text_message("u0"), Message.text_message("a1", role="assistant"), Message.text_message("u2"),
            ask, *results, Message.text_message("both done", role="assistant")]


def test_the_cut_keeps_tool_results_with_the_call_that_asked_for_them(llm: OpenAIStandIn) -> None:
    # keep_recent=2 would keep the second result and the reply: the result's call summarised away.
    llm.reply_text("the user asked twice")
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=5, keep_recent=2)
    out = asyncio.run(mgr.atrim_context(AgentState(context=tool_exchange())))
    kept = out.context
    assert kept[0].tools_calls and [m.role for m in kept] == ["assistant", "tool", "tool", "assistant"]
    asked = {c["id"] for m in kept for c in (m.tools_calls or [])}
    answered = {m.metadata.get("tool_call_id") for m in kept if m.role == "tool"}
    assert answered <= asked
    assert out.context_summary == "the user asked twice"


def test_a_cut_with_only_a_tool_exchange_left_to_summarise_keeps_everything(llm: OpenAIStandIn) -> None:
    # Everything before keep_recent is the call and its results: nothing can be cut.
    mgr = SummaryContextManager("gpt-4o-mini", max_messages=3, keep_recent=2)
    msgs = tool_exchange()[3:]
    out = asyncio.run(mgr.atrim_context(AgentState(context=list(msgs))))
    assert [m.message_id for m in out.context] == [m.message_id for m in msgs]
    assert llm.requests == [] and out.context_summary is None


@pytest.mark.parametrize("value", [1.5, "3", None, True, -1])
def test_message_context_manager_refuses_a_bad_max_messages(value: Any) -> None:
    with pytest.raises(ModelConfigError) as err:
        MessageContextManager(max_messages=value)
    assert err.value.error_code == "LLM_CONFIG_003"
    assert isinstance(err.value, ValueError)  # what 10xGraph raised for a negative value


@pytest.mark.parametrize("cfg,retry", [
    (RetryConfig(backoff_factor=1e200, max_delay=5.0), 3),
    (RetryConfig(initial_delay=1.0, max_delay=7.0), 1100),
    (RetryConfig(initial_delay=0, max_delay=0), 1100),
    (RetryConfig(initial_delay=0, backoff_factor=1e200, max_delay=9.0), 5),
])
def test_a_large_back_off_is_capped_not_an_overflow(cfg: RetryConfig, retry: int) -> None:
    delay = backoff_delay(RuntimeError("boom"), cfg, retry)
    assert delay == (0.0 if cfg.initial_delay == 0 else cfg.max_delay)


def test_a_responses_stream_without_one_event_of_the_api_is_an_unreadable_reply(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class NoEvents(OpenAIStandIn):
        def _serve(self, handler: Any, api: str, body: Any, reply: Any, n: int, stream: bool) -> None:
            handler.send_events([b'data: {"foo": 1}\n\n', b'data: {"bar": 2}\n\n'])

    for server in serving(NoEvents, monkeypatch, drop=("AGENTFLOW_LLM_TIMEOUT",)):
        for _ in range(2):
            server.reply_text("never served")
        agent = ReactAgent(model="openai/gpt-4o-mini", tools=[], api_style="responses",
                           retry_config=RetryConfig(max_retries=1, initial_delay=0.01, max_delay=0.02))
        app = agent.compile(checkpointer=InMemoryCheckpointer())

        async def go() -> Any:
            return [c async for c in app.astream({"messages": [Message.text_message("hi")]}, {"thread_id": "t"})]

        with pytest.raises(NodeError) as err:
            asyncio.run(asyncio.wait_for(go(), timeout=120))
        cause = err.value.__cause__
        assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_005", repr(cause)
        assert server.requests and all(r.path.endswith("/responses") for r in server.requests)
