"""``file_read``, ``file_write``, ``file_search``: text files under one root directory.
10xGraph's names, signatures and tool schemas.

The root is the run config's ``file_tool_root`` (else ``workspace_root``, else the current
directory), e.g. ``app.invoke(..., config={"thread_id": "t", "file_tool_root": "/srv/work"})``.
A path that resolves outside it (``..``, an absolute path elsewhere, a symlink pointing out) is
refused with ``{"error": "path must stay within the configured root: ..."}``: every bad input
is a JSON ``{"error": ...}`` result the model can read, never an exception.

For the ledger: reading and searching are idempotent (a replay after a crash may read again);
``file_write`` is ``at_most_once``: an append or a create run twice would not be the same, so a
write whose outcome a crash left unknown is not run again (the model is told).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from tenxgraph.utils.tool_decorator import tool

__all__ = ["file_read", "file_search", "file_write"]

MAX_READ_CHARS = 20_000
MAX_WRITE_CHARS = 200_000
MAX_SEARCH_RESULTS = 20
_MAX_SEARCH_FILE_SIZE = 1_000_000
_PREVIEW_CHARS = 240
_SKIP_DIRS = frozenset({".git", ".hg", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".venv",
                        "__pycache__", "build", "dist", "htmlcov", "node_modules", "venv"})


def _root(config: dict[str, Any] | None) -> Path:
    cfg = config or {}
    return Path(str(cfg.get("file_tool_root") or cfg.get("workspace_root") or ".")).expanduser().resolve()


def _inside(path: str, root: Path) -> Path:
    if not path or not path.strip():
        raise ValueError("path is required")
    candidate = Path(path).expanduser()
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if not resolved.is_relative_to(root):
        raise ValueError(f"path must stay within the configured root: {root}")
    return resolved


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()


def _is_text(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return b"\x00" not in handle.read(2048)
    except OSError:
        return False


def _error(message: str, **extra: Any) -> str:
    return json.dumps({"error": message, **extra})


@tool(
    name="file_read",
    description=("Read a UTF-8 text file from the configured workspace root. Supports optional "
                 "1-based start_line/end_line and truncates long output."),
    tags=["file", "filesystem", "read"],
    capabilities=["read_files"],
)
def file_read(
    path: str,
    start_line: int = 1,
    end_line: int = 0,
    max_chars: int = MAX_READ_CHARS,
    config: dict[str, Any] | None = None,
) -> str:
    """JSON ``{"path", "start_line", "end_line", "content", "truncated"}`` for lines
    ``start_line..end_line`` (1-based; ``end_line=0``: to the end), at most ``max_chars``
    (capped at 20,000). ``{"error": ...}`` for a path outside the root, a missing file, a
    directory, a binary file or ``end_line < start_line``."""
    root = _root(config)
    try:
        target = _inside(path, root)
        if not target.exists():
            return _error("file does not exist", path=_rel(target, root))
        if not target.is_file():
            return _error("path is not a file", path=_rel(target, root))
        if not _is_text(target):
            return _error("file appears to be binary", path=_rel(target, root))
        lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
        start = max(1, int(start_line))
        end = int(end_line) if end_line else len(lines)
        if end < start:
            return _error("end_line must be greater than or equal to start_line")
        text = "\n".join(lines[start - 1:end])
        limit = max(1, min(int(max_chars), MAX_READ_CHARS))
        return json.dumps({"path": _rel(target, root), "start_line": start, "end_line": min(end, len(lines)),
                           "content": text[:limit], "truncated": len(text) > limit})
    except Exception as exc:  # noqa: BLE001 - an answer the model can read
        return _error(str(exc))


@tool(
    name="file_write",
    description=("Write UTF-8 text to a file under the configured workspace root. Use mode='create' "
                 "to avoid overwriting, mode='overwrite' to replace, or mode='append' to append."),
    tags=["file", "filesystem", "write"],
    capabilities=["write_files"],
    side_effects="at_most_once",
)
def file_write(
    path: str,
    content: str,
    mode: Literal["create", "overwrite", "append"] = "create",
    create_dirs: bool = False,
    config: dict[str, Any] | None = None,
) -> str:
    """JSON ``{"status": "written", "path", "bytes", "mode"}``. ``{"error": ...}`` (nothing
    written) for a path outside the root, content over 200,000 characters, an existing file
    with ``mode="create"``, a path that is a directory, an unknown mode, or a missing parent
    directory without ``create_dirs``."""
    root = _root(config)
    try:
        target = _inside(path, root)
        if len(content) > MAX_WRITE_CHARS:
            return _error("content is too large")
        if target.exists() and not target.is_file():
            return _error("path exists and is not a file", path=_rel(target, root))
        if mode not in ("create", "overwrite", "append"):
            return _error(f"unsupported mode: {mode}")
        if target.exists() and mode == "create":
            return _error("file already exists", path=_rel(target, root))
        if not target.parent.exists():
            if not create_dirs:
                return _error("parent directory does not exist")
            target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a" if mode == "append" else "w", encoding="utf-8") as handle:
            handle.write(content)
        return json.dumps({"status": "written", "path": _rel(target, root), "bytes": len(content.encode("utf-8")),
                           "mode": mode})
    except Exception as exc:  # noqa: BLE001 - an answer the model can read
        return _error(str(exc))


def _candidates(search_root: Path, glob: str) -> Iterable[Path]:
    if search_root.is_file():
        return [search_root]
    return search_root.rglob(glob)


def _searchable(candidate: Path, glob: str) -> bool:
    if any(part in _SKIP_DIRS for part in candidate.parts) or not candidate.is_file():
        return False
    if candidate.stat().st_size > _MAX_SEARCH_FILE_SIZE:
        return False
    return glob == "**/*" or fnmatch.fnmatch(candidate.name, Path(glob).name)


def _preview(line: str) -> str:
    text = line.strip()
    return text if len(text) <= _PREVIEW_CHARS else f"{text[:_PREVIEW_CHARS - 3]}..."


@tool(
    name="file_search",
    description=("Search text files under the configured workspace root by filename and content. "
                 "Returns relative paths, line numbers, and short previews."),
    tags=["file", "filesystem", "search"],
    capabilities=["read_files"],
)
def file_search(
    query: str,
    path: str = "",
    glob: str = "**/*",
    max_results: int = MAX_SEARCH_RESULTS,
    config: dict[str, Any] | None = None,
) -> str:
    """JSON ``{"query", "root", "results": [{"path", "match_type", "line", "preview"}]}``:
    files under ``path`` (relative to the root) whose name or lines contain ``query``
    (case-insensitive), at most ``max_results`` (capped at 100). ``{"error": ...}`` for an
    empty query, a path outside the root or one that does not exist."""
    if not query:
        return _error("query is required")
    root = _root(config)
    try:
        search_root = _inside(path or ".", root)
        if not search_root.exists():
            return _error("search path does not exist")
        needle = query.lower()
        limit = max(1, min(int(max_results), 100))
        results: list[dict[str, Any]] = []
        for candidate in _candidates(search_root, glob):
            if len(results) >= limit:
                break
            # rglob follows no symlinked directories, but a symlinked file may point outside.
            if not _searchable(candidate, glob) or not candidate.resolve().is_relative_to(root):
                continue
            rel = _rel(candidate, root)
            if needle in candidate.name.lower():
                results.append({"path": rel, "match_type": "filename", "line": None, "preview": candidate.name})
                if len(results) >= limit:
                    break
            if not _is_text(candidate):
                continue
            try:
                lines = candidate.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for number, line in enumerate(lines, start=1):
                if needle in line.lower():
                    results.append({"path": rel, "match_type": "content", "line": number, "preview": _preview(line)})
                    if len(results) >= limit:
                        break
        return json.dumps({"query": query, "root": _rel(search_root, root), "results": results})
    except Exception as exc:  # noqa: BLE001 - an answer the model can read
        return _error(str(exc))
