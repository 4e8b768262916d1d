"""PythonStore: how the Rust loop drives a checkpointer written in Python.

``compile(checkpointer=MyCheckpointer())`` with a ``BaseCheckpointer`` subclass of your own
attaches one of these. The Rust side (``src/py/py_store.rs``) keeps a working copy in memory for
versioning, leases and intent records, and calls the coroutines below: ``load`` at each run start
(your ``aget_state``), ``save`` after each committed step (your ``aput_checkpoint``: the state with
its whole context, plus the step's new messages), ``ledger_get`` / ``ledger_put`` for the tool
ledger (your ``aget_tool_result`` / ``aput_tool_result``, keys in 10xGraph's
``"<message id>:<call id>"`` form).

Your coroutines run on a private event loop in a thread of their own, never on the loop of the
caller of ``ainvoke``: do not share loop-bound clients (an asyncpg pool made on your app's loop)
with the checkpointer.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
from typing import Any

from tenxgraph import _core
from tenxgraph._state_codec import encode_state
from tenxgraph.core.exceptions import GraphError, InvalidConfigError, StorageError
from tenxgraph.core.state.message import Message
from tenxgraph.storage.checkpointer.base_checkpointer import BaseCheckpointer

__all__ = ["PythonStore", "attach_python_store"]

_LEDGER_METHODS = ("aget_tool_result", "aput_tool_result")


_DEFAULT_CALL_TIMEOUT = 30.0


def _call_timeout(checkpointer: Any) -> float:
    """How long one call into the checkpointer may take before the run gets
    ``TransientStorageError`` STORAGE_TRANSIENT_001: its ``call_timeout`` attribute (seconds),
    30 by default, as PostgreSQL's statement deadline. A method that never returned held the run
    for ever. Anything but a positive finite number is ``InvalidConfigError`` STORAGE_CONFIG_002."""
    value = getattr(checkpointer, "call_timeout", None)
    if value is None:
        return _DEFAULT_CALL_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise InvalidConfigError(f"call_timeout must be a positive, finite number of seconds, got {value!r}",
                                 "STORAGE_CONFIG_002", {"field": "call_timeout", "value": repr(value)[:80]})
    return float(value)


async def bounded_call(checkpointer: Any, what: str, call: Any) -> Any:
    """``await call()``, a method of a checkpointer written in Python, called from outside a run
    (``astop``, an authz owner check) the way a run calls it: on the store's own loop once the
    checkpointer is attached to a graph, within its ``call_timeout``
    (``TransientStorageError`` STORAGE_TRANSIENT_001), and a failure of its own is a
    ``StorageError`` STORAGE_001 naming the method. Before, these calls awaited the method on
    the caller's loop without a deadline: a hung store hung ``stop()``; and a bare
    ``ConnectionError`` or ``TypeError`` reached the caller (red-team, session 31).
    ``NotImplementedError`` and ``StorageError`` go through as they are."""
    from tenxgraph.core.exceptions import TransientStorageError

    limit = _call_timeout(checkpointer)
    store = getattr(checkpointer, "_python_store", None)

    async def invoke() -> Any:
        return await call()

    try:
        if store is None:
            return await asyncio.wait_for(invoke(), limit)
        future = asyncio.run_coroutine_threadsafe(invoke(), store.loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), limit)
        finally:
            future.cancel()
    except TimeoutError:
        raise TransientStorageError(f"{type(checkpointer).__name__}.{what} did not answer within {limit:g}s (its "
                                    "call_timeout)", "STORAGE_TRANSIENT_001", {"method": what}) from None
    except (NotImplementedError, StorageError):
        raise
    except Exception as exc:
        raise StorageError(f"{type(checkpointer).__name__}.{what} failed: {type(exc).__name__}: {exc}",
                           "STORAGE_001", {"method": what}) from exc


def _ledger_key(key: str) -> str:
    """A stored key (``["<message id>", "<call id>"]``) in 10xGraph's form; others as they are."""
    try:
        parts = json.loads(key)
    except (TypeError, ValueError):
        return key
    if isinstance(parts, list) and len(parts) == 2:
        return f"{parts[0]}:{parts[1]}"
    return key


class PythonStore:
    """The adapter between the Rust loop and a Python ``BaseCheckpointer``: owns a private event
    loop on a daemon thread, where every call into the checkpointer runs. Made by
    ``attach_python_store``; not for direct use."""
    def __init__(self, checkpointer: BaseCheckpointer[Any]) -> None:
        self.checkpointer = checkpointer
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tenxgraph-python-store", daemon=True)
        self._thread.start()
        self.native = _core.NativeStore.python(self, self.loop, contextvars.copy_context(),
                                               _call_timeout(checkpointer))

    @staticmethod
    def _config(thread_id: str, user_id: str) -> dict[str, Any]:
        return {"thread_id": thread_id, "user_id": user_id}

    async def running_threads(self, after: str | None, limit: int) -> list[tuple[str, str]]:
        """``(thread_id, user_id)`` of the threads whose state says a run is under way, after
        ``after`` in id order, at most ``limit``: the checkpointer's ``alist_threads`` (every
        thread it lists), each one's state read through ``aget_state``. What a recovery pass
        (``arecover``, ``recover_on_start``) resumes; before, it asked only this process's
        working copy, empty after a restart, and a crashed turn was never finished."""
        from tenxgraph._user_id import DEFAULT_ANONYMOUS_USER_ID
        from tenxgraph.core.state.execution_state import ExecutionStatus

        listed = await self.checkpointer.alist_threads({})
        ids = sorted({(str(t.thread_id), str(t.user_id if t.user_id not in (None, "") else DEFAULT_ANONYMOUS_USER_ID))
                      for t in listed or []})
        out: list[tuple[str, str]] = []
        for thread_id, user_id in ids:
            if after is not None and thread_id <= after:
                continue
            state = await self.checkpointer.aget_state(self._config(thread_id, user_id))
            if state is not None and state.execution_meta.status == ExecutionStatus.RUNNING:
                out.append((thread_id, user_id))
                if len(out) >= limit:
                    break
        return out

    async def load(self, thread_id: str, user_id: str) -> tuple[str, list[str]] | None:
        """The thread's state as ``(state JSON without context, [message JSON, ...])`` from the
        checkpointer's ``aget_state``, or None when it has none."""
        state = await self.checkpointer.aget_state(self._config(thread_id, user_id))
        if state is None:
            return None
        return json.dumps(encode_state(state, with_context=False)), [m.model_dump_json() for m in state.context]

    async def save(self, thread_id: str, user_id: str, state_json: str, messages: list[str], new: list[str]) -> None:
        """Writes one committed step through the checkpointer's ``aput_checkpoint``: the state with
        its whole context (``messages``) plus the step's new messages (``new``). Raises what the
        checkpointer raises; the step write then fails and the Rust working copy drops the step."""
        data = json.loads(state_json)
        data["context"] = [json.loads(m) for m in messages]
        state = self.checkpointer._decode_state(data)
        await self.checkpointer.aput_checkpoint(self._config(thread_id, user_id), state,
                                                [Message.model_validate_json(m) for m in new])

    async def ledger_get(self, thread_id: str, user_id: str, keys: list[str]) -> dict[str, str]:
        """The recorded results among ``keys`` (ledger keys as stored), read one by one through
        ``aget_tool_result`` in 10xGraph's ``"<message id>:<call id>"`` form. None: not recorded.
        Anything else that is not a record as this runtime writes them (a dict with a
        ``"__kind__"``) is a failed read (``StorageError`` ``STORAGE_001``), so an at-most-once call
        is refused (``TOOL_LEDGER_UNAVAILABLE``) instead of run again: a record returned as its
        JSON text, ``{}``, a list or its bare ``"value"`` counted as not recorded, and the call
        fired a second time (red-team, session 31; 10xGraph reads them as misses too)."""
        config = self._config(thread_id, user_id)
        found: dict[str, str] = {}
        for key in keys:
            result = await self.checkpointer.aget_tool_result(config, _ledger_key(key))
            if result is None:
                continue
            if not (isinstance(result, dict) and isinstance(result.get("__kind__"), str)):
                raise StorageError(f"{type(self.checkpointer).__name__}.aget_tool_result returned "
                                   f"{type(result).__name__} {str(result)[:80]!r} for {_ledger_key(key)!r}: not a "
                                   "record aput_tool_result was given (a dict with '__kind__') nor None",
                                   "STORAGE_001", {"ledger_key": _ledger_key(key)})
            found[key] = json.dumps(result)
        return found

    async def ledger_put(self, thread_id: str, user_id: str, entries: list[tuple[str, str]]) -> None:
        """Records each ``(key, result JSON)`` through ``aput_tool_result``, in order; the first
        failure propagates and the rest are not written."""
        config = self._config(thread_id, user_id)
        for key, result_json in entries:
            await self.checkpointer.aput_tool_result(config, _ledger_key(key), json.loads(result_json))


def attach_python_store(checkpointer: BaseCheckpointer[Any]) -> None:
    """Makes a Python checkpointer drivable by the Rust loop; refuses one without a tool ledger
    (``GraphError`` GRAPH_CHECKPOINTER_001): its graph would run finished tools again on every
    replay."""
    missing = [m for m in _LEDGER_METHODS if getattr(type(checkpointer), m) is getattr(BaseCheckpointer, m)]
    if missing:
        raise GraphError(
            f"{type(checkpointer).__name__} does not implement {' and '.join(missing)} (the tool ledger): a replay "
            "of its graph would run tools that already finished again. Implement both, or use "
            "InMemoryCheckpointer, SqliteCheckpointer or PgCheckpointer",
            "GRAPH_CHECKPOINTER_001",
            {"checkpointer": type(checkpointer).__name__, "missing": missing},
        )
    store = PythonStore(checkpointer)
    checkpointer._python_store = store  # type: ignore[attr-defined]
    checkpointer._native = store.native  # type: ignore[attr-defined]
