"""The per-call ``config["authz"]`` policy (10xGraph 0.10's ``tenxgraph.core.authz`` block), enforced
where a config enters: every built-in checkpointer method that takes one, and ``invoke`` /
``stream`` / ``stop`` before a run reads or writes anything.

With a block whose ``scope`` is ``"owner"`` the call is scoped to its caller (``config["user_id"]``,
the anonymous user without one) whatever the checkpointer's ``enforce_user_isolation``: a thread
another user owns is refused with ``StorageError`` ``STORAGE_FORBIDDEN_001`` (reads included,
where 10xGraph answered None), and ``alist_threads`` lists the caller's threads only. A brand-new
thread (no owner yet) is allowed; the caller's first write makes it theirs.

Stricter than 10xGraph, deliberately: ``scope: "none"`` never loosens a checkpointer that isolates
users (a request's config is not where an instance's protection is switched off; open an
instance with ``enforce_user_isolation=False`` for that), and a block that names a different
``user_id`` than the config's, or carries an unknown ``scope``, is refused
(``STORAGE_FORBIDDEN_003``) instead of silently running under the other identity or no policy.
``scopes`` are not enforced here (as in 10xGraph, the API server gates them).
"""

from __future__ import annotations

from typing import Any

from tenxgraph.core.authz import AUTHZ_KEY, SCOPE_NONE, SCOPE_OWNER, get_authz
from tenxgraph.core.exceptions import StorageError
from tenxgraph._user_id import user_id_of

__all__ = ["authz_owner_scoped", "check_authz", "thread_owner"]


def _caller(config: dict[str, Any]) -> str:
    return str(user_id_of(config))


def _block(config: Any) -> dict[str, Any] | None:
    """The validated block, or None when the config carries none."""
    if not isinstance(config, dict):
        return None
    block = get_authz(config)
    if block is None:
        user = config.get("user")
        present = AUTHZ_KEY in config or (isinstance(user, dict) and AUTHZ_KEY in user)
        if present:
            raise StorageError("config['authz'] must be a dict (see tenxgraph.core.authz)", "STORAGE_FORBIDDEN_003")
        return None
    scope = block.get("scope")
    if scope is not None and scope not in (SCOPE_OWNER, SCOPE_NONE):
        raise StorageError(f"config['authz']['scope'] must be 'owner' or 'none', got {scope!r}",
                           "STORAGE_FORBIDDEN_003")
    claimed = block.get("user_id")
    if claimed is not None and str(claimed) != _caller(config):
        raise StorageError("config['authz'] names another user than config['user_id']", "STORAGE_FORBIDDEN_003")
    return block


def authz_owner_scoped(config: Any) -> bool:
    """Whether ``config`` carries a valid block with ``scope: "owner"`` (raises for a bad one)."""
    block = _block(config)
    return block is not None and block.get("scope") == SCOPE_OWNER


async def _owner(checkpointer: Any, thread_id: str) -> str | None:
    if hasattr(checkpointer, "_python_store") or not hasattr(checkpointer, "_native"):
        # A checkpointer written in Python answers for itself; one that cannot tell cannot be
        # checked, so the call is refused rather than let through.
        from tenxgraph.storage.checkpointer.python_store import bounded_call

        try:
            owner = await bounded_call(checkpointer, "aget_thread_owner",
                                       lambda: checkpointer.aget_thread_owner(thread_id))
        except NotImplementedError as exc:
            raise StorageError(
                f"{type(checkpointer).__name__} cannot tell a thread's owner (aget_thread_owner), so a "
                "config['authz'] owner scope cannot be enforced on it", "STORAGE_FORBIDDEN_003",
            ) from exc
        return None if owner is None else str(owner)
    # Asked without a user: the owner as the store knows it, not as this caller may see it.
    return await checkpointer._native.thread_owner(thread_id)


async def thread_owner(checkpointer: Any, thread_id: str) -> str | None:
    """The user who owns ``thread_id`` as the store knows it (not as one caller may see it), None
    for a thread nobody owns yet; ``StorageError`` STORAGE_FORBIDDEN_003 for a Python
    checkpointer that cannot tell."""
    return await _owner(checkpointer, thread_id)


async def check_authz(checkpointer: Any, config: Any, thread_id: Any = None) -> None:
    """Refuses the call (``StorageError``) when ``config``'s authz block forbids it; returns
    quietly without a block, or when the caller may act on the thread."""
    if not authz_owner_scoped(config):
        return
    tid = thread_id if thread_id is not None else config.get("thread_id")
    if tid is None or tid == "":
        return
    owner = await _owner(checkpointer, str(tid))
    if owner is not None and owner != _caller(config):
        # The owner's name is not given: the caller may not know who it is.
        raise StorageError("Thread is owned by a different user", "STORAGE_FORBIDDEN_001",
                           {"thread_id": str(tid)})
