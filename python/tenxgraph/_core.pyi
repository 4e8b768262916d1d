"""Type stubs for the native module built from src/py (PyO3)."""

import asyncio
import contextvars
from collections.abc import Awaitable, Generator
from typing import Any, final


__all__ = [
    "Completion", "ledger_lookup_keys", "NativeGraph", "NativeStore", "PG_SCHEMA_VERSION", "Driver", "release_abandoned", "wake_hub_fileno", "wake_hub_run", "metrics_snapshot", "reset_log_cache", "shutdown", "__version__",
    "DEFAULT_BUSY_TIMEOUT_SECONDS", "DEFAULT_LEASE_TTL_SECONDS", "DEFAULT_NODE_TIMEOUT_SECONDS", "DEFAULT_RECURSION_LIMIT",
    "DEFAULT_TOOL_TIMEOUT_SECONDS", "ExecView", "INTENT_KIND", "KeptState", "NodeResult", "RunOptions", "STATE_META_KEY", "STOP_NAMESPACE",
    "dump_walk", "resolve_timeout", "stop_key", "text_id",
]

__version__: str

PG_SCHEMA_VERSION: int

def release_abandoned(thread_id: str, run_id: str, entered: set[str] | None = None) -> None:
    """The cancelled run's late ledger writes are done: the calls handed to the host whose tools
    it did not start (``entered``: the ledger keys of those it did) are marked not run, and its
    parked lease is released."""

def wake_hub_fileno() -> int:
    """The socket this thread's event loops watch (``add_reader``, once per loop) for native
    awaitables woken from another thread; one per thread, an ended thread's or made on first
    use, never closed."""
def wake_hub_run(fd: int) -> None:
    """The reader callback of ``wake_hub_fileno()``'s socket ``fd``: polls every native awaitable
    of this thread woken from another thread since the last call. When ``fd`` is not this
    thread's socket (the loop awaited on a thread that has ended), the running loop stops
    watching it instead (``_bridge._unwatch``)."""
def metrics_snapshot() -> dict[str, float]:
    """The process-wide counters and durations as ``{metric name: value}`` (durations as
    ``<name>_sum`` seconds and ``<name>_count``). Lock-free; safe from any thread."""
def dump_walk(value: Any, skip: str | None = None, exact_ints: bool = False) -> tuple[tuple[str, str] | None, bool]:
    """One walk of ``value`` (dicts, lists, tuples, sets, pydantic models (fields and extras) and
    dataclasses; a top-level field named ``skip`` is left out): the path (``"blob.x"``,
    ``"metadata.scores[1]"``) and text (``"NaN"``, ``"inf"``) of the first NaN or infinite float,
    or None; and whether a load of the value's JSON would give back something else (a tuple, an
    int dict key, a datetime, a model where the model declares ``Any``; a field declared
    ``exclude=True``; see ``tenxgraph._round_trip``)."""
def ledger_lookup_keys(key: str) -> list[str]:
    """The stored ledger keys ``key`` may name, most literal first: 10xGraph's
    ``"<message id>:<call id>"`` form finds rows recorded under today's keys too."""
def reset_log_cache() -> None:
    """Forgets the cached Python loggers and levels, so Rust records follow a logging
    configuration changed after the first Rust record of a logger."""
def shutdown() -> None:
    """Called at interpreter exit (``atexit``): stops Rust logs reaching Python and closes every
    open store (at most 2 s each). Stores are unusable afterwards."""

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
def stop_key(thread_id: Any, user_id: Any) -> str:
    """The cache key of a thread's stop request (under ``STOP_NAMESPACE``); ids the stores refuse
    (over 255 characters, NUL, a lone surrogate) raise ``InvalidConfigError`` ``STORAGE_CONFIG_002``."""
def text_id(field: str, value: Any) -> str:
    """``str(value)`` as the id ``field`` is stored; ``InvalidConfigError`` ``STORAGE_CONFIG_002``
    where a store would refuse it (over 255 characters, a NUL) or when it is not valid Unicode (a
    lone surrogate)."""

@final
class KeptState:
    """The state row of a run's last commit, opaque to Python: returned with the run's outcome and
    handed back (``RunOptions.for_run(known_state=...)``) with the thread's next run, so a store
    that checks the head in its input commit needs no read before it."""

@final
class RunOptions:
    """One run's settings, resolved and validated from its config dict (ValueError for a bad
    ``recursion_limit``, ``on_busy``, ``busy_timeout``, ``lease_ttl``, ``idempotent_turns`` or
    ``failpoints``; timeouts
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
    close_failed_tools: bool
    owner_scoped: bool
    def __new__(cls, config: dict[str, Any]) -> RunOptions:
        """Resolves the run settings of ``config`` once (ids, recursion limit, timeouts,
        durability, busy policy, lease TTL, failpoints); ValueError for a bad value, before
        anything is written."""
    def for_run(
        self,
        *,
        has_messages: bool,
        has_state_update: bool,
        start_node: str | None = None,
        streaming: bool = False,
        known_version: int | None = None,
        known_mark: str | None = None,
        known_state: KeptState | None = None,
        resume_only: bool = False,
        owner_scoped: bool = False,
        close_failed_tools: bool = False,
    ) -> RunOptions:
        """These settings with the facts of one call. ``close_failed_tools``: the run only
        answers the calls of a tool node the thread failed at (nothing runs), and completes it."""

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
    def __new__(cls, goto: str | None = None, pause: str | None = None) -> NodeResult:
        """The next node (None: follow the edges) and the reason to pause after the node."""

@final
class Completion:
    """The done-callback of the asyncio task running a coroutine the Rust loop awaits; only the
    first call counts."""
    def __call__(self, task: asyncio.Future[Any]) -> None:
        """Hands the task's outcome (its result, its exception, or its cancellation) to the
        waiting Rust side."""

@final
class Driver:
    """A Rust future polled on the thread of the event loop that awaits it (see
    src/py/driver.rs); awaitable once."""

    def start(self, event_loop: asyncio.AbstractEventLoop, context: contextvars.Context,
              done: asyncio.Future[Any]) -> None:
        """Binds the driver to the running ``event_loop`` (polls are scheduled with ``call_soon`` in
        ``context``) and to ``done``, which gets the result or the exception; polls once.
        RuntimeError when already started."""
    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """One poll, on the loop thread; called with no arguments (the stub spells the slot as
        the runtime reports it)."""
    def cancel(self) -> None:
        """Drops the Rust future here and now, and with it any Python work it awaits."""
    def __await__(self) -> Generator[Any, None, Any]:
        """Awaits the result on the running loop (cancelling the await drops the Rust future
        before the cancellation propagates)."""

@final
class NativeStore:
    """A Rust checkpointer store (memory, SQLite, Postgres or a Python adapter). Methods returning
    an awaitable run on the tokio runtime and fail with the typed storage errors:
    ``StaleStateError`` STORAGE_CONFLICT_001, ``StorageError`` STORAGE_001 / STORAGE_FORBIDDEN_001 /
    STORAGE_FORBIDDEN_002, ``TransientStorageError`` STORAGE_TRANSIENT_001, ``SchemaVersionError``
    STORAGE_SCHEMA_001, ``LeaseLostError`` STORAGE_FENCED_001; ValueError for invalid input
    (malformed JSON is refused before anything is written). Thread-safe."""
    @staticmethod
    def memory(enforce_user_isolation: bool) -> NativeStore:
        """A process-local store; nothing survives the process."""
    @staticmethod
    def sqlite(path: str, enforce_user_isolation: bool, durable_sync: bool) -> NativeStore:
        """Opens the SQLite file (or ``":memory:"``) and applies migrations before returning;
        ``durable_sync`` makes each commit fsync."""
    @staticmethod
    def python(adapter: Any, event_loop: Any, context: Any, call_timeout: float = 30.0) -> NativeStore:
        """The store of a checkpointer written in Python: ``adapter`` is a ``PythonStore``, whose
        coroutines run on ``event_loop`` (its own thread) in ``context``."""
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
        id_type: str = "string",
        user_id_type: str = "string",
        statement_timeout: float = 30.0,
        lock_timeout: float = 5.0,
    ) -> NativeStore:
        """A Postgres store (Redis as cache and signal bus when ``redis_url`` is given) that connects
        and migrates on first use, not here; the DSN, schema name and Redis URL are checked now (no
        I/O), so a typo fails at once. ``id_type`` / ``user_id_type`` (``"string"``, ``"int"``,
        ``"bigint"``) are the id column types of a new database; an existing one must match them.
        Ids still cross as strings (the canonical decimal of an integer id). ``statement_timeout``:
        the client's deadline per statement (a transaction: twice it); ``lock_timeout``: the
        server's wait for a row lock."""
    def state_cache_get(self, thread_id: str, user_id: str) -> Awaitable[tuple[int, str] | None]:
        """The cached ``(version, state_json)`` of the thread, or None."""
    def state_cache_put(self, thread_id: str, user_id: str, version: int, state_json: str) -> Awaitable[bool]:
        """Caches a state under ``version``; never replaces a newer cached version."""
    def state_cache_clear(self, thread_id: str, user_id: str) -> Awaitable[bool]:
        """Drops the thread's cached state; True."""
    def load(
        self, thread_id: str, user_id: str, owner_scoped: bool = False
    ) -> Awaitable[tuple[int, str, list[str]] | None]:
        """``(version, state_json, [message_json, ...])`` of the thread's latest state, or None
        (also for a non-owner, under isolation or ``owner_scoped``)."""
    def put_step(
        self,
        thread_id: str,
        user_id: str,
        expected_version: int,
        state_json: str,
        messages: list[tuple[str, str]],
        replace_messages: bool = False,
        owner_scoped: bool = False,
        expected_mark: str | None = None,
    ) -> Awaitable[int]:
        """Commits one versioned step outside a run: the state plus ``messages`` (``(id, json)``
        pairs; with ``replace_messages`` they replace the stored history) in one transaction. Raises
        ``StaleStateError`` and writes nothing when the thread is no longer at ``expected_version``,
        or, with ``expected_mark`` (the write mark of the row read, "" for none), when the latest
        row carries another (messages written or deleted outside a run since). Resolves to the new
        version."""
    def clear_state(self, thread_id: str, user_id: str, owner_scoped: bool = False) -> Awaitable[bool]:
        """Drops the thread's state rows and messages (the thread row and ledger stay); True."""
    def put_messages(
        self,
        thread_id: str,
        user_id: str,
        messages: list[tuple[str, str]],
        owner_scoped: bool = False,
        after: tuple[str, str] | None = None,
    ) -> Awaitable[int]:
        """Upserts ``(id, json)`` messages by id, keeping first-insertion order; resolves to how many
        were given. The latest state row gets a new write mark: with ``after`` (``(the mark the
        caller read, a new "messages-changed-..." mark)``) the new mark when the row still carries
        the one read, else one no caller holds."""
    def get_message(
        self, thread_id: str, user_id: str, message_id: str, owner_scoped: bool = False
    ) -> Awaitable[str | None]:
        """The message's JSON, or None."""
    def list_messages(
        self,
        thread_id: str,
        user_id: str,
        search: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
        owner_scoped: bool = False,
    ) -> Awaitable[list[str]]:
        """The thread's messages as JSON, in order, filtered by ``search`` and paged."""
    def delete_message(
        self,
        thread_id: str,
        user_id: str,
        message_id: str,
        owner_scoped: bool = False,
        after: tuple[str, str] | None = None,
    ) -> Awaitable[bool]:
        """True when the message existed and was deleted (``after``: as for ``put_messages``)."""
    def put_thread(
        self, thread_id: str, user_id: str, name: str | None, meta_json: str, owner_scoped: bool = False
    ) -> Awaitable[bool]:
        """Inserts or updates the thread row; True when it was inserted."""
    def get_thread(
        self, thread_id: str, user_id: str, owner_scoped: bool = False
    ) -> Awaitable[tuple[str, str, str | None, str, float, float] | None]:
        """``(thread_id, user_id, name, meta_json, created_at, updated_at)``, or None."""
    def list_threads(
        self,
        user_id: str | None = None,
        search: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> Awaitable[list[tuple[str, str, str | None, str, float, float]]]:
        """Thread rows (as ``get_thread``), only ``user_id``'s when given, matching ``search``, paged."""
    def clean_thread(self, thread_id: str, user_id: str, owner_scoped: bool = False) -> Awaitable[bool]:
        """Deletes the thread with its states, messages and ledger rows; True."""
    def thread_owner(
        self, thread_id: str, user_id: str | None = None, owner_scoped: bool = False
    ) -> Awaitable[str | None]:
        """The thread's owner. With ``user_id``, as that user may see it (under isolation None to
        anybody but the owner); without, for operators."""
    @property
    def isolates_users(self) -> bool:
        """Whether threads are private to their owner."""
    def cache_put(
        self, namespace: str, key: str, value_json: str, ttl_seconds: float | None = None
    ) -> Awaitable[bool]:
        """Stores a JSON value under ``(namespace, key)``, expiring after ``ttl_seconds`` (never when
        None); True."""
    def cache_get(self, namespace: str, key: str) -> Awaitable[str | None]:
        """The value's JSON, or None when absent or expired."""
    def cache_clear(self, namespace: str, key: str) -> Awaitable[bool]:
        """Deletes the value; True whether or not it existed."""
    def cache_keys(self, namespace: str, prefix: str | None = None) -> Awaitable[list[str]]:
        """The live keys of ``namespace`` (those starting with ``prefix`` when given)."""
    def request_stop(self, thread_id: str, user_id: str, token: int | None = None) -> Awaitable[bool]:
        """Records a stop request for the thread (one hour) and wakes a run of this process at once; True.
        With ``token``, only the run holding that lease token obeys it."""
    def check_ids(self, thread_id: str, user_id: str) -> Awaitable[None]:
        """Raises ``InvalidConfigError`` (``STORAGE_CONFIG_002``) for ids this store cannot hold."""
    def ledger_get(
        self, thread_id: str, user_id: str, keys: list[str], owner_scoped: bool = False
    ) -> Awaitable[dict[str, str]]:
        """``{key: result_json}`` for those of ``keys`` with a row (results and intent records);
        empty for a non-owner under isolation."""
    def lease_get(
        self, thread_id: str, user_id: str | None = None, owner_scoped: bool = False
    ) -> Awaitable[str | None]:
        """The thread's lease as JSON, or None when it never had one (or, with ``user_id``, when
        that user may not see it)."""
    def recovery_candidates(
        self, after: str | None = None, limit: int = 100
    ) -> Awaitable[list[tuple[str, str, str | None, str | None]]]:
        """One page of threads whose latest state is running, by thread id after ``after``:
        ``[(thread_id, owner, live_holder_json | None, refused | None)]``; a None holder means no
        live run holds it; ``refused`` is why the store refuses the thread's id (never resumable
        here: a 10xGraph-written id 0 or below on an int schema)."""
    def recovery_unlisted(self) -> str | None:
        """Why the last ``recovery_candidates`` page could not list every unfinished run (10xGraph's
        Redis entries did not answer); None when it saw everything."""
    def prune(
        self,
        keep_versions: int | None = None,
        finished_older_than: float | None = None,
        ledger_ttl: float | None = None,
        dry_run: bool = False,
    ) -> Awaitable[str]:
        """Retention: never touches a thread that is not completed or whose lease is held, and keeps
        each thread's latest state. Resolves to the report as JSON (nothing removed with ``dry_run``)."""
    def ledger_put(
        self, thread_id: str, user_id: str, key: str, result_json: str, owner_scoped: bool = False,
        late: bool = False,
    ) -> Awaitable[bool]:
        """Records one tool result; True when this call inserted it (False: a result was already
        there, and it stays: the first result wins). ``late``: a run's result recorded after the
        run stopped waiting: no lease token checked, but the thread must exist (a deleted one is
        not created again: ``LeaseLostError``)."""
    def ledger_put_blocking(
        self, thread_id: str, user_id: str, key: str, result_json: str, timeout: float = 30.0
    ) -> bool:
        """``ledger_put(late=True)`` for a worker thread without an event loop; blocks for at most
        ``timeout`` seconds (never call it on a loop's thread). No token checked: the side effect
        happened whoever holds the thread now; a thread deleted meanwhile stays deleted. True when
        this call inserted the result."""
    def setup(self) -> Awaitable[bool]:
        """Opens a lazily opened store (connect, migrate) and runs its migrations; True."""
    def release(self) -> Awaitable[bool]:
        """Closes the store's connections; True."""
    def ledger_list(
        self, thread_id: str, user_id: str, owner_scoped: bool = False
    ) -> Awaitable[list[tuple[str, str | None, float | None]]]:
        """Every ledger row, oldest first: ``[(key, result_json | None, created_at | None)]``; empty
        for a non-owner under isolation."""
    def state_versions(
        self, thread_id: str, user_id: str, owner_scoped: bool = False
    ) -> Awaitable[list[tuple[int, float | None, str]]]:
        """Stored state versions, newest first: ``[(version, created_at | None, state_json)]``."""
    def schema_version(self) -> Awaitable[int | None]:
        """The applied schema version; None for the in-memory store."""

@final
class NativeGraph:
    """A validated graph topology bound to a store; ``run`` drives one call through the Rust loop."""
    def __new__(
        cls,
        nodes: list[str],
        edges: list[tuple[str, str, int | None, str | None]],
        entry: str | None,
        interrupt_before: list[str],
        interrupt_after: list[str],
        tool_nodes: list[str],
        store: NativeStore,
        starts_with_messages: bool = False,
    ) -> NativeGraph:
        """Validates the topology (``GraphError`` GRAPH_002/003/004) and binds it to ``store``.
        ``starts_with_messages``: the state a new thread starts from holds messages, so a first
        input without any has something to run on."""
    def run(
        self,
        run: Any,
        event_loop: Any,
        context: Any,
        options: RunOptions,
    ) -> Awaitable[tuple[str, KeptState | None]]:
        """Runs the loop for one call, with the settings ``options`` resolved once for the run;
        node and tool code is called back through ``run`` on ``event_loop`` in ``context``.
        Resolves to the JSON text ``{exec, version, stopped, mark, nothing_to_resume}`` and the
        ``KeptState`` of the run's last commit (None when it committed nothing), or raises the run's
        typed error (``GraphError``, ``NodeError``, ``NodeTimeoutError``, the storage errors,
        ``ThreadBusyError``, ``LeaseLostError``). Every step it reports is committed before it
        returns."""
