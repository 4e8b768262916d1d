"""Type stubs for the native module built from src/py (PyO3)."""

from collections.abc import Awaitable, Generator
from typing import Any, final


__all__ = [
    "Completion", "ledger_lookup_keys", "NativeGraph", "NativeStore", "PG_SCHEMA_VERSION", "Waiter", "metrics_snapshot", "reset_log_cache", "shutdown", "__version__",
    "DEFAULT_BUSY_TIMEOUT_SECONDS", "DEFAULT_LEASE_TTL_SECONDS", "DEFAULT_NODE_TIMEOUT_SECONDS", "DEFAULT_RECURSION_LIMIT",
    "DEFAULT_TOOL_TIMEOUT_SECONDS", "ExecView", "INTENT_KIND", "NodeResult", "RunOptions", "STATE_META_KEY", "STOP_NAMESPACE",
    "resolve_timeout", "stop_key",
]

__version__: str

PG_SCHEMA_VERSION: int

def metrics_snapshot() -> dict[str, float]: ...
def ledger_lookup_keys(key: str) -> list[str]: ...
def reset_log_cache() -> None: ...
def shutdown() -> None: ...

# Rules the engine or the store own, exported so the Python side asks instead of restating them.
DEFAULT_NODE_TIMEOUT_SECONDS: float
DEFAULT_TOOL_TIMEOUT_SECONDS: float
DEFAULT_BUSY_TIMEOUT_SECONDS: float
DEFAULT_LEASE_TTL_SECONDS: float
DEFAULT_RECURSION_LIMIT: int
STATE_META_KEY: str
INTENT_KIND: str
STOP_NAMESPACE: str

def resolve_timeout(config: dict[str, Any], key: str, default: float | None) -> float | None:
    """10xGraph's timeout rule, the one the loop applies: missing -> ``default``; None or <= 0 ->
    no deadline; a bool, a non-number or NaN -> a warning and ``default``."""
def stop_key(thread_id: str, user_id: str) -> str:
    """The cache key of a thread's stop request (under ``STOP_NAMESPACE``)."""

@final
class RunOptions:
    """One run's settings, resolved and validated from its config dict (ValueError for a bad
    ``recursion_limit``, ``on_busy``, ``busy_timeout``, ``lease_ttl`` or ``failpoints``; timeouts
    follow the lenient rule of ``resolve_timeout``). Immutable."""

    thread_id: str
    user_id: str
    run_id: str
    recursion_limit: int
    node_timeout: float | None
    tool_timeout: float | None
    durable: bool
    on_busy: str
    busy_timeout: float
    lease_ttl: float
    failpoints: str | None
    has_messages: bool
    has_state_update: bool
    start_node: str | None
    streaming: bool
    known_version: int | None
    known_mark: str | None
    resume_only: bool
    def __new__(cls, config: dict[str, Any]) -> RunOptions: ...
    def for_run(
        self,
        *,
        has_messages: bool,
        has_state_update: bool,
        start_node: str | None = None,
        streaming: bool = False,
        known_version: int | None = None,
        known_mark: str | None = None,
        resume_only: bool = False,
    ) -> RunOptions:
        """These settings with the facts of one call."""

@final
class ExecView:
    """The loop's execution metadata at one point of a run, as the engine holds it. Read-only."""

    current_node: str
    step: int
    status: str
    interrupted_node: str | None
    interrupt_reason: str | None
    interrupt_data: Any
    thread_id: str | None
    stop_current_execution: str
    error: str | None

@final
class NodeResult:
    """A node call's result when it is more than a goto: the next node and a pause reason."""

    goto: str | None
    pause: str | None
    def __new__(cls, goto: str | None = None, pause: str | None = None) -> NodeResult: ...

@final
class Completion:
    def __call__(self, ok: bool, value: Any) -> None: ...

@final
class Waiter:
    """A Rust future, awaitable from asyncio (see src/py/waiter.rs)."""

    def fileno(self) -> int: ...
    def take(self) -> Any: ...
    def cancel(self) -> None: ...
    def __await__(self) -> Generator[Any, None, Any]: ...

@final
class NativeStore:
    @staticmethod
    def memory(enforce_user_isolation: bool) -> NativeStore: ...
    @staticmethod
    def sqlite(path: str, enforce_user_isolation: bool, durable_sync: bool) -> NativeStore: ...
    @staticmethod
    def python(adapter: Any, event_loop: Any, context: Any) -> NativeStore: ...
    @staticmethod
    def postgres(
        dsn: str,
        redis_url: str | None,
        schema: str,
        max_connections: int = 10,
        acquire_timeout: float = 10.0,
        state_history_limit: int = 20,
        enforce_user_isolation: bool = True,
        cache_ttl: float = 86400.0,
    ) -> NativeStore: ...
    def state_cache_get(self, thread_id: str, user_id: str) -> Awaitable[tuple[int, str] | None]: ...
    def state_cache_put(self, thread_id: str, user_id: str, version: int, state_json: str) -> Awaitable[bool]: ...
    def state_cache_clear(self, thread_id: str, user_id: str) -> Awaitable[bool]: ...
    def load(self, thread_id: str, user_id: str) -> Awaitable[tuple[int, str, list[str]] | None]: ...
    def put_step(
        self,
        thread_id: str,
        user_id: str,
        expected_version: int,
        state_json: str,
        messages: list[tuple[str, str]],
        replace_messages: bool = False,
    ) -> Awaitable[int]: ...
    def clear_state(self, thread_id: str, user_id: str) -> Awaitable[bool]: ...
    def put_messages(self, thread_id: str, user_id: str, messages: list[tuple[str, str]]) -> Awaitable[int]: ...
    def get_message(self, thread_id: str, user_id: str, message_id: str) -> Awaitable[str | None]: ...
    def list_messages(
        self,
        thread_id: str,
        user_id: str,
        search: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> Awaitable[list[str]]: ...
    def delete_message(self, thread_id: str, user_id: str, message_id: str) -> Awaitable[bool]: ...
    def put_thread(self, thread_id: str, user_id: str, name: str | None, meta_json: str) -> Awaitable[bool]: ...
    def get_thread(
        self, thread_id: str, user_id: str
    ) -> Awaitable[tuple[str, str, str | None, str, float, float] | None]: ...
    def list_threads(
        self,
        user_id: str | None = None,
        search: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> Awaitable[list[tuple[str, str, str | None, str, float, float]]]: ...
    def clean_thread(self, thread_id: str, user_id: str) -> Awaitable[bool]: ...
    def thread_owner(self, thread_id: str, user_id: str | None = None) -> Awaitable[str | None]: ...
    @property
    def isolates_users(self) -> bool: ...
    def cache_put(
        self, namespace: str, key: str, value_json: str, ttl_seconds: float | None = None
    ) -> Awaitable[bool]: ...
    def cache_get(self, namespace: str, key: str) -> Awaitable[str | None]: ...
    def cache_clear(self, namespace: str, key: str) -> Awaitable[bool]: ...
    def cache_keys(self, namespace: str, prefix: str | None = None) -> Awaitable[list[str]]: ...
    def request_stop(self, thread_id: str, user_id: str) -> Awaitable[bool]: ...
    def ledger_get(self, thread_id: str, user_id: str, keys: list[str]) -> Awaitable[dict[str, str]]: ...
    def lease_get(self, thread_id: str, user_id: str | None = None) -> Awaitable[str | None]: ...
    def recovery_candidates(
        self, after: str | None = None, limit: int = 100
    ) -> Awaitable[list[tuple[str, str, str | None]]]: ...
    def prune(
        self,
        keep_versions: int | None = None,
        finished_older_than: float | None = None,
        ledger_ttl: float | None = None,
        dry_run: bool = False,
    ) -> Awaitable[str]: ...
    def ledger_put(self, thread_id: str, user_id: str, key: str, result_json: str) -> Awaitable[bool]: ...
    def ledger_put_blocking(
        self, thread_id: str, user_id: str, key: str, result_json: str, timeout: float = 30.0
    ) -> bool: ...
    def setup(self) -> Awaitable[bool]: ...
    def release(self) -> Awaitable[bool]: ...
    def ledger_list(self, thread_id: str, user_id: str) -> Awaitable[list[tuple[str, str | None, float | None]]]: ...
    def state_versions(self, thread_id: str, user_id: str) -> Awaitable[list[tuple[int, float | None, str]]]: ...
    def schema_version(self) -> Awaitable[int | None]: ...

@final
class NativeGraph:
    def __new__(
        cls,
        nodes: list[str],
        edges: list[tuple[str, str, int | None, str | None]],
        entry: str | None,
        interrupt_before: list[str],
        interrupt_after: list[str],
        tool_nodes: list[str],
        store: NativeStore,
    ) -> NativeGraph: ...
    def run(
        self,
        run: Any,
        event_loop: Any,
        context: Any,
        options: RunOptions,
    ) -> Awaitable[str]: ...
