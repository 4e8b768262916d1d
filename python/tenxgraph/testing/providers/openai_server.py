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
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OpenAIStandIn", "RecordedRequest", "Reply"]


@dataclass
class Reply:
    """One scripted answer. ``kind`` is ``"text"``, ``"tool_calls"``, ``"error"`` or ``"hang"``."""

    kind: str
    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    error: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, int] | None = None
    # Streaming: how many pieces the text and each tool call's arguments are cut into.
    pieces: int = 3


@dataclass
class RecordedRequest:
    """A request the stand-in received: its path, headers and decoded JSON body, and the kind of
    reply it was given (``"unscripted"`` when the queue was empty)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    reply: str

    @property
    def stream(self) -> bool:
        """Whether the request asked for a streamed reply (``"stream": true``)."""
        return bool(self.body.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's ``messages`` (chat completions), [] when absent."""
        return list(self.body.get("messages") or [])


def _split(text: str, pieces: int) -> list[str]:
    if not text:
        return [""]
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _default_usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    # Deterministic, so two runs of one script (ours and 10xGraph's) report the same numbers.
    raw_items = body.get("messages") or body.get("input")
    items: list[Any] = raw_items if isinstance(raw_items, list) else []
    prompt = sum(len(str(m.get("content") or m.get("output") or "").split()) for m in items if isinstance(m, dict))
    prompt += len(str(body.get("instructions") or "").split()) + 1
    completion = len((reply.text or "").split()) + 5 * len(reply.tool_calls) + 1
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class OpenAIStandIn:
    """The server. Start it with ``with OpenAIStandIn() as llm:`` (or :meth:`start` /
    :meth:`close`). ``base_url`` ends in ``/v1``, as the SDK expects."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, id_prefix: str | None = None,
                 apis: tuple[str, ...] = ("chat", "responses")) -> None:
        self._host = host
        # Which APIs are served (``"chat"``, ``"responses"``): an OpenAI-compatible server often has
        # chat completions only, and answers 404 for the rest.
        self.apis = tuple(apis)
        self._port = port
        # Response ids become message ids: unique per server unless a test asks for fixed ones.
        self._prefix = id_prefix if id_prefix is not None else uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque()
        self._by_model: dict[str, deque[Reply]] = {}
        self._released = threading.Event()
        self._served = 0
        self.requests: list[RecordedRequest] = []
        self.unscripted = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> OpenAIStandIn:
        """Starts serving on a daemon thread (idempotent) and returns self."""
        if self._server is not None:
            return self
        stand_in = self

        class Handler(_Handler):
            owner = stand_in

        self._server = _Server((self._host, self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="openai-stand-in", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Releases held (``hang``) requests and stops the server; safe to call twice."""
        self._released.set()  # hung requests return (their clients get a dropped connection)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OpenAIStandIn:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port served on (the one picked when constructed with 0). Fails before ``start()``."""
        assert self._server is not None, "start() the stand-in first"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://<host>:<port>/v1``, the SDK's ``base_url``."""
        return f"http://{self._host}:{self.port}/v1"

    @property
    def env(self) -> dict[str, str]:
        """The environment that points the OpenAI SDK here (for ``os.environ`` or a child)."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": "sk-stand-in"}

    def release(self) -> None:
        """Lets every request held by a ``hang`` reply go (they are answered with HTTP 504)."""
        self._released.set()

    # -- scripting -------------------------------------------------------------------------

    def script(self, reply: Reply, *, model: str | None = None) -> Reply:
        """Queues ``reply`` for the next request (for the next request naming ``model`` when given);
        replies are used once, in order. Returns the reply. Thread-safe."""
        with self._lock:
            (self._by_model.setdefault(model, deque()) if model else self._queue).append(reply)
        return reply

    def reply_text(self, text: str, *, model: str | None = None, usage: dict[str, int] | None = None,
                   pieces: int = 3) -> Reply:
        """An assistant message with ``text`` (``finish_reason`` ``stop``)."""
        return self.script(Reply("text", text=text, usage=usage, pieces=pieces), model=model)

    def reply_json(self, obj: Any, *, model: str | None = None) -> Reply:
        """Structured output: the JSON of ``obj`` as the message content."""
        return self.reply_text(json.dumps(obj), model=model)

    def reply_tool_calls(self, *calls: tuple[str, Any] | tuple[str, Any, str], text: str | None = None,
                         model: str | None = None, usage: dict[str, int] | None = None) -> Reply:
        """An assistant message calling tools: each call is ``(name, args)`` or ``(name, args, id)``;
        ``args`` is a dict (sent as its JSON) or a str (sent as is, e.g. malformed JSON). Ids
        default to ``call_1``, ``call_2``, ... in every reply, as some providers reuse them."""
        out = []
        for i, call in enumerate(calls, start=1):
            name, args = call[0], call[1]
            call_id = call[2] if len(call) > 2 else f"call_{i}"  # type: ignore[misc]
            arguments = args if isinstance(args, str) else json.dumps(args)
            out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        return self.script(Reply("tool_calls", text=text, tool_calls=out, usage=usage), model=model)

    def reply_error(self, status: int, message: str = "", *, model: str | None = None,
                    retry_after: float | None = None) -> Reply:
        """An HTTP error with OpenAI's error body (``429`` gives the SDK a ``RateLimitError``)."""
        headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
        return self.script(Reply("error", status=status, error=message or f"stand-in error {status}",
                                 headers=headers), model=model)

    def reply_hang(self, *, model: str | None = None) -> Reply:
        """Holds the request open until :meth:`release` or :meth:`close` (a client timeout fires)."""
        return self.script(Reply("hang"), model=model)

    @property
    def pending(self) -> int:
        """Scripted replies not served yet."""
        with self._lock:
            return len(self._queue) + sum(len(q) for q in self._by_model.values())

    # -- serving ---------------------------------------------------------------------------

    def _next(self, body: dict[str, Any]) -> Reply | None:
        with self._lock:
            queue = self._by_model.get(str(body.get("model")))
            if queue:
                return queue.popleft()
            return self._queue.popleft() if self._queue else None

    def _record(self, path: str, headers: dict[str, str], body: dict[str, Any], reply: str) -> int:
        with self._lock:
            self.requests.append(RecordedRequest(path, headers, body, reply))
            self._served += 1
            return self._served

    def _completion_id(self, n: int) -> str:
        return f"chatcmpl-{self._prefix}-{n}"

    def _response_id(self, n: int) -> str:
        return f"resp_{self._prefix}_{n}"


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
            for piece in _split(text, pieces):
                events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                               "content_index": 0, "delta": piece, "logprobs": []})
            events.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "text": text, "logprobs": []})
        else:
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "arguments": ""}})
            for piece in _split(item["arguments"], pieces):
                events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": index, "delta": piece})
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": index, "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return events


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client that hung up (a timeout, a killed process): nothing to report
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: OpenAIStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # keep test output clean

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "request body is not JSON", "type": "invalid_request_error"}})
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?", 1)[0].rstrip("/")
        api = "chat" if path.endswith("/chat/completions") else "responses" if path.endswith("/responses") else None
        if api not in self.owner.apis:
            self.owner._record(self.path, headers, body, "not_found")
            self._json(404, {"error": {"message": f"the stand-in does not serve {self.path}",
                                       "type": "invalid_request_error"}})
            return
        reply = self.owner._next(body)
        n = self.owner._record(self.path, headers, body, reply.kind if reply else "unscripted")
        if reply is None:
            with self.owner._lock:
                self.owner.unscripted += 1
            self._json(400, {"error": {"message": "no scripted reply left", "type": "invalid_request_error"}})
            return
        if reply.kind == "hang":
            self.owner._released.wait()
            try:
                self._json(504, {"error": {"message": "released", "type": "server_error"}})
            except OSError:
                pass  # the client gave up first
            return
        if reply.kind == "error":
            kind = "rate_limit_error" if reply.status == 429 else "server_error"
            self._json(reply.status, {"error": {"message": reply.error, "type": kind, "code": None}},
                       reply.headers)
            return
        usage = reply.usage or _default_usage(body, reply)
        if api == "responses":
            response = _responses_object(self.owner._response_id(n), body, reply, usage)
            if body.get("stream"):
                self._events(_responses_events(response))
            else:
                self._json(200, response)
        elif body.get("stream"):
            self._stream(body, reply, n, usage)
        else:
            self._json(200, self._completion(body, reply, n, usage))

    def _completion(self, body: dict[str, Any], reply: Reply, n: int, usage: dict[str, int]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        return {
            "id": self.owner._completion_id(n),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "stand-in"),
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": usage,
        }

    def _stream(self, body: dict[str, Any], reply: Reply, n: int, usage: dict[str, int]) -> None:
        cid = self.owner._completion_id(n)
        created = int(time.time())
        model = body.get("model", "stand-in")

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        out = [chunk({"role": "assistant", "content": ""})]
        if reply.text:
            out += [chunk({"content": piece}) for piece in _split(reply.text, reply.pieces)]
        for index, call in enumerate(reply.tool_calls):
            out.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                              "function": {"name": call["function"]["name"], "arguments": ""}}]}))
            for piece in _split(call["function"]["arguments"], reply.pieces):
                out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        out.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [], "usage": usage}
            out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")  # the body ends when the connection does
        self.end_headers()
        for event in out:
            self.wfile.write(event)
            self.wfile.flush()
        self.close_connection = True

    def _events(self, events: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for seq, event in enumerate(events):
            event["sequence_number"] = seq
            self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    def _json(self, status: int, obj: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
