"""Replies of OpenAI-compatible, Anthropic and Gemini endpoints that the provider layer read
wrongly (session 31 red-team), through the real SDKs against a local stand-in server:

- streamed tool-call deltas without an ``index`` (some OpenAI-compatible servers): two calls
  were merged into one call named ``weatherweather`` (neither ran), or the turn died in a bare
  ``TypeError`` beside an indexed call;
- a completion of an unexpected shape (``message: null``, ``choices`` a string, a tool call
  without a name, an int id, an Anthropic ``tool_use`` without an id): a bare ``AttributeError``
  or ``TypeError`` without a code, never retried. Now an ``UnreadableReplyError``
  (``LLM_PROVIDER_005``), except what can be read: ``arguments`` sent as an object, ``content``
  sent as a list of parts, an int id, and a call without a name (a tool error the model reads);
- an error event inside a stream that answered 200 (Anthropic's ``overloaded_error``, OpenAI's
  ``server_error`` chunk): not retried, and OpenAI's reported as "could not be reached";
- an empty reply (Anthropic ``content: []``, a Gemini candidate without parts) stored as an
  assistant message and sent back as empty content on every later turn, which both providers
  refuse with 400: the thread was wedged;
- a Responses API stream without one event of the API: ``LLM_PROVIDER_003``, where every other
  provider says ``LLM_PROVIDER_005``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("anthropic")
pytest.importorskip("google.genai")

from tenxgraph.core.exceptions import NodeError  # noqa: E402
from tenxgraph.core.graph import RetryConfig  # noqa: E402
from tenxgraph.core.llm.errors import ModelCallError, UnreadableReplyError  # noqa: E402
from tenxgraph.core.state import Message  # noqa: E402
from tenxgraph.prebuilt.agent import ReactAgent  # noqa: E402
from tenxgraph.storage.checkpointer import InMemoryCheckpointer  # noqa: E402
from tenxgraph.testing.providers import AnthropicStandIn, GoogleStandIn, OpenAIStandIn  # noqa: E402
from tests_py.llm_agents.stand_in_env import serving  # noqa: E402

OTHER_ENV = ("ANTHROPIC_AUTH_TOKEN", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI")
FAST_RETRY = RetryConfig(max_retries=1, initial_delay=0.01, max_delay=0.02)


def _raw(base: type) -> type:
    """The stand-in, serving the bodies queued in ``raw`` first (as-is: status, content type,
    bytes), then its scripted replies."""

    class Raw(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.raw: list[tuple[str, bytes]] = []

        def _serve(self, handler: Any, api: str, body: Any, reply: Any, n: int, stream: bool) -> None:
            if not self.raw:
                return super()._serve(handler, api, body, reply, n, stream)
            ctype, payload = self.raw.pop(0)
            handler.send_response(200)
            handler.send_header("content-type", ctype)
            handler.send_header("content-length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            handler.close_connection = True

    return Raw


def _sse(*events: Any) -> tuple[str, bytes]:
    out = b""
    for e in events:
        if isinstance(e, tuple):  # (event name, data): Anthropic's framing
            out += f"event: {e[0]}\ndata: {json.dumps(e[1])}\n\n".encode()
        else:
            out += b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
    return "text/event-stream", out


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-raw", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", **(delta or {})}, "finish_reason": finish}]}


def _completion(message: Any, **choice: Any) -> tuple[str, bytes]:
    body = {"id": "chatcmpl-raw", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", **choice}]}
    return "application/json", json.dumps(body).encode()


def _agent(model: str, fired: list[Any], **kw: Any) -> Any:
    def weather(city: str) -> str:
        """The weather in a city."""
        fired.append(city)
        return f"sunny in {city}"

    return ReactAgent(model=model, tools=[weather], retry_config=kw.pop("retry_config", FAST_RETRY), **kw)


def _run(app: Any, thread: str, text: str = "hi", streamed: bool = False) -> Any:
    async def go() -> Any:
        msg = {"messages": [Message.text_message(text)]}
        if streamed:
            return [c async for c in app.astream(msg, {"thread_id": thread})]
        return await app.ainvoke(msg, {"thread_id": thread})

    return asyncio.run(asyncio.wait_for(go(), timeout=120))


A = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "A"}'}}
B = {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "B"}'}}


@pytest.mark.parametrize("calls", [[A, B], [{**A, "index": 0}, B], [A, {**B, "index": 1}]],
                         ids=["no_index", "first_indexed", "second_indexed"])
def test_streamed_tool_calls_without_an_index_each_run(calls: list[dict[str, Any]],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for llm in serving(_raw(OpenAIStandIn), monkeypatch, drop=OTHER_ENV):
        # The id and name first, then the arguments in a delta naming neither (as servers do).
        deltas = []
        for c in calls:
            head = {k: v for k, v in c.items() if k != "function"}
            deltas.append(_chunk({"tool_calls": [{**head, "function": {"name": "weather", "arguments": ""}}]}))
            tail = {"index": c["index"]} if "index" in c else {}
            deltas.append(_chunk({"tool_calls": [{**tail, "function": {"arguments": c["function"]["arguments"]}}]}))
        llm.raw.append(_sse(*deltas, _chunk(finish="tool_calls"), b"[DONE]"))
        llm.reply_text("placeholder for the raw reply")
        llm.reply_text("done")
        fired: list[Any] = []
        app = _agent("openai/gpt-4o-mini", fired, api_style="chat").compile(checkpointer=InMemoryCheckpointer())
        _run(app, "no-index", streamed=True)
        assert fired == ["A", "B"]
        sent = llm.requests[-1].messages
        assert [m.get("tool_call_id") for m in sent if m["role"] == "tool"] == ["c1", "c2"]


UNREADABLE = {
    "message_null": _completion(None),
    "choices_a_string": ("application/json", json.dumps({"id": "x", "object": "chat.completion", "created": 1,
                                                        "model": "m", "choices": "nope"}).encode()),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_a_completion_of_an_unexpected_shape_is_an_unreadable_reply(case: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for llm in serving(_raw(OpenAIStandIn), monkeypatch, drop=OTHER_ENV):
        for _ in range(2):
            llm.raw.append(UNREADABLE[case])
            llm.reply_text("placeholder for the raw reply")
        fired: list[Any] = []
        cp = InMemoryCheckpointer()
        app = _agent("openai/gpt-4o-mini", fired, api_style="chat").compile(checkpointer=cp)
        with pytest.raises(NodeError) as err:
            _run(app, case)
        cause = err.value.__cause__
        assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_005", repr(cause)
        assert isinstance(cause.__cause__, UnreadableReplyError)
        assert len(cause.context["attempts"]) == 2  # retried, as an unreadable reply is
        assert fired == []
        assert [m.role for m in cp.get_state({"thread_id": case}).context] == ["user"]


def test_arguments_sent_as_an_object_and_content_as_parts_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for llm in serving(_raw(OpenAIStandIn), monkeypatch, drop=OTHER_ENV):
        llm.raw.append(_completion({"role": "assistant", "content": None, "tool_calls": [
            {"id": 7, "type": "function", "function": {"name": "weather", "arguments": {"city": "A"}}},
            {"id": "c9", "type": "function", "function": {"name": None, "arguments": "{}"}}]}))
        llm.reply_text("placeholder for the raw reply")
        llm.raw.append(_completion({"role": "assistant", "content": [{"type": "text", "text": "it is "},
                                                                     {"type": "text", "text": "sunny"}]}))
        llm.reply_text("placeholder for the raw reply")
        fired: list[Any] = []
        cp = InMemoryCheckpointer()
        app = _agent("openai/gpt-4o-mini", fired, api_style="chat").compile(checkpointer=cp)
        _run(app, "tolerant")
        assert fired == ["A"]
        ctx = cp.get_state({"thread_id": "tolerant"}).context
        assert ctx[1].tools_calls[0]["id"] == "7"
        # A call without a name is answered with a tool error the model reads.
        assert [m.text() for m in ctx if m.role == "tool"][1] == "Tool '' not found."
        assert ctx[-1].text() == "it is sunny"


def test_an_anthropic_tool_use_without_an_id_is_an_unreadable_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"id": "msg_raw", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
            "content": [{"type": "tool_use", "name": "weather", "input": {"city": "A"}}]}
    for llm in serving(_raw(AnthropicStandIn), monkeypatch, drop=OTHER_ENV):
        for _ in range(2):
            llm.raw.append(("application/json", json.dumps(body).encode()))
            llm.reply_text("placeholder for the raw reply")
        fired: list[Any] = []
        app = _agent("anthropic/claude-sonnet-4-5", fired).compile(checkpointer=InMemoryCheckpointer())
        with pytest.raises(NodeError) as err:
            _run(app, "no-id")
        cause = err.value.__cause__
        assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_005", repr(cause)
        assert fired == []


def _anthropic_overloaded() -> tuple[str, bytes]:
    start = {"type": "message_start", "message": {"id": "msg_raw", "type": "message", "role": "assistant",
                                                  "model": "m", "content": [], "stop_reason": None,
                                                  "stop_sequence": None,
                                                  "usage": {"input_tokens": 1, "output_tokens": 0}}}
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return _sse(("message_start", start), ("error", error))


STREAM_ERRORS = {
    "anthropic": (AnthropicStandIn, "anthropic/claude-sonnet-4-5", {}, _anthropic_overloaded),
    "openai": (OpenAIStandIn, "openai/gpt-4o-mini", {"api_style": "chat"},
               lambda: _sse(_chunk({"content": "par"}), {"error": {"message": "boom", "type": "server_error"}})),
}


@pytest.mark.parametrize("provider", sorted(STREAM_ERRORS))
def test_a_transient_error_inside_a_stream_is_retried(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base, model, kw, payload = STREAM_ERRORS[provider]
    for llm in serving(_raw(base), monkeypatch, drop=OTHER_ENV):
        llm.raw.append(payload())
        llm.reply_text("placeholder for the raw reply")
        llm.reply_text("all good")
        cp = InMemoryCheckpointer()
        app = _agent(model, [], **kw).compile(checkpointer=cp)
        _run(app, "overloaded", streamed=True)
        assert len(llm.requests) == 2
        assert [m.text() for m in cp.get_state({"thread_id": "overloaded"}).context] == ["hi", "all good"]
        # Retried once and still failing: the provider's error, not "could not be reached".
        llm.raw.extend([payload(), payload()])
        llm.reply_text("placeholder for the raw reply")
        llm.reply_text("placeholder for the raw reply")
        with pytest.raises(NodeError) as err:
            _run(app, "overloaded-twice", streamed=True)
        cause = err.value.__cause__
        assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_001", repr(cause)


def _empty_anthropic() -> tuple[str, bytes]:
    body = {"id": "msg_empty", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}, "content": []}
    return "application/json", json.dumps(body).encode()


def _empty_gemini() -> tuple[str, bytes]:
    body = {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 0, "totalTokenCount": 1},
            "modelVersion": "gemini-2.5-flash"}
    return "application/json", json.dumps(body).encode()


def _sent_texts(provider: str, request: Any) -> list[str]:
    if provider == "anthropic":
        return [m["content"] if isinstance(m["content"], str) else
                "".join(b.get("text", "") for b in m["content"]) for m in request.messages]
    return ["".join(p.get("text", "") for p in c.get("parts", [])) for c in request.body.get("contents", [])]


@pytest.mark.parametrize("provider", ["anthropic", "google"])
def test_an_empty_reply_is_not_sent_back_as_an_empty_turn(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base, model, empty = ((AnthropicStandIn, "anthropic/claude-sonnet-4-5", _empty_anthropic) if provider == "anthropic"
                          else (GoogleStandIn, "gemini/gemini-2.5-flash", _empty_gemini))
    for llm in serving(_raw(base), monkeypatch, drop=OTHER_ENV):
        llm.raw.append(empty())
        llm.reply_text("placeholder for the raw reply")
        llm.reply_text("second answer")
        cp = InMemoryCheckpointer()
        app = _agent(model, []).compile(checkpointer=cp)
        _run(app, "empty")
        _run(app, "empty", text="again")
        texts = _sent_texts(provider, llm.requests[-1])
        # Both providers refuse an empty (or blank) turn with 400 on every later request.
        assert all(t.strip() for t in texts), texts
        assert texts[-2:] == ["hi", "again"] or texts[-1] == "again", texts
