"""The core every provider stand-in shares: a threaded HTTP server on 127.0.0.1, the script of
replies (one per request, per model or shared), the recorded requests, hangs and errors.

A provider's stand-in subclasses :class:`ScriptedStandIn` and says only what is its own: which
paths it serves, where a request names its model, its error body, and how a text or tool-call
reply looks on its wire (plain JSON and server-sent events). The scripting methods
(``reply_text``, ``reply_tool_calls``, ``reply_error``, ``reply_hang``, ``reply_json``) and the
records (``requests``, ``unscripted``, ``pending``) are the same for every provider, so a test
written against one reads the same against another.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["RecordedRequest", "Reply", "ScriptedStandIn", "split_text"]


@dataclass
class Reply:
    """One scripted answer. ``kind`` is ``"text"``, ``"tool_calls"``, ``"error"`` or ``"hang"``.
    ``tool_calls`` are OpenAI-shaped (``{"id", "type", "function": {"name", "arguments"}}``);
    each stand-in renders them in its provider's shape."""

    kind: str
    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    error: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, int] | None = None
    # Streaming: how many pieces the text and each tool call's arguments are cut into.
    pieces: int = 3
    # The connection drops before the reply ends: streamed, before its closing events (finish
    # reason, usage, end marker); plain, before any response.
    cut: bool = False


@dataclass
class RecordedRequest:
    """A request the stand-in received: its path, headers and decoded JSON body, and the kind of
    reply it was given (``"unscripted"`` when the queue was empty, ``"not_found"`` for a path
    the stand-in does not serve)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    reply: str
    stream_requested: bool = False

    @property
    def stream(self) -> bool:
        """Whether the client asked for a streamed reply (a body flag or, for Google, the path)."""
        return self.stream_requested or bool(self.body.get("stream"))

    @property
    def model(self) -> str:
        """The model asked for: the body's ``model``, else the one in a Google-style path."""
        if self.body.get("model"):
            return str(self.body["model"])
        found = re.search(r"/models/([^/:?]+):", self.path)
        return found.group(1) if found else ""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The body's ``messages`` (OpenAI chat, Anthropic), else an empty list."""
        return list(self.body.get("messages") or [])


def split_text(text: str, pieces: int) -> list[str]:
    """``text`` cut into about ``pieces`` consecutive pieces (one empty piece for no text)."""
    if not text:
        return [""]
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def word_count(obj: Any) -> int:
    """Words in every string of a JSON value: a deterministic stand-in token count, so two runs
    of one script (ours and 10xGraph's) report the same usage."""
    if isinstance(obj, str):
        return len(obj.split())
    if isinstance(obj, dict):
        return sum(word_count(v) for k, v in obj.items() if k not in ("type", "role", "id", "name"))
    if isinstance(obj, list):
        return sum(word_count(v) for v in obj)
    return 0


class ScriptedStandIn:
    """The shared server. Start it with ``with Stand_in() as llm:`` (or :meth:`start` /
    :meth:`close`); script replies before or while the agent runs."""

    #: shown in the server thread's name
    provider_name = "provider"

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, id_prefix: str | None = None) -> None:
        self._host = host
        self._port = port
        # Response ids become message ids: unique per server unless a test asks for fixed ones.
        self._prefix = id_prefix if id_prefix is not None else uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque()
        self._by_model: dict[str, deque[Reply]] = {}
        # One Event per generation of hangs: release() sets the current one and puts a fresh one in
        # its place, so a hang scripted after a release() is held again.
        self._released = threading.Event()
        self._served = 0
        self.requests: list[RecordedRequest] = []
        self.unscripted = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Any:
        """Starts serving on a free port (idempotent); returns the stand-in."""
        if self._server is not None:
            return self
        stand_in = self

        class Handler(_Handler):
            owner = stand_in

        self._server = _Server((self._host, self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"{self.provider_name}-stand-in", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops the server; requests held by a ``hang`` reply are let go first."""
        self.release()  # hung requests return (their clients get a dropped connection)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port the server listens on (after :meth:`start`)."""
        assert self._server is not None, "start() the stand-in first"
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:<port>``, without a path."""
        return f"http://{self._host}:{self.port}"

    def release(self) -> None:
        """Lets every request held by a ``hang`` reply go (they are answered with HTTP 504).
        Only those already held: a ``hang`` reply served after this holds its request again."""
        with self._lock:
            released, self._released = self._released, threading.Event()
        released.set()

    # -- scripting -------------------------------------------------------------------------

    def script(self, reply: Reply, *, model: str | None = None) -> Reply:
        """Queues ``reply`` for the next request (of ``model`` if given, else of any model)."""
        with self._lock:
            (self._by_model.setdefault(model, deque()) if model else self._queue).append(reply)
        return reply

    def reply_text(self, text: str, *, model: str | None = None, usage: dict[str, int] | None = None,
                   pieces: int = 3) -> Reply:
        """An assistant message with ``text`` (a normal stop)."""
        return self.script(Reply("text", text=text, usage=usage, pieces=pieces), model=model)

    def reply_json(self, obj: Any, *, model: str | None = None) -> Reply:
        """Structured output: the JSON of ``obj`` as the message's text."""
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
        """An HTTP error with the provider's error body (``429`` is its rate-limit error)."""
        headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
        return self.script(Reply("error", status=status, error=message or f"stand-in error {status}",
                                 headers=headers), model=model)

    def reply_cut_stream(self, text: str, *, model: str | None = None, pieces: int = 3) -> Reply:
        """A reply whose connection drops before it ends: a streamed request gets the text's
        deltas but not the closing events (finish reason, usage, end marker); a plain one gets
        no response at all. What a client sees when a provider or a proxy dies mid-reply."""
        return self.script(Reply("text", text=text, pieces=pieces, cut=True), model=model)

    def reply_hang(self, *, model: str | None = None) -> Reply:
        """Holds the request open until :meth:`release` or :meth:`close` (a client timeout fires)."""
        return self.script(Reply("hang"), model=model)

    @property
    def pending(self) -> int:
        """Scripted replies not served yet."""
        with self._lock:
            return len(self._queue) + sum(len(q) for q in self._by_model.values())

    # -- what a provider says (overridden) -------------------------------------------------

    def _api(self, path: str) -> str | None:
        """The API a path belongs to, or None for a path not served (HTTP 404)."""
        raise NotImplementedError

    def _model(self, path: str, body: dict[str, Any]) -> str:
        return str(body.get("model"))

    def _wants_stream(self, path: str, query: str, body: dict[str, Any]) -> bool:
        return bool(body.get("stream"))

    def _error_body(self, status: int, message: str) -> dict[str, Any]:
        raise NotImplementedError

    def _serve(self, handler: _Handler, api: str, body: dict[str, Any], reply: Reply, n: int,
               stream: bool) -> None:
        raise NotImplementedError

    # -- serving ---------------------------------------------------------------------------

    def _next(self, model: str) -> Reply | None:
        """The next scripted reply (subclasses answer from the request instead)."""
        with self._lock:
            queue = self._by_model.get(model)
            if queue:
                return queue.popleft()
            return self._queue.popleft() if self._queue else None

    def _take(self, model: str) -> tuple[Reply | None, threading.Event]:
        """``_next``'s reply, and the Event a hang reply waits on, the one current when the reply
        was taken: a release() lets the hangs served before it go, not those served after."""
        reply = self._next(model)
        with self._lock:
            return reply, self._released

    def _record(self, path: str, headers: dict[str, str], body: dict[str, Any], reply: str,
                stream: bool = False) -> int:
        with self._lock:
            self.requests.append(RecordedRequest(path, headers, body, reply, stream))
            self._served += 1
            return self._served


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client that hung up (a timeout, a killed process): nothing to report
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: ScriptedStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # keep test output clean

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        owner = self.owner
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.send_json(400, owner._error_body(400, "request body is not JSON"))
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        path, _, query = self.path.partition("?")
        path = path.rstrip("/")
        api = owner._api(path)
        if api is None:
            owner._record(self.path, headers, body, "not_found")
            self.send_json(404, owner._error_body(404, f"the stand-in does not serve {self.path}"))
            return
        stream = owner._wants_stream(path, query, body)
        reply, released = owner._take(owner._model(path, body))
        n = owner._record(self.path, headers, body, reply.kind if reply else "unscripted", stream)
        if reply is None:
            with owner._lock:
                owner.unscripted += 1
            self.send_json(400, owner._error_body(400, "no scripted reply left"))
            return
        if reply.kind == "hang":
            released.wait()
            try:
                self.send_json(504, owner._error_body(504, "released"))
            except OSError:
                pass  # the client gave up first
            return
        if reply.kind == "error":
            self.send_json(reply.status, owner._error_body(reply.status, reply.error), reply.headers)
            return
        if reply.cut and not stream:
            self.close_connection = True  # no response: the client sees the connection drop
            return
        owner._serve(self, api, body, reply, n, stream)

    def send_json(self, status: int, obj: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        """One JSON response with a content length (the connection stays open)."""
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, events: list[bytes], closing: int = 0, cut: bool = False) -> None:
        """Server-sent events, already framed; the body ends when the connection closes. With
        ``cut`` the last ``closing`` events (a reply's finish) are not sent."""
        if cut and closing:
            events = events[:-closing]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(event)
            self.wfile.flush()
        self.close_connection = True
