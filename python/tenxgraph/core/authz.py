"""The authorization block a run's config carries (``config["authz"]``), as 10xGraph 0.10 defines
it: who the caller is, whether their data is isolated (``scope``) and what they may do
(``scopes``). The API server (10xgraph-api) stamps it; a direct SDK caller builds it or passes none
and gets the permissive defaults.

    config["authz"] = {"user_id": "u1", "scope": "owner" | "none", "scopes": ["graph:invoke", ...]}

A block with ``scope: "owner"`` scopes the call to its caller on every built-in checkpointer and
on ``invoke`` / ``stream`` / ``stop``, whatever the checkpointer's ``enforce_user_isolation``;
``scope: "none"`` never loosens an isolating checkpointer, and a contradicting or malformed block
is refused (``tenxgraph.storage.checkpointer.authz_guard``, docs/migrating-from-10xgraph.md).
"""

from __future__ import annotations

from typing import Any

AUTHZ_KEY = "authz"

GRAPH_INVOKE = "graph:invoke"
GRAPH_STREAM = "graph:stream"
GRAPH_STOP = "graph:stop"
GRAPH_FIX = "graph:fix"
GRAPH_SETUP = "graph:setup"
GRAPH_READ = "graph:read"
CHECKPOINT_READ = "checkpointer:read"
CHECKPOINT_WRITE = "checkpointer:write"
CHECKPOINT_DELETE = "checkpointer:delete"
STORE_READ = "store:read"
STORE_WRITE = "store:write"
STORE_DELETE = "store:delete"
# 10xGraph's deprecated names for the store scopes.
MEMORY_READ = STORE_READ
MEMORY_WRITE = STORE_WRITE
MEMORY_DELETE = STORE_DELETE
FILES_READ = "files:read"
FILES_UPLOAD = "files:upload"
CONFIG_READ = "config:read"

ALL_SCOPES = frozenset({
    GRAPH_INVOKE, GRAPH_STREAM, GRAPH_STOP, GRAPH_FIX, GRAPH_SETUP, GRAPH_READ,
    CHECKPOINT_READ, CHECKPOINT_WRITE, CHECKPOINT_DELETE,
    STORE_READ, STORE_WRITE, STORE_DELETE,
    FILES_READ, FILES_UPLOAD, CONFIG_READ,
})

SCOPE_OWNER = "owner"
SCOPE_NONE = "none"
_ISOLATION = (SCOPE_OWNER, SCOPE_NONE)


def get_authz(config: Any) -> dict[str, Any] | None:
    """The authz block: ``config["user"]["authz"]`` (where the API stamps it, so it always wins),
    else ``config["authz"]``; None when neither is a dict."""
    if not isinstance(config, dict):
        return None
    user = config.get("user")
    if isinstance(user, dict) and isinstance(user.get(AUTHZ_KEY), dict):
        return user[AUTHZ_KEY]
    block = config.get(AUTHZ_KEY)
    return block if isinstance(block, dict) else None


def isolation_scope(config: Any) -> str | None:
    """``"owner"`` or ``"none"`` from the block; None when no valid policy is present."""
    block = get_authz(config)
    scope = block.get("scope") if block is not None else None
    return scope if scope in _ISOLATION else None


def has_scope(config: Any, scope: str) -> bool:
    """Whether the caller holds ``scope``: always without a block (a direct SDK caller); with one,
    only when its ``scopes`` is a collection naming it."""
    block = get_authz(config)
    if block is None:
        return True
    scopes = block.get("scopes")
    return isinstance(scopes, (list, tuple, set, frozenset)) and scope in scopes


def build_authz(user_id: str | int | None, *, scope: str = SCOPE_NONE, scopes: Any = ()) -> dict[str, Any]:
    """A block for ``config["authz"]``; an unknown ``scope`` becomes ``"none"``."""
    return {"user_id": user_id, "scope": scope if scope in _ISOLATION else SCOPE_NONE, "scopes": list(scopes)}
