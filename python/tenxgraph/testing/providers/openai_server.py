"""A stand-in for the OpenAI API on 127.0.0.1 (chat completions and the Responses API), scripted
per test.

The real ``openai`` SDK is pointed at it through its base URL, so an agent under test goes through
the same client, wire format and errors as in production, with no key and no network::

    with OpenAIStandIn() as llm:
        llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
        llm.reply_text("Your order was delivered.")
        os.environ.update(llm.env)          # OPENAI_BASE_URL / OPENAI_API_KEY
        ...run the agent...
        assert [r.body["model"] for r in llm.requests] == ["gpt-4o-mini"] * 2

Replies are served in the order they were scripted (one per request), from the queue of the
request's model if one was scripted for it (``model=...``), else from the shared queue, on either
API (``/v1/chat/completions`` or ``/v1/responses``, in that API's shape). A reply is
text, tool calls, an HTTP error (429, 500, ...), or a hang (the request is held until the server
closes or :meth:`OpenAIStandIn.release` is called, so a client timeout fires). A request with
``"stream": true`` gets the same reply as server-sent events, split the way OpenAI splits it
(text in pieces; each tool call's id and name first, then its arguments in pieces).

The server lives in the test's process while the agent may run in a child (crash tests): the
queue and the recorded requests stay with the test, so a resumed child continues the script.
A request when the queue is empty gets HTTP 400 ``no scripted reply left`` (not retried by
clients) and is counted in :attr:`OpenAIStandIn.unscripted`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tenxgraph.testing.providers.scripted_server import (
    RecordedRequest,
    Reply,
    ScriptedStandIn,
    _Handler,
    split_text,
)

__all__ = ["OpenAIStandIn", "RecordedRequest", "Reply"]


def _default_usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    # Deterministic, so two runs of one script (ours and 10xGraph's) report the same numbers.
    raw_items = body.get("messages") or body.get("input")
    items: list[Any] = raw_items if isinstance(raw_items, list) else []
    prompt = sum(len(str(m.get("content") or m.get("output") or "").split()) for m in items if isinstance(m, dict))
    prompt += len(str(body.get("instructions") or "").split()) + 1
    completion = len((reply.text or "").split()) + 5 * len(reply.tool_calls) + 1
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class OpenAIStandIn(ScriptedStandIn):
    """The server. Start it with ``with OpenAIStandIn() as llm:`` (or :meth:`start` /
    :meth:`close`). ``base_url`` ends in ``/v1``, as the SDK expects."""

    provider_name = "openai"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, id_prefix: str | None = None,
                 apis: tuple[str, ...] = ("chat", "responses")) -> None:
        super().__init__(host, port, id_prefix=id_prefix)
        # Which APIs are served (``"chat"``, ``"responses"``): an OpenAI-compatible server often has
        # chat completions only, and answers 404 for the rest.
        self.apis = tuple(apis)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: the SDK's ``base_url``."""
        return f"{self.origin}/v1"

    @property
    def env(self) -> dict[str, str]:
        """The environment that points the OpenAI SDK here (for ``os.environ`` or a child)."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": "sk-stand-in"}

    def reply_error(self, status: int, message: str = "", *, model: str | None = None,
                    retry_after: float | None = None) -> Reply:
        """An HTTP error with OpenAI's error body (``429`` gives the SDK a ``RateLimitError``)."""
        return super().reply_error(status, message, model=model, retry_after=retry_after)

    def _completion_id(self, n: int) -> str:
        return f"chatcmpl-{self._prefix}-{n}"

    def _response_id(self, n: int) -> str:
        return f"resp_{self._prefix}_{n}"

    # -- the wire --------------------------------------------------------------------------

    def _api(self, path: str) -> str | None:
        api = "chat" if path.endswith("/chat/completions") else "responses" if path.endswith("/responses") else None
        return api if api in self.apis else None

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = ("rate_limit_error" if status == 429 else "server_error" if status >= 500
                else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "code": None}}

    def _serve(self, handler: _Handler, api: str, body: dict[str, Any], reply: Reply, n: int,
               stream: bool) -> None:
        usage = reply.usage or _default_usage(body, reply)
        if api == "responses":
            response = _responses_object(self._response_id(n), body, reply, usage)
            if stream:
                handler.send_events(_responses_frames(_responses_events(response)), closing=1, cut=reply.cut)
            else:
                handler.send_json(200, response)
        elif stream:
            frames = self._chat_frames(body, reply, n, usage)
            # The finish chunk, the usage chunk if asked, [DONE].
            handler.send_events(frames, closing=len(frames) - 1 - self._content_frames(reply), cut=reply.cut)
        else:
            handler.send_json(200, self._completion(body, reply, n, usage))

    def _completion(self, body: dict[str, Any], reply: Reply, n: int, usage: dict[str, int]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        return {
            "id": self._completion_id(n),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "stand-in"),
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": usage,
        }

    @staticmethod
    def _content_frames(reply: Reply) -> int:
        text = len(split_text(reply.text, reply.pieces)) if reply.text else 0
        calls = sum(1 + len(split_text(c["function"]["arguments"], reply.pieces)) for c in reply.tool_calls)
        return text + calls

    def _chat_frames(self, body: dict[str, Any], reply: Reply, n: int, usage: dict[str, int]) -> list[bytes]:
        """The reply as chat-completion chunks: text in pieces; each tool call's id and name
        first, then its arguments in pieces; the finish reason; usage if asked; ``[DONE]``."""
        cid = self._completion_id(n)
        created = int(time.time())
        model = body.get("model", "stand-in")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        out = [chunk({"role": "assistant", "content": ""})]
        if reply.text:
            out += [chunk({"content": piece}) for piece in split_text(reply.text, reply.pieces)]
        for index, call in enumerate(reply.tool_calls):
            out.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                              "function": {"name": call["function"]["name"], "arguments": ""}}]}))
            for piece in split_text(call["function"]["arguments"], reply.pieces):
                out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        out.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [], "usage": usage}
            out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return out


def _responses_usage(usage: dict[str, int]) -> dict[str, Any]:
    return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


def _responses_object(rid: str, body: dict[str, Any], reply: Reply, usage: dict[str, int]) -> dict[str, Any]:
    """The Responses API's ``response`` object for a reply: a message item, then function calls."""
    output: list[dict[str, Any]] = []
    if reply.text:
        output.append({"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": reply.text, "annotations": []}]})
    for i, call in enumerate(reply.tool_calls):
        output.append({"type": "function_call", "id": f"fc_{rid}_{i}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": body.get("model", "stand-in"), "output": output, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": body.get("tools") or [], "error": None, "incomplete_details": None,
            "instructions": body.get("instructions"), "metadata": {}, "usage": _responses_usage(usage),
            "_pieces": reply.pieces}


def _responses_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A response as the Responses API streams it: the item opened, its text or arguments in
    pieces, the item done; then ``response.completed`` with the whole response."""
    pieces = response.pop("_pieces")
    events: list[dict[str, Any]] = [{"type": "response.created",
                                     "response": {**response, "status": "in_progress", "output": []}}]
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "content": []}})
            text = item["content"][0]["text"]
            for piece in split_text(text, pieces):
                events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                               "content_index": 0, "delta": piece, "logprobs": []})
            events.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "text": text, "logprobs": []})
        else:
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "arguments": ""}})
            for piece in split_text(item["arguments"], pieces):
                events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": index, "delta": piece})
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": index, "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return events


def _responses_frames(events: list[dict[str, Any]]) -> list[bytes]:
    out = []
    for seq, event in enumerate(events):
        event["sequence_number"] = seq
        out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    return out
