"""A provider endpoint that answers with garbage (session 7 red-team pass): a 200 whose body is
not the API's JSON, an event stream of non-JSON or of JSON of the wrong shape, binary bytes; on
OpenAI chat, Anthropic and Google GenAI, plain and streamed, through their real SDKs.

Every case fails the model node with a typed error (``NodeError`` ``NODE_001`` whose cause is
``ModelCallError`` ``LLM_PROVIDER_005`` after the retries, an ``UnreadableReplyError`` behind it)
and leaves the thread in the error status holding only the input. Before, several were taken as
an empty assistant answer and the thread completed with it (``SILENT_BEFORE``); the replies the SDK
itself cannot parse (a body that is not JSON or not text, an event cut in the middle, a body
shorter than its length) failed the node with the SDK's own exception, not retried, and a stream without a single event of the API was taken for a
dropped connection (``LLM_PROVIDER_003``)."""

from __future__ import annotations

import asyncio
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

PROVIDERS = {"openai": (OpenAIStandIn, "openai/gpt-4o-mini"),
             "anthropic": (AnthropicStandIn, "anthropic/claude-sonnet-4-5"),
             "google": (GoogleStandIn, "gemini/gemini-2.5-flash")}
GARBAGE = {
    "not_json": ("application/json", b"<html>oops</html>"),
    "wrong_shape": ("application/json", b'{"unexpected": true}'),
    "sse_garbage": ("text/event-stream", b"data: {not json\n\n"),
    "sse_wrong_shape": ("text/event-stream", b'data: {"foo": 1}\n\ndata: [DONE]\n\n'),
    "binary": ("application/octet-stream", bytes(range(256))),
    # An event cut in the middle of its JSON, the connection then closed cleanly.
    "sse_cut": ("text/event-stream", b'data: {"id": "x1", "type": "message_start", "choices": [{"ind'),
    # A body shorter than its content-length: the connection closes in the middle of the reply.
    "cut_body": ("application/json", b'{"id": "x1", "object": "chat.completion", "choi'),
}
# Sent as the content-length of "cut_body" (more than its bytes).
CUT_LENGTH = 4096
# (provider, garbage, streamed) that completed the thread with an empty answer before the fix.
SILENT_BEFORE = {("anthropic", "binary", False), ("anthropic", "sse_garbage", False),
                 ("anthropic", "sse_wrong_shape", False), ("anthropic", "wrong_shape", False),
                 ("google", "wrong_shape", False), ("openai", "wrong_shape", False),
                 ("openai", "not_json", True), ("openai", "sse_wrong_shape", True), ("openai", "wrong_shape", True)}
OTHER_ENV = ("ANTHROPIC_AUTH_TOKEN", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI")


def _garbage_stand_in(base: type, mode: str) -> type:
    ctype, payload = GARBAGE[mode]

    class Garbage(base):  # type: ignore[misc, valid-type]
        def _serve(self, handler: Any, api: str, body: Any, reply: Any, n: int, stream: bool) -> None:
            handler.send_response(200)
            handler.send_header("content-type", ctype)
            handler.send_header("content-length", str(CUT_LENGTH if mode == "cut_body" else len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
            handler.close_connection = True

    return Garbage


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("mode", sorted(GARBAGE))
@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_a_garbage_reply_fails_the_node_and_is_never_an_answer(provider: str, mode: str, streamed: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    base, model = PROVIDERS[provider]
    for llm in serving(_garbage_stand_in(base, mode), monkeypatch, drop=OTHER_ENV):
        for _ in range(4):
            llm.reply_text("never served as is")
        cp = InMemoryCheckpointer()
        agent = ReactAgent(model=model, tools=[], retry_config=RetryConfig(max_retries=1, initial_delay=0.01,
                                                                           max_delay=0.02))
        app = agent.compile(checkpointer=cp)
        cfg = {"thread_id": "garbage"}

        async def run() -> Any:
            if streamed:
                return [c async for c in app.astream({"messages": [Message.text_message("hi")]}, dict(cfg))]
            return await app.ainvoke({"messages": [Message.text_message("hi")]}, dict(cfg))

        with pytest.raises(NodeError) as err:
            asyncio.run(asyncio.wait_for(run(), timeout=120))
        assert err.value.error_code == "NODE_001"
        cause = err.value.__cause__
        assert isinstance(cause, ModelCallError) and cause.error_code == "LLM_PROVIDER_005", repr(cause)
        assert isinstance(cause.__cause__, UnreadableReplyError), repr(cause.__cause__)
        assert len(cause.context["attempts"]) == 2  # retried once, as a dropped connection is
        state = cp.get_state(dict(cfg))
        assert str(state.execution_meta.status).endswith("error")
        assert [m.role for m in state.context] == ["user"]
