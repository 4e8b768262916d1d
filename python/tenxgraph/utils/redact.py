"""The one place the CLI removes secrets from text: every line it writes to stdout or stderr
(results, errors, usage messages, log lines) goes through ``redact``.

The rules are written for what people actually type, which is often not a valid URL: a password
may hold ``@``, ``/``, spaces or quotes, and the slashes after the scheme may be short by one.
So the user part of a URL runs from ``scheme:/`` (or ``//``) to the *last* ``@`` of the line, and
everything after its first ``:`` is the password. When a line holds text after the URL with an
``@`` of its own, more than the password goes: a mangled message is harmless, a printed password
is not."""

from __future__ import annotations

import re
from typing import TextIO

__all__ = ["RedactingStream", "redact", "MASK"]

MASK = "***"

# `postgresql://`, `postgres:/` (one slash short), `redis://`, or a bare `//`. A scheme starts
# where a run of scheme characters starts: tried at every place inside a long run (a 2 MB message
# of letters, a hex blob), the search was quadratic, and `tenxgraph threads messages --json`
# spun for minutes (docs helper, session 41).
_URL_START = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*:/+|//")
# Another URL after whitespace (and an opening bracket or quote) ends the previous one, so two
# URLs on one line keep their hosts.
_NEXT_URL = re.compile(r"\s[(\[<'\"]?(?=[A-Za-z][A-Za-z0-9+.-]*:/|//)")
# `password=...` in a key/value DSN (libpq quotes values with spaces as '...', with \' inside)
# and in a URL's query string, where the rest of the word goes too (a password may hold `&`).
# An unterminated quote runs to the end of the line.
_KV_PASSWORD = re.compile(
    r"""(?i)(\bpassword\s*=\s*)('(?:[^'\\\n]|\\.)*(?:'|$)|"(?:[^"\\\n]|\\.)*(?:"|$)|\S+)""",
    re.MULTILINE,
)


def _redact_line(line: str, mask: str = MASK) -> str:
    out: list[str] = []
    pos = 0
    while (m := _URL_START.search(line, pos)) is not None:
        start = m.end()
        nxt = _NEXT_URL.search(line, start)
        end = nxt.start() if nxt else len(line)
        segment = line[start:end]
        at = segment.rfind("@")
        if at >= 0:
            user, colon, _password = segment[:at].partition(":")
            if colon:
                segment = f"{user}:{mask}{segment[at:]}"
        out.append(line[pos:start] + segment)
        pos = end
    out.append(line[pos:])
    return "".join(out)


def redact(text: str, mask: str = MASK) -> str:
    """``text`` with every password masked: the password of URLs, well formed or not
    (``scheme://user:***@host``), and ``password=***`` in key/value DSNs and query strings.
    Idempotent: redacting twice gives the same text. ``mask``: what replaces each password
    (``tenxgraph.utils.logging.mask_secrets`` uses these rules with its own mask)."""
    if not text:
        return text
    lines = "".join(_redact_line(line, mask) for line in text.splitlines(keepends=True))
    return _KV_PASSWORD.sub(lambda m: m.group(1) + mask, lines)


class RedactingStream:
    """A text stream that redacts whole lines before passing them on. A line is held until its
    newline (or a flush) arrives: ``print`` writes a line in pieces, and a URL cut in two between
    writes would escape the rules."""

    def __init__(self, target: TextIO) -> None:
        self._target = target
        self._pending = ""

    def write(self, text: str) -> int:
        """Buffers ``text`` and passes on every completed line, redacted. Returns ``len(text)``."""
        self._pending += text
        cut = self._pending.rfind("\n") + 1
        if cut:
            self._target.write(redact(self._pending[:cut]))
            self._pending = self._pending[cut:]
        return len(text)

    def flush(self) -> None:
        """Passes on the held partial line (redacted), then flushes the wrapped stream."""
        if self._pending:
            self._target.write(redact(self._pending))
            self._pending = ""
        self._target.flush()

    def isatty(self) -> bool:
        """Whether the wrapped stream is a terminal (False when it cannot say)."""
        return bool(getattr(self._target, "isatty", lambda: False)())

    def __getattr__(self, name: str):  # encoding, fileno, ... of the wrapped stream
        return getattr(self._target, name)
