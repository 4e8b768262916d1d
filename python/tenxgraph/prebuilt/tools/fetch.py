"""``fetch_url``: GET a public http(s) URL and return its text (HTML reduced to its visible
text), with a timeout and a size cap. 10xGraph's name, signature and tool schema.

Hosts that resolve to a private, loopback, link-local, multicast, reserved or unspecified
address are refused (no requests to the machine's own services or its network), as are
schemes other than http/https; every failure is a JSON ``{"error": ...}`` result the model can
read. The tool needs the network to reach anything: where there is none, the model reads the
connection error. For the ledger it is idempotent (a GET): a replay after a crash answers a
call that returned from the ledger and fetches again only one whose outcome was unknown.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from html.parser import HTMLParser
from urllib import request
from urllib.error import HTTPError, URLError
from urllib.parse import urlparse

from tenxgraph.utils.tool_decorator import tool

__all__ = ["fetch_url"]

MAX_CHARS = 20_000
_USER_AGENT = "tenxgraph-prebuilt-tools/1.0"
# Hosts let through the public-address check. Empty: only for a test that serves pages on
# loopback (the check itself stays on for every other host).
_ALLOWED_PRIVATE_HOSTS: set[str] = set()


class _TextParser(HTMLParser):
    _SKIP = frozenset({"script", "style", "noscript"})
    _BREAK_BEFORE = frozenset({"p", "br", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6"})
    _BREAK_AFTER = frozenset({"p", "div", "li"})

    def __init__(self) -> None:
        super().__init__()
        self._skipping = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        if tag in self._BREAK_BEFORE:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self._skipping:
            self._skipping -= 1
        if tag in self._BREAK_AFTER:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping and data.strip():
            self.parts.append(data.strip())


def html_to_text(html: str) -> str:
    """The visible text of ``html`` (scripts and styles dropped), whitespace collapsed."""
    parser = _TextParser()
    parser.feed(html)
    return " ".join(" ".join(parser.parts).split())


def _public(hostname: str | None) -> bool:
    if not hostname:
        return False
    if hostname in _ALLOWED_PRIVATE_HOSTS:
        return True
    try:
        infos = socket.getaddrinfo(hostname, None)
    except (socket.gaierror, UnicodeError):
        return False
    for info in infos:
        ip = ipaddress.ip_address(info[4][0])
        if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved \
                or ip.is_unspecified:
            return False
    return True


def _fetch(url: str, timeout: float, max_chars: int) -> dict[str, object]:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        return {"error": "only http and https URLs are supported"}
    if not _public(parsed.hostname):
        return {"error": "URL host is not public or could not be resolved"}
    req = request.Request(url, headers={"User-Agent": _USER_AGENT})  # noqa: S310 - scheme checked above
    try:
        with request.urlopen(req, timeout=max(1.0, min(float(timeout), 30.0))) as response:  # noqa: S310
            raw = response.read(max_chars + 1)
            status, final_url = response.getcode(), response.geturl()
            content_type = response.headers.get("content-type", "")
    except HTTPError as exc:
        return {"error": f"HTTP error: {exc.code}", "status_code": exc.code}
    except URLError as exc:
        return {"error": f"URL error: {exc.reason}"}
    except (TimeoutError, OSError) as exc:
        return {"error": f"URL error: {exc}"}
    truncated = len(raw) > max_chars
    body = raw[:max_chars].decode("utf-8", errors="replace")
    if "html" in content_type.lower():
        body = html_to_text(body)
        if len(body) > max_chars:
            body, truncated = body[:max_chars], True
    return {"url": final_url, "status_code": status, "content_type": content_type, "content": body,
            "truncated": truncated}


@tool(
    name="fetch_url",
    description=("Fetch a public http/https URL and return text content. Blocks private/local hosts, "
                 "applies a timeout, and truncates long responses."),
    tags=["web", "fetch", "network"],
    capabilities=["network_access"],
)
async def fetch_url(url: str, timeout: float = 10.0, max_chars: int = MAX_CHARS) -> str:
    """JSON ``{"url", "status_code", "content_type", "content", "truncated"}``; ``{"error":
    ...}`` for a scheme other than http(s), a host that is not public or does not resolve, an
    HTTP error status (with ``status_code``) or a connection failure. ``timeout`` is clamped to
    1..30 s, ``max_chars`` to 1..20,000."""
    limit = max(1, min(int(max_chars), MAX_CHARS))
    return json.dumps(await asyncio.to_thread(_fetch, url, timeout, limit))
