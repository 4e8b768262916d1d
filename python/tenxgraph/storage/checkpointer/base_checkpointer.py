"""BaseCheckpointer: the abstract checkpointer contract, as 10xGraph 0.10 defines it.

The built-in backends (``InMemoryCheckpointer``, ``SqliteCheckpointer``, ``PgCheckpointer``) derive
from ``NativeCheckpointer``, which implements every method over a Rust store. A user's own
subclass implements the abstract methods below in Python; see docs/migrating-from-10xgraph.md
("Your own checkpointer") for what the Rust loop needs from it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar, get_args

from tenxgraph import _core
from tenxgraph._state_codec import STATE_META_KEY
from tenxgraph._sync import run_sync
from tenxgraph.core.state.agent_state import AgentState
from tenxgraph.core.state.message import Message
from tenxgraph.logs import run_logger
from tenxgraph.utils.thread_info import ThreadInfo
from tenxgraph._user_id import user_id_of

__all__ = [
    "BaseCheckpointer",
    "STATE_FORMAT_VERSION",
    "STATE_META_KEY",
    "STOP_REQUEST_NAMESPACE",
    "STOP_REQUEST_TTL_SECONDS",
]

StateT = TypeVar("StateT", bound=AgentState)
# The engine polls for stop requests, so the namespace and the key format are its own.
STOP_REQUEST_NAMESPACE: str = _core.STOP_NAMESPACE
STOP_REQUEST_TTL_SECONDS = 3600
STATE_FORMAT_VERSION = 1
_log = run_logger("tenxgraph.checkpointer")


def _run_sync(coro: Any) -> Any:
    return run_sync(coro)


class BaseCheckpointer(ABC, Generic[StateT]):
    """Threads, state, messages and the tool ledger of a graph. Async first: each ``aX`` has a sync
    twin ``X`` that runs the instance's own ``aX`` (so a subclass overriding ``aget_state`` is what
    ``get_state`` calls)."""

    # A class attribute, so a subclass that never calls ``super().__init__()`` has it too.
    _state_type: type[AgentState] = AgentState
    _state_type_bound: bool = False

    def __init__(self) -> None:
        pass

    # -- state typing ----------------------------------------------------------------------

    def _declared_state_type(self) -> type[AgentState] | None:
        # ``InMemoryCheckpointer[MyState]()``: typing sets ``__orig_class__`` after __init__.
        candidates = [getattr(self, "__orig_class__", None)]
        # ``class Audited(InMemoryCheckpointer[MyState])``: the class's own generic bases.
        candidates += [base for klass in type(self).__mro__ for base in klass.__dict__.get("__orig_bases__", ())]
        for alias in candidates:
            declared = get_args(alias)
            if declared and isinstance(declared[0], type) and issubclass(declared[0], AgentState):
                return declared[0]
        return None

    @property
    def state_type(self) -> type[AgentState]:
        """The state class rows are restored into: the graph's (bound by ``compile()``), else the
        class the instance was declared for (``PgCheckpointer[MyState](...)``), else AgentState."""
        if not self._state_type_bound:
            return self._declared_state_type() or self._state_type
        return self._state_type

    def bind_state_type(self, cls: type[AgentState]) -> None:
        """Binds the state class rows are restored into (``compile()`` calls it with the graph's).
        Raises TypeError for a non-AgentState class, ValueError when the instance was declared for
        an unrelated class or is already bound to another one (rebinding from plain AgentState is
        allowed)."""
        if not (isinstance(cls, type) and issubclass(cls, AgentState)):
            raise TypeError(f"state type must be an AgentState subclass, got {cls!r}")
        declared = self._declared_state_type()
        if declared is not None and not issubclass(cls, declared):
            raise ValueError(
                f"{type(self).__name__} was declared for state class {declared.__name__!r}, "
                f"but the graph uses {cls.__name__!r}"
            )
        # Rebinding from plain AgentState stays allowed: rows of a plain graph lose nothing.
        if self._state_type_bound and self._state_type not in (cls, AgentState):
            raise ValueError(
                f"checkpointer is already bound to {self._state_type.__name__}; cannot rebind to {cls.__name__}"
            )
        self._state_type = cls
        self._state_type_bound = True

    def _encode_state(self, state: AgentState) -> dict[str, Any]:
        data = state.model_dump(mode="json")
        data[STATE_META_KEY] = {"format": STATE_FORMAT_VERSION, "class": type(state).__name__}
        return data

    def _decode_state(self, row: dict[str, Any]) -> AgentState:
        data = dict(row)
        meta = data.pop(STATE_META_KEY, None) or {}
        data.pop("__class_path__", None)
        target = self.state_type
        if meta.get("class") and meta["class"] != target.__name__:
            _log.warning("stored state class %s differs from bound %s", meta["class"], target.__name__)
        return target.model_validate(data)

    # -- the contract ----------------------------------------------------------------------

    @abstractmethod
    async def asetup(self) -> Any:
        """Prepares the backend (tables, migrations). Idempotent; the built-in backends migrate when
        they open, so for them this only returns True."""

    @abstractmethod
    async def aput_state(self, config: dict[str, Any], state: StateT) -> StateT:
        """Stores ``state`` as the thread's latest state (``config`` names ``thread_id`` and
        optionally ``user_id``) and returns it. The built-in backends write it as one versioned step
        (see ``aput_checkpoint``)."""

    @abstractmethod
    async def aget_state(self, config: dict[str, Any]) -> StateT | None:
        """The thread's latest state restored into ``state_type``, or None when the thread has none."""

    @abstractmethod
    async def aclear_state(self, config: dict[str, Any]) -> Any:
        """Deletes the thread's state; the built-in backends also delete its messages and cached
        copy, and keep the thread row and the tool ledger."""

    async def aput_checkpoint(
        self,
        config: dict[str, Any],
        state: StateT,
        messages: list[Message] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> StateT:
        """One step's write: the state, then the step's new messages. Backends that can do it in
        one transaction override this."""
        await self.aput_state(config, state)
        if messages:
            await self.aput_messages(config, messages, metadata)
        return state

    @abstractmethod
    async def aput_state_cache(self, config: dict[str, Any], state: StateT) -> Any | None:
        """Caches the state for fast reads; a cache, not the record: losing it loses nothing."""

    @abstractmethod
    async def aget_state_cache(self, config: dict[str, Any]) -> StateT | None:
        """The cached state, else (built-in backends) the stored state, else None."""

    async def aput_cache_value(self, namespace: str, key: str, value: Any, ttl_seconds: int | None = None) -> Any:
        """Stores a JSON-able value under ``(namespace, key)``, expiring after ``ttl_seconds``
        (never when None). This base keeps no cache: it stores nothing and returns None."""
        return None

    async def aget_cache_value(self, namespace: str, key: str) -> Any | None:
        """The value under ``(namespace, key)``, or None when absent or expired (always None here)."""
        return None

    async def aclear_cache_value(self, namespace: str, key: str) -> Any | None:
        """Deletes the value under ``(namespace, key)``; absent keys are not an error."""
        return None

    async def alist_cache_keys(self, namespace: str, prefix: str | None = None) -> list[str]:
        """The live keys of ``namespace``, optionally only those starting with ``prefix``."""
        return []

    def _stop_request_key(self, config: dict[str, Any]) -> str:
        return _core.stop_key(str(config.get("thread_id")), str(user_id_of(config)))

    async def arequest_stop(self, config: dict[str, Any]) -> Any | None:
        """Asks the thread's running run to stop: a flag under the ``stop_request`` namespace, per
        thread and user, for ``STOP_REQUEST_TTL_SECONDS``. A run sees it while a node runs (at once
        in this process, at its next poll of the store in another), cancels that node and pauses
        (see ``CompiledGraph.astop``)."""
        return await self.aput_cache_value(
            STOP_REQUEST_NAMESPACE, self._stop_request_key(config), True, STOP_REQUEST_TTL_SECONDS
        )

    async def ais_stop_requested(self, config: dict[str, Any]) -> bool:
        """Whether a stop is pending for the thread and user of ``config``."""
        return bool(await self.aget_cache_value(STOP_REQUEST_NAMESPACE, self._stop_request_key(config)))

    async def aclear_stop_request(self, config: dict[str, Any]) -> Any | None:
        """Withdraws a pending stop request for the thread and user of ``config``."""
        return await self.aclear_cache_value(STOP_REQUEST_NAMESPACE, self._stop_request_key(config))

    async def aget_tool_result(self, config: dict[str, Any], tool_call_id: str) -> dict[str, Any] | None:
        """The result recorded under a ledger key (``"<message id>:<call id>"``), or None. The
        default keeps no ledger: a subclass without one cannot be compiled into a graph (see
        ``StateGraph.compile``), because its tools would run again on every replay."""
        return None

    async def aput_tool_result(self, config: dict[str, Any], tool_call_id: str, result: dict[str, Any]) -> Any:
        """Records a tool call's result under its ledger key so a replay answers it from the
        ledger instead of calling the tool again. The built-in backends keep the first result
        recorded for a key and raise on a failed write. This base records nothing."""
        return None

    @abstractmethod
    async def aput_messages(
        self, config: dict[str, Any], messages: list[Message], metadata: dict[str, Any] | None = None
    ) -> Any:
        """Appends messages to the thread's history; the built-in backends deduplicate by
        ``message_id`` (writing the same message twice keeps one row)."""

    @abstractmethod
    async def aget_message(self, config: dict[str, Any], message_id: str | int) -> Message:
        """The thread's message with ``message_id``; the built-in backends raise MessageNotFoundError (an IndexError) when
        there is none."""

    @abstractmethod
    async def alist_messages(
        self,
        config: dict[str, Any],
        search: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> list[Message]:
        """The thread's messages in the order written, filtered by ``search`` (a substring of the
        content) and paged by ``offset``/``limit``."""

    @abstractmethod
    async def adelete_message(self, config: dict[str, Any], message_id: str | int) -> Any | None:
        """Deletes one message of the thread; the built-in backends raise MessageNotFoundError (an IndexError) when there is
        none."""

    @abstractmethod
    async def aput_thread(self, config: dict[str, Any], thread_info: ThreadInfo) -> Any | None:
        """Creates or updates the thread row (name, metadata, run id). The built-in backends raise
        ValueError when ``thread_info.thread_id`` differs from ``config["thread_id"]``."""

    @abstractmethod
    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread's ``ThreadInfo``, or None when it does not exist (or, under user isolation,
        belongs to another user)."""

    @abstractmethod
    async def alist_threads(
        self,
        config: dict[str, Any],
        search: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> list[ThreadInfo]:
        """Threads whose name or id contains ``search``, most recently updated first (built-in
        backends), paged by ``offset``/``limit``; under user isolation only the caller's."""

    @abstractmethod
    async def aclean_thread(self, config: dict[str, Any]) -> Any | None:
        """Deletes the thread: its state, messages, ledger and thread row."""

    async def aget_thread_owner(self, thread_id: str | int, config: dict[str, Any] | None = None) -> str | int | None:
        """The user id that owns ``thread_id``, or None. This base does not track owners and
        raises NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} does not track thread owners")

    @abstractmethod
    async def arelease(self) -> Any | None:
        """Closes the backend's connections and pools; the instance is not used after this."""

    # -- sync twins: each runs the instance's own async method -----------------------------

    def setup(self) -> Any:
        """Blocking twin of ``asetup``: runs this instance's own ``asetup`` to completion and returns
        or raises what it does. Callable from inside a running event loop too (it then runs on a
        private loop in a worker thread)."""
        return _run_sync(self.asetup())

    def put_state(self, config: dict[str, Any], state: StateT) -> StateT:
        """Blocking twin of ``aput_state``: runs this instance's own ``aput_state`` to completion and
        returns or raises what it does. Callable from inside a running event loop too (it then runs
        on a private loop in a worker thread)."""
        return _run_sync(self.aput_state(config, state))

    def get_state(self, config: dict[str, Any]) -> StateT | None:
        """Blocking twin of ``aget_state``: runs this instance's own ``aget_state`` to completion and
        returns or raises what it does. Callable from inside a running event loop too (it then runs
        on a private loop in a worker thread)."""
        return _run_sync(self.aget_state(config))

    def clear_state(self, config: dict[str, Any]) -> Any:
        """Blocking twin of ``aclear_state``: runs this instance's own ``aclear_state`` to completion
        and returns or raises what it does. Callable from inside a running event loop too (it then
        runs on a private loop in a worker thread)."""
        return _run_sync(self.aclear_state(config))

    def put_checkpoint(self, config: dict[str, Any], state: StateT, messages: list[Message] | None = None,
                       metadata: dict[str, Any] | None = None) -> StateT:
        """Blocking twin of ``aput_checkpoint``: runs this instance's own ``aput_checkpoint`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aput_checkpoint(config, state, messages, metadata))

    def put_state_cache(self, config: dict[str, Any], state: StateT) -> Any | None:
        """Blocking twin of ``aput_state_cache``: runs this instance's own ``aput_state_cache`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aput_state_cache(config, state))

    def get_state_cache(self, config: dict[str, Any]) -> StateT | None:
        """Blocking twin of ``aget_state_cache``: runs this instance's own ``aget_state_cache`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aget_state_cache(config))

    def put_cache_value(self, namespace: str, key: str, value: Any, ttl_seconds: int | None = None) -> Any:
        """Blocking twin of ``aput_cache_value``: runs this instance's own ``aput_cache_value`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aput_cache_value(namespace, key, value, ttl_seconds))

    def get_cache_value(self, namespace: str, key: str) -> Any | None:
        """Blocking twin of ``aget_cache_value``: runs this instance's own ``aget_cache_value`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aget_cache_value(namespace, key))

    def clear_cache_value(self, namespace: str, key: str) -> Any | None:
        """Blocking twin of ``aclear_cache_value``: runs this instance's own ``aclear_cache_value`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aclear_cache_value(namespace, key))

    def list_cache_keys(self, namespace: str, prefix: str | None = None) -> list[str]:
        """Blocking twin of ``alist_cache_keys``: runs this instance's own ``alist_cache_keys`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.alist_cache_keys(namespace, prefix))

    def request_stop(self, config: dict[str, Any]) -> Any | None:
        """Blocking twin of ``arequest_stop``: runs this instance's own ``arequest_stop`` to completion
        and returns or raises what it does. Callable from inside a running event loop too (it then
        runs on a private loop in a worker thread)."""
        return _run_sync(self.arequest_stop(config))

    def is_stop_requested(self, config: dict[str, Any]) -> bool:
        """Blocking twin of ``ais_stop_requested``: runs this instance's own ``ais_stop_requested`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.ais_stop_requested(config))

    def clear_stop_request(self, config: dict[str, Any]) -> Any | None:
        """Blocking twin of ``aclear_stop_request``: runs this instance's own ``aclear_stop_request``
        to completion and returns or raises what it does. Callable from inside a running event loop
        too (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aclear_stop_request(config))

    def get_tool_result(self, config: dict[str, Any], tool_call_id: str) -> dict[str, Any] | None:
        """Blocking twin of ``aget_tool_result``: runs this instance's own ``aget_tool_result`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aget_tool_result(config, tool_call_id))

    def put_tool_result(self, config: dict[str, Any], tool_call_id: str, result: dict[str, Any]) -> Any:
        """Blocking twin of ``aput_tool_result``: runs this instance's own ``aput_tool_result`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.aput_tool_result(config, tool_call_id, result))

    def put_messages(self, config: dict[str, Any], messages: list[Message],
                     metadata: dict[str, Any] | None = None) -> Any:
        """Blocking twin of ``aput_messages``: runs this instance's own ``aput_messages`` to completion
        and returns or raises what it does. Callable from inside a running event loop too (it then
        runs on a private loop in a worker thread)."""
        return _run_sync(self.aput_messages(config, messages, metadata))

    def get_message(self, config: dict[str, Any], message_id: str | int) -> Message:
        """Blocking twin of ``aget_message``: runs this instance's own ``aget_message`` to completion
        and returns or raises what it does. Callable from inside a running event loop too (it then
        runs on a private loop in a worker thread)."""
        return _run_sync(self.aget_message(config, message_id))

    def list_messages(self, config: dict[str, Any], search: str | None = None, offset: int | None = None,
                      limit: int | None = None) -> list[Message]:
        """Blocking twin of ``alist_messages``: runs this instance's own ``alist_messages`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.alist_messages(config, search, offset, limit))

    def delete_message(self, config: dict[str, Any], message_id: str | int) -> Any | None:
        """Blocking twin of ``adelete_message``: runs this instance's own ``adelete_message`` to
        completion and returns or raises what it does. Callable from inside a running event loop too
        (it then runs on a private loop in a worker thread)."""
        return _run_sync(self.adelete_message(config, message_id))

    def put_thread(self, config: dict[str, Any], thread_info: ThreadInfo) -> Any | None:
        """Blocking twin of ``aput_thread``: runs this instance's own ``aput_thread`` to completion and
        returns or raises what it does. Callable from inside a running event loop too (it then runs
        on a private loop in a worker thread)."""
        return _run_sync(self.aput_thread(config, thread_info))

    def get_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """Blocking twin of ``aget_thread``: runs this instance's own ``aget_thread`` to completion and
        returns or raises what it does. Callable from inside a running event loop too (it then runs
        on a private loop in a worker thread)."""
        return _run_sync(self.aget_thread(config))

    def list_threads(self, config: dict[str, Any], search: str | None = None, offset: int | None = None,
                     limit: int | None = None) -> list[ThreadInfo]:
        """Blocking twin of ``alist_threads``: runs this instance's own ``alist_threads`` to completion
        and returns or raises what it does. Callable from inside a running event loop too (it then
        runs on a private loop in a worker thread)."""
        return _run_sync(self.alist_threads(config, search, offset, limit))

    def clean_thread(self, config: dict[str, Any]) -> Any | None:
        """Blocking twin of ``aclean_thread``: runs this instance's own ``aclean_thread`` to completion
        and returns or raises what it does. Callable from inside a running event loop too (it then
        runs on a private loop in a worker thread)."""
        return _run_sync(self.aclean_thread(config))

    def release(self) -> Any | None:
        """Blocking twin of ``arelease``: runs this instance's own ``arelease`` to completion and
        returns or raises what it does. Callable from inside a running event loop too (it then runs
        on a private loop in a worker thread)."""
        return _run_sync(self.arelease())

    def __getattr__(self, name: str) -> Any:
        # The sync twin of any other ``aX`` a backend adds (``aprune`` -> ``prune``, ...).
        if name.startswith("_"):
            raise AttributeError(name)
        target = getattr(type(self), "a" + name, None)
        if target is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        def sync(*args: Any, **kwargs: Any) -> Any:
            return _run_sync(target(self, *args, **kwargs))

        sync.__name__ = name
        return sync
