"""What the CLI reads from a checkpointer, as pydantic models (the ``--json`` output is their
dump). Reads go through the Rust store with the thread's owner as the user, so they work whether
or not the store enforces user isolation."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from tenxgraph import _core
from tenxgraph.core.exceptions import InvalidConfigError
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.storage.checkpointer.native_checkpointer import live_lease

__all__ = [
    "LeaseView",
    "LedgerRow",
    "MessageRow",
    "ThreadDetail",
    "ThreadNotFound",
    "ThreadSummary",
    "VersionRow",
    "iter_threads",
    "lease_holder",
    "ledger_result",
    "ledger_rows",
    "ledger_value",
    "message_rows",
    "thread_detail",
    "thread_owner",
]

# The `__kind__` of a ledger row written when a tool call starts, before its result exists
# (the store's constant: it writes those rows).
STARTED_KIND: str = _core.INTENT_KIND


class ThreadNotFound(LookupError):
    """No thread with that id in the store (the CLI exits with its not-found code)."""
    def __init__(self, thread_id: str) -> None:
        super().__init__(f"thread {thread_id!r} not found")
        self.thread_id = thread_id


# The status listed for a thread whose id the store's id type refuses: its state cannot be read.
ID_REFUSED = "id-refused"


class ThreadSummary(BaseModel):
    """One thread in ``tenxgraph threads``: ids, name, and its latest state's status, node, step
    and version (None while the thread has no state)."""
    thread_id: str
    user_id: str
    name: str | None
    status: str | None  # None: the thread has no state yet
    current_node: str | None
    step: int | None
    version: int | None
    updated_at: datetime


class VersionRow(BaseModel):
    """One stored state version of a thread, with the status, node and step it recorded."""
    version: int
    created_at: datetime | None
    status: str | None
    current_node: str | None
    step: int | None


class LeaseView(BaseModel):
    """Who holds a thread's lease: the run id, the fencing token, seconds left (negative once
    expired), and the holder's host and pid."""
    holder: str  # the run id
    token: int  # the fencing token
    expires_in: float  # seconds
    host: str | None = None
    pid: int | None = None


class ThreadDetail(ThreadSummary):
    """``tenxgraph thread``: the summary plus creation time, the error of a failed run, a pending
    ``interrupt()``, the interrupt reason, the lease and every stored version (newest first)."""
    created_at: datetime
    error: str | None
    pending_interrupt: dict[str, Any] | None
    interrupt_reason: str | None
    lease: LeaseView | None
    versions: list[VersionRow]


class MessageRow(BaseModel):
    """One stored message: id, role, its text, its tool calls as ``name(call id)``, and the raw message."""
    message_id: str
    role: str
    text: str
    tool_calls: list[str]
    data: dict[str, Any]


class LedgerRow(BaseModel):
    """One tool-ledger row: its key, the tool (from the issuing message, else the result), status
    (``completed``; ``started``: outcome unknown; ``paused``: waiting at ``interrupt()``; or
    ``malformed``), when it was recorded and its size."""
    key: str
    tool: str | None
    status: str  # completed | started | malformed
    recorded_at: datetime | None
    result_bytes: int | None


def _when(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _meta(state: dict[str, Any]) -> dict[str, Any]:
    return _dict(state.get("execution_meta"))


def _version_row(version: int, created_at: float | None, state: dict[str, Any]) -> VersionRow:
    meta = _meta(state)
    step = meta.get("step")
    return VersionRow(
        version=version,
        created_at=_when(created_at),
        status=meta.get("status"),
        current_node=meta.get("current_node"),
        step=step if isinstance(step, int) else None,
    )


async def thread_owner(cp: BaseCheckpointer, thread_id: str) -> str:
    """The user id owning ``thread_id``; raises ``ThreadNotFound`` when there is no such thread."""
    owner = await cp._native.thread_owner(thread_id)
    if owner is None:
        raise ThreadNotFound(thread_id)
    return owner


async def _versions(cp: BaseCheckpointer, thread_id: str, owner: str) -> list[tuple[VersionRow, dict[str, Any]]]:
    rows = await cp._native.state_versions(thread_id, owner)
    out = []
    for version, created_at, text in rows:
        state = json.loads(text)
        out.append((_version_row(version, created_at, state), state))
    return out


def _summary(row: tuple[str, str, str | None, str, float, float], latest: VersionRow | None) -> dict[str, Any]:
    thread_id, user_id, name, _meta_json, _created, updated = row
    return {
        "thread_id": thread_id,
        "user_id": user_id,
        "name": name,
        "status": latest.status if latest else None,
        "current_node": latest.current_node if latest else None,
        "step": latest.step if latest else None,
        "version": latest.version if latest else None,
        "updated_at": _when(updated),
    }


async def iter_threads(
    cp: BaseCheckpointer,
    *,
    user: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
    page_size: int = 200,
    progress: Callable[[int, int], None] | None = None,
) -> AsyncIterator[ThreadSummary]:
    """Threads, most recently updated first, filtered; ``progress(scanned, matched)`` after each
    page. Stops at ``limit`` matches or at the first thread older than ``since``."""
    offset = scanned = matched = 0
    while matched < limit:
        page = await cp._native.list_threads(user, None, offset, page_size)
        if not page:
            return
        offset += len(page)
        for row in page:
            scanned += 1
            if since is not None and row[5] < since.timestamp():
                return  # sorted by updated_at: everything after is older
            try:
                versions = await cp._native.state_versions(row[0], row[1])
            except InvalidConfigError:
                # An id the store's id type refuses (10xGraph stored 0 and negative ids on int
                # schemas): listed for what it is, not a listing that fails for every thread.
                summary = ThreadSummary(**{**_summary(row, None), "status": ID_REFUSED})
            else:
                latest = _version_row(versions[0][0], versions[0][1], json.loads(versions[0][2])) if versions else None
                summary = ThreadSummary(**_summary(row, latest))
            if status is not None and summary.status != status:
                continue
            matched += 1
            yield summary
            if matched >= limit:
                return
        if progress is not None:
            progress(scanned, matched)
        if len(page) < page_size:
            return


async def lease_holder(cp: BaseCheckpointer, thread_id: str, owner: str) -> LeaseView | None:
    """Who holds the thread's lease right now: None when nobody does (never held, released or
    expired), and with a checkpointer that has no leases (``aget_lease``)."""
    get = getattr(cp, "aget_lease", None)
    if get is None:
        return None
    info = await get({"thread_id": thread_id, "user_id": owner})
    if not live_lease(info):
        return None
    return LeaseView(holder=str(info.get("holder")), token=int(info.get("token", 0)),
                     expires_in=float(info["expires_in"]), host=info.get("host"), pid=info.get("pid"))


async def thread_detail(cp: BaseCheckpointer, thread_id: str) -> ThreadDetail:
    """The ``ThreadDetail`` of ``thread_id``, read as its owner; raises ``ThreadNotFound``."""
    owner = await thread_owner(cp, thread_id)
    row = await cp._native.get_thread(thread_id, owner)
    if row is None:
        raise ThreadNotFound(thread_id)
    versions = await _versions(cp, thread_id, owner)
    latest, state = versions[0] if versions else (None, {})
    meta = _meta(state)
    internal = _dict(meta.get("internal_data"))
    pending = _dict(meta.get("interrupt_data")).get("interrupt") if meta.get("interrupt_reason") == "interrupt" else None
    return ThreadDetail(
        **_summary(row, latest),
        created_at=datetime.fromtimestamp(row[4], tz=timezone.utc),
        error=internal.get("error") if meta.get("status") == "error" else None,
        pending_interrupt=pending if isinstance(pending, dict) else None,
        interrupt_reason=meta.get("interrupt_reason"),
        lease=await lease_holder(cp, thread_id, owner),
        versions=[v for v, _ in versions],
    )


def _text(message: dict[str, Any]) -> str:
    parts = []
    for block in message.get("content") or []:
        if isinstance(block, dict):
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_result":
                parts.append(str(block.get("output", "")))
    return " ".join(parts)


def _call_names(message: dict[str, Any]) -> list[tuple[str | None, str | None]]:
    out = []
    for c in message.get("tools_calls") or []:
        if isinstance(c, dict):
            out.append((c.get("id"), _dict(c.get("function")).get("name") or c.get("name")))
    return out


async def message_rows(cp: BaseCheckpointer, thread_id: str, limit: int | None = None) -> list[MessageRow]:
    """The thread's messages in order (the last ``limit`` when given; none for ``limit <= 0``),
    read as its owner; raises ``ThreadNotFound``."""
    owner = await thread_owner(cp, thread_id)
    raw = await cp._native.list_messages(thread_id, owner, None, None, None)
    messages = [json.loads(m) for m in raw]
    if limit is not None:
        messages = messages[-limit:] if limit > 0 else []
    return [
        MessageRow(
            message_id=str(m.get("message_id")),
            role=str(m.get("role")),
            text=_text(m),
            tool_calls=[f"{name}({cid})" for cid, name in _call_names(m)],
            data=m,
        )
        for m in messages
    ]


async def _tool_names(cp: BaseCheckpointer, thread_id: str, owner: str) -> dict[tuple[str, str], str]:
    """(assistant message_id, tool_call_id) -> tool name, from the assistant messages that issued
    the calls (ids as text; see `_key_ids`)."""
    names: dict[tuple[str, str], str] = {}
    for text in await cp._native.list_messages(thread_id, owner, None, None, None):
        m = json.loads(text)
        for call_id, name in _call_names(m):
            if call_id and name:
                names[(str(m.get("message_id")), str(call_id))] = name
    return names


def _key_ids(key: str) -> tuple[str, str] | None:
    """(message id, call id) as text, from a ledger key: today's ``["<mid>", <cid>, ...]`` or
    10xGraph's ``"<mid>:<cid>"`` (split at the first ``:``, a guess for ids that hold one)."""
    if key.startswith("["):
        try:
            parts = json.loads(key)
        except ValueError:
            return None
        if isinstance(parts, list) and len(parts) >= 2 and parts[1] is not None:
            return str(parts[0]), str(parts[1])
        return None
    mid, sep, cid = key.partition(":")
    return (mid, cid) if sep else None


def _status(result: Any) -> str:
    if not isinstance(result, dict):
        return "malformed"
    kind = result.get("__kind__")
    if kind == STARTED_KIND:
        return "paused" if result.get("paused") is True else "started"
    return "completed" if kind in ("message", "raw") else "malformed"


def _tool_from_result(result: Any) -> str | None:
    """The tool name a row itself carries (an intent record's ``tool``; a result message's
    ``metadata.function_name``), for calls whose issuing message is gone."""
    if not isinstance(result, dict):
        return None
    if isinstance(result.get("tool"), str):
        return result["tool"]
    value = result.get("value")
    meta = value.get("metadata") if isinstance(value, dict) else None
    return meta.get("function_name") if isinstance(meta, dict) else None


async def ledger_rows(cp: BaseCheckpointer, thread_id: str) -> list[LedgerRow]:
    """Every ledger row of the thread, read as its owner; raises ``ThreadNotFound``."""
    owner = await thread_owner(cp, thread_id)
    names = await _tool_names(cp, thread_id, owner)
    rows = []
    for key, result_json, created_at in await cp._native.ledger_list(thread_id, owner):
        result = json.loads(result_json) if result_json is not None else None
        rows.append(LedgerRow(
            key=key,
            tool=names.get(_key_ids(key) or ("", "")) or _tool_from_result(result),
            status=_status(result),
            recorded_at=_when(created_at),
            result_bytes=len(result_json.encode()) if result_json is not None else None,
        ))
    return rows


class LedgerValue(BaseModel):
    """One call's record as a user reads it: what the tool returned, not the ledger's envelope."""

    status: str
    tool: str | None = None
    result: Any = None
    is_error: bool = False
    state: dict[str, Any] | None = None
    message: dict[str, Any] | None = None


def ledger_value(record: Any) -> LedgerValue:
    """The user's value of a ledger row. A result row holds the tool message the model saw (its
    tool-result outputs are what the tool returned) or, in rows 10xGraph wrote, the raw value; an
    intent row has no result yet."""
    status = _status(record)
    if status != "completed":
        return LedgerValue(status=status, tool=_tool_from_result(record))
    value = record.get("value")
    state = record.get("state") if isinstance(record.get("state"), dict) else None
    if record.get("__kind__") == "raw" or not isinstance(value, dict):
        return LedgerValue(status=status, tool=_tool_from_result(record), result=value, state=state)
    blocks = [b for b in value.get("content") or [] if isinstance(b, dict)]
    outputs = [b.get("output") for b in blocks if b.get("type") == "tool_result"]
    if not outputs:  # a message without result blocks: its text is what the model saw
        outputs = [b.get("text") for b in blocks if b.get("type") == "text"]
    return LedgerValue(
        status=status,
        tool=_tool_from_result(record),
        result=outputs[0] if len(outputs) == 1 else outputs,
        is_error=any(b.get("is_error") is True for b in blocks),
        state=state,
        message=value,
    )


async def ledger_result(cp: BaseCheckpointer, thread_id: str, call: str) -> tuple[str, Any]:
    """The recorded row of one call, by its full ledger key or by its tool_call_id alone (when
    exactly one key names it). Raises KeyError with the keys that exist."""
    owner = await thread_owner(cp, thread_id)
    rows = await cp._native.ledger_list(thread_id, owner)
    exact = [r for r in rows if r[0] == call]
    matches = exact or [r for r in rows if (_key_ids(r[0]) or ("", None))[1] == call]
    if len(matches) != 1:
        known = ", ".join(r[0] for r in rows) or "none"
        why = "is ambiguous" if matches else "has no ledger row"
        raise KeyError(f"call {call!r} {why} in thread {thread_id!r} (keys: {known})")
    key, result_json, _ = matches[0]
    return key, (json.loads(result_json) if result_json is not None else None)
