"""The OpenAI stand-in of tenxgraph.testing, driven by the real openai SDK (no Agent involved)."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tenxgraph.testing.providers import OpenAIStandIn


@pytest.fixture
def llm():
    with OpenAIStandIn() as server:
        yield server


def client(llm: OpenAIStandIn, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="sk-test", base_url=llm.base_url, max_retries=0, **kw)


def test_text_tool_calls_and_recorded_requests(llm: OpenAIStandIn) -> None:
    llm.reply_text("hello there")
    llm.reply_tool_calls(("lookup", {"id": 7}), ("ship", {"id": 7}, "call_x"))

    async def go():
        c = client(llm)
        a = await c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}])
        b = await c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "go"}],
                                            tools=[{"type": "function", "function": {"name": "lookup"}}])
        return a, b

    a, b = asyncio.run(go())
    assert a.choices[0].message.content == "hello there" and a.choices[0].finish_reason == "stop"
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens > 0
    calls = b.choices[0].message.tool_calls
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_1", "lookup", {"id": 7}), ("call_x", "ship", {"id": 7})]
    assert b.choices[0].finish_reason == "tool_calls"
    assert a.id != b.id
    assert [r.body["messages"][0]["content"] for r in llm.requests] == ["hi", "go"]
    assert llm.requests[1].body["tools"][0]["function"]["name"] == "lookup"
    assert llm.requests[0].headers["authorization"] == "Bearer sk-test"
    assert llm.pending == 0


def test_streaming_text_and_split_tool_arguments(llm: OpenAIStandIn) -> None:
    llm.reply_text("abcdefghi", pieces=3)
    llm.reply_tool_calls(("lookup", {"order_id": "A-1001"}))

    async def go():
        c = client(llm)
        out = []
        for _ in range(2):
            stream = await c.chat.completions.create(model="m", messages=[], stream=True,
                                                     stream_options={"include_usage": True})
            out.append([chunk async for chunk in stream])
        return out

    text_chunks, tool_chunks = asyncio.run(go())
    pieces = [ch.choices[0].delta.content for ch in text_chunks if ch.choices and ch.choices[0].delta.content]
    assert pieces == ["abc", "def", "ghi"]
    assert text_chunks[-1].usage is not None and not text_chunks[-1].choices
    args = "".join(tc.function.arguments or "" for ch in tool_chunks if ch.choices
                   for tc in ch.choices[0].delta.tool_calls or [])
    assert json.loads(args) == {"order_id": "A-1001"}
    first = next(tc for ch in tool_chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or [])
    assert (first.id, first.function.name, first.function.arguments) == ("call_1", "lookup", "")


def test_errors_hangs_and_an_empty_queue(llm: OpenAIStandIn) -> None:
    llm.reply_error(429, "slow down", retry_after=0)
    llm.reply_error(500)
    llm.reply_hang()

    async def go():
        c = client(llm, timeout=0.5)
        errors = []
        for _ in range(4):
            try:
                await c.chat.completions.create(model="m", messages=[])
            except openai.APIError as exc:
                errors.append(exc)
        return errors

    rate, server, hung, empty = asyncio.run(go())
    assert isinstance(rate, openai.RateLimitError) and "slow down" in str(rate)
    assert rate.response.headers["retry-after"] == "0"
    assert isinstance(server, openai.InternalServerError)
    assert isinstance(hung, openai.APITimeoutError)
    assert isinstance(empty, openai.BadRequestError) and "no scripted reply left" in str(empty)
    assert llm.unscripted == 1
    assert [r.reply for r in llm.requests] == ["error", "error", "hang", "unscripted"]


def test_per_model_queues(llm: OpenAIStandIn) -> None:
    llm.reply_text("shared")
    llm.reply_text("for b", model="b")

    async def go():
        c = client(llm)
        b = await c.chat.completions.create(model="b", messages=[])
        a = await c.chat.completions.create(model="a", messages=[])
        return a.choices[0].message.content, b.choices[0].message.content

    assert asyncio.run(go()) == ("shared", "for b")


def test_env_points_the_sdk_at_the_stand_in(llm: OpenAIStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in llm.env.items():
        monkeypatch.setenv(k, v)
    llm.reply_text("via env")

    async def go():
        r = await openai.AsyncOpenAI(max_retries=0).chat.completions.create(model="m", messages=[])
        return r.choices[0].message.content

    assert asyncio.run(go()) == "via env"
