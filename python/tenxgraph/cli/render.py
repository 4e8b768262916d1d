"""Output: aligned text tables for people, one JSON document for scripts (``--json``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from pydantic import BaseModel

__all__ = ["cell", "emit_json", "table"]


def cell(value: Any, width: int | None = None) -> str:
    """One value as table text: times to the second in UTC, None as ``-``, newlines flattened."""
    if value is None:
        text = "-"
    elif isinstance(value, datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%SZ")
    elif isinstance(value, (list, tuple)):
        text = ", ".join(str(v) for v in value) or "-"
    else:
        text = str(value)
    text = " ".join(text.split())
    if width is not None and len(text) > width:
        text = text[: max(width - 3, 0)] + "..."
    return text


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], widths: dict[str, int] | None = None) -> str:
    """``columns``: (key, header). Long cells are cut to ``widths[key]`` characters."""
    widths = widths or {}
    body = [[cell(r.get(k), widths.get(k)) for k, _ in columns] for r in rows]
    header = [h for _, h in columns]
    size = [max([len(header[i])] + [len(line[i]) for line in body]) for i in range(len(columns))]
    lines = ["  ".join(h.ljust(size[i]) for i, h in enumerate(header)).rstrip()]
    lines += ["  ".join(v.ljust(size[i]) for i, v in enumerate(line)).rstrip() for line in body]
    return "\n".join(lines)


def emit_json(obj: Any, out: TextIO) -> None:
    """Writes ``obj`` to ``out`` as indented JSON, pydantic models dumped in JSON mode, non-ASCII
    kept as is, one trailing newline."""
    def plain(o: Any) -> Any:
        if isinstance(o, BaseModel):
            return o.model_dump(mode="json")
        if isinstance(o, list):
            return [plain(x) for x in o]
        if isinstance(o, dict):
            return {k: plain(v) for k, v in o.items()}
        return o

    out.write(json.dumps(plain(obj), indent=2, ensure_ascii=False) + "\n")
