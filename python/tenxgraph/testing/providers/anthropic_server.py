"""A stand-in for Anthropic's Messages API (``POST /v1/messages``, plain and streamed) on
127.0.0.1, scripted per test like :class:`~tenxgraph.testing.providers.OpenAIStandIn`::

    with AnthropicStandIn() as llm:
        llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
        llm.reply_text("Your order was delivered.")
        os.environ.update(llm.env)          # ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY
        ...run an agent on "anthropic/claude-sonnet-4-5"...
        assert llm.requests[0].body["system"][0]["text"] == "You are a support agent."

A text reply is one ``text`` block (``stop_reason`` ``end_turn``); a tool-call reply is an
optional text block then one ``tool_use`` block per call (``stop_reason`` ``tool_use``; the
scripted JSON arguments become the block's ``input``). With ``"stream": true`` the same reply
comes as Anthropic's events: ``message_start``, per block ``content_block_start`` /
``content_block_delta`` (``text_delta`` pieces, ``input_json_delta`` pieces) /
``content_block_stop``, then ``message_delta`` (stop reason, usage) and ``message_stop``.
Errors carry Anthropic's body (``{"type": "error", "error": {"type": "rate_limit_error", ...}}``).
"""

from __future__ import annotations

import json
from typing import Any

from tenxgraph.testing.providers.scripted_server import Reply, ScriptedStandIn, _Handler, split_text, word_count

__all__ = ["AnthropicStandIn"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    if reply.usage is not None:
        return {"input_tokens": reply.usage.get("prompt_tokens", reply.usage.get("input_tokens", 0)),
                "output_tokens": reply.usage.get("completion_tokens", reply.usage.get("output_tokens", 0))}
    prompt = word_count(body.get("messages")) + word_count(body.get("system")) + 1
    completion = len((reply.text or "").split()) + 5 * len(reply.tool_calls) + 1
    return {"input_tokens": prompt, "output_tokens": completion}


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}  # a plain reply must carry an object; the streamed form sends the text as is
    return value if isinstance(value, dict) else {}


class AnthropicStandIn(ScriptedStandIn):
    """The server. ``base_url`` is its origin (the SDK adds ``/v1/messages``); :attr:`env` points
    the ``anthropic`` SDK here."""

    provider_name = "anthropic"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: the SDK's ``base_url`` (``ANTHROPIC_BASE_URL``)."""
        return self.origin

    @property
    def env(self) -> dict[str, str]:
        """The environment that points the Anthropic SDK here (for ``os.environ`` or a child)."""
        return {"ANTHROPIC_BASE_URL": self.base_url, "ANTHROPIC_API_KEY": "sk-ant-stand-in"}

    def _message_id(self, n: int) -> str:
        return f"msg_{self._prefix}_{n}"

    def _api(self, path: str) -> str | None:
        return "messages" if path.endswith("/v1/messages") else None

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _blocks(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for call in reply.tool_calls:
            blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                           "input": _input(call["function"]["arguments"]), "_arguments": call["function"]["arguments"]})
        return blocks

    def _serve(self, handler: _Handler, api: str, body: dict[str, Any], reply: Reply, n: int,
               stream: bool) -> None:
        usage = _usage(body, reply)
        blocks = self._blocks(reply)
        stop = "tool_use" if reply.tool_calls else "end_turn"
        message = {"id": self._message_id(n), "type": "message", "role": "assistant",
                   "model": body.get("model", "stand-in"), "stop_reason": stop, "stop_sequence": None,
                   "usage": usage}
        if not stream:
            content = [{k: v for k, v in b.items() if k != "_arguments"} for b in blocks]
            handler.send_json(200, {**message, "content": content})
            return

        def event(kind: str, data: dict[str, Any]) -> bytes:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

        start_usage = {"input_tokens": usage["input_tokens"], "output_tokens": 1}
        out = [event("message_start", {"message": {**message, "content": [], "stop_reason": None,
                                                   "usage": start_usage}})]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                out.append(event("content_block_start",
                                 {"index": index, "content_block": {"type": "text", "text": ""}}))
                for piece in split_text(block["text"], reply.pieces):
                    out.append(event("content_block_delta",
                                     {"index": index, "delta": {"type": "text_delta", "text": piece}}))
            else:
                out.append(event("content_block_start", {"index": index, "content_block": {
                    "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
                for piece in split_text(block["_arguments"], reply.pieces):
                    out.append(event("content_block_delta",
                                     {"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}))
            out.append(event("content_block_stop", {"index": index}))
        out.append(event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage}))
        out.append(event("message_stop", {}))
        handler.send_events(out, closing=2, cut=reply.cut)
