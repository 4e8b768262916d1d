"""A stand-in for the Gemini API's ``models/{model}:generateContent`` and
``:streamGenerateContent`` (server-sent events, ``?alt=sse``) on 127.0.0.1, scripted per test like
:class:`~tenxgraph.testing.providers.OpenAIStandIn`::

    with GoogleStandIn() as llm:
        llm.reply_tool_calls(("lookup_order", {"order_id": "A-1001"}))
        llm.reply_text("Your order was delivered.")
        os.environ.update(llm.env)          # GOOGLE_GEMINI_BASE_URL / GEMINI_API_KEY
        ...run an agent on "gemini/gemini-2.5-flash"...
        assert llm.requests[0].model == "gemini-2.5-flash"

The ``google-genai`` SDK is pointed here by ``GOOGLE_GEMINI_BASE_URL`` (or ``base_url=`` on the
agent, which becomes the SDK's ``HttpOptions(base_url=...)``). A reply is one candidate whose
parts are the text, then a ``functionCall`` per scripted call (``finishReason`` ``STOP``); the
model is the one in the request's path, so ``model=`` scripting works as for the other
stand-ins. Streamed, the text comes in pieces, one chunk each, the function calls whole in the
last chunk with the finish reason and ``usageMetadata``. Errors carry Google's body
(``{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": ...}}``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from tenxgraph.testing.providers.scripted_server import Reply, ScriptedStandIn, _Handler, split_text, word_count

__all__ = ["GoogleStandIn"]

_PATH = re.compile(r"/models/([^/:]+):(generateContent|streamGenerateContent)$")
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    if reply.usage is not None:
        prompt = reply.usage.get("prompt_tokens", 0)
        completion = reply.usage.get("completion_tokens", 0)
    else:
        prompt = word_count(body.get("contents")) + word_count(body.get("systemInstruction")) + 1
        completion = len((reply.text or "").split()) + 5 * len(reply.tool_calls) + 1
    return {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}


def _args(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}  # Gemini sends function arguments as an object, never as text
    return value if isinstance(value, dict) else {}


class GoogleStandIn(ScriptedStandIn):
    """The server. ``base_url`` is its origin (the SDK adds ``/v1beta/models/...``); :attr:`env`
    points the ``google-genai`` SDK here."""

    provider_name = "google"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: the SDK's base URL (``GOOGLE_GEMINI_BASE_URL``)."""
        return self.origin

    @property
    def env(self) -> dict[str, str]:
        """The environment that points the Google GenAI SDK here (for ``os.environ`` or a child)."""
        return {"GOOGLE_GEMINI_BASE_URL": self.base_url, "GEMINI_API_KEY": "stand-in-key"}

    def _api(self, path: str) -> str | None:
        return "generate" if _PATH.search(path) else None

    def _model(self, path: str, body: dict[str, Any]) -> str:
        found = _PATH.search(path)
        return found.group(1) if found else ""

    def _wants_stream(self, path: str, query: str, body: dict[str, Any]) -> bool:
        return path.endswith(":streamGenerateContent")

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}}

    def _serve(self, handler: _Handler, api: str, body: dict[str, Any], reply: Reply, n: int,
               stream: bool) -> None:
        model = self._model(handler.path.partition("?")[0], body)
        calls = [{"functionCall": {"name": c["function"]["name"], "args": _args(c["function"]["arguments"])}}
                 for c in reply.tool_calls]
        usage = _usage(body, reply)
        head = {"modelVersion": model, "responseId": f"resp-{self._prefix}-{n}"}

        def response(parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            out: dict[str, Any] = {"candidates": [candidate], **head}
            if last:
                candidate["finishReason"] = "STOP"
                out["usageMetadata"] = usage
            return out

        text_parts = [{"text": reply.text}] if reply.text else []
        if not stream:
            handler.send_json(200, response([*text_parts, *calls], last=True))
            return
        pieces = split_text(reply.text, reply.pieces) if reply.text else []
        chunks = [response([{"text": p}], last=False) for p in pieces]
        if calls or not chunks:
            chunks.append(response(calls, last=True))
        else:
            chunks[-1] = response([{"text": pieces[-1]}], last=True)
        handler.send_events([b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks], closing=1,
                            cut=reply.cut)
