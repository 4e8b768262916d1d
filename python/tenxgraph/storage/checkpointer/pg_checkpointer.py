"""PgCheckpointer: PostgreSQL as the durable store, Redis (optional) as the state cache."""

from __future__ import annotations

from typing import Any, TypeVar

from tenxgraph import _core
from tenxgraph.core.exceptions import InvalidConfigError
from tenxgraph.core.state.message import Message
from tenxgraph.storage.checkpointer.native_checkpointer import NativeCheckpointer
from tenxgraph.utils.thread_info import ThreadInfo
from tenxgraph.utils.redact import redact

__all__ = ["CURRENT_SCHEMA_VERSION", "PgCheckpointer"]

# The schema version this release migrates a database to: 10xGraph 0.10's v1-v3, then ours.
CURRENT_SCHEMA_VERSION: int = _core.PG_SCHEMA_VERSION

_UNSUPPORTED_OBJECTS = ("pg_pool", "redis", "redis_pool")
_ID_TYPES = ("string", "int", "bigint")


def _id_type_option(key: str, value: Any) -> str:
    """``value`` as one of 10xGraph's id type names (an ``IDType`` member counts by its value)."""
    name = getattr(value, "value", value)
    if not isinstance(name, str) or name not in _ID_TYPES:
        hint = " (10xGraph's PgCheckpointer names the 32-bit type 'int')" if name == "integer" else ""
        raise ValueError(f"{key} must be one of {', '.join(map(repr, _ID_TYPES))}, got {value!r}{hint}")
    return name


def _seconds(pool: dict[str, Any], keys: tuple[str, ...], default: float) -> float:
    """A positive number of seconds from ``pool_config`` (the first of ``keys`` given; asyncpg's
    ``command_timeout`` is what a 10xGraph user already passes for the per-statement bound). A
    bool, a non-number, zero, a negative or NaN is ``InvalidConfigError`` STORAGE_CONFIG_002:
    "no deadline" is not offered, since a statement the server never answers would then hang
    its run for ever."""
    key = next((k for k in keys if pool.get(k) is not None), None)
    if key is None:
        return default
    value = pool[key]
    seconds = float("nan")
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = float("inf")  # an int past a float's range: cut below
    if not seconds > 0:
        raise InvalidConfigError(f"pool_config[{key!r}] must be a positive number of seconds, got {value!r}",
                                 "STORAGE_CONFIG_002", {"field": key, "value": repr(value)[:80]})
    return min(seconds, 1e9)


def _as_id(value: Any, id_type: str) -> Any:
    """An id read back as text, as the column holds it: an int on an int / bigint schema."""
    if id_type != "string" and isinstance(value, str) and value.isdigit():
        return int(value)
    return value


StateT = TypeVar("StateT")


class PgCheckpointer(NativeCheckpointer[StateT]):
    """Durable checkpoints on PostgreSQL, in Rust (sqlx).

    Upgrades a database created by 10xGraph 0.10 (schema v1-v3) in place, under an advisory lock.
    A durable step is one round trip: thread lock, version compare, state row and the step's new
    messages in one transaction. Redis is optional: with it, the version-guarded state cache lives
    there (under a prefix of this database and schema); without it, or while it is down, Postgres
    serves. Stop requests and the generic cache are in Postgres either way.

    Threads belong to the user who created them (``enforce_user_isolation=True``, as in 10xGraph):
    another user's read sees nothing and a write raises STORAGE_FORBIDDEN_001.

    Every statement has a deadline: ``pool_config={"command_timeout": 30}`` (asyncpg's name;
    ``statement_timeout`` also works; default 30 s, a transaction twice that). A server or network
    that stops answering then ends the call with ``TransientStorageError``
    ``STORAGE_TRANSIENT_001`` instead of a wait for ever, and the connection is closed. A row lock
    held by another session is waited for ``pool_config["lock_timeout"]`` (default 5 s), and a
    transaction a frozen client left open ends after twice the deadline. Migrations are not
    bounded (they may rightly take minutes on a large database); ``aprune`` commits in batches,
    each bounded, so a live thread waits for one batch, not for the whole prune (a dry run is one
    transaction, rolled back).

    Nothing connects here: a module-level checkpointer imports while the database is down. The
    first call that needs the database (``asetup()``, a run, a read) connects and migrates, and
    raises there when it cannot; a later call tries again.

    ``id_type`` (thread and message ids) and ``user_id_type`` are ``"string"`` (default),
    ``"int"`` or ``"bigint"``: a new database gets 10xGraph's columns for them (``VARCHAR(255)``,
    ``SERIAL``, ``BIGSERIAL``); an existing one must have been created with the same types (else
    the first use raises ``ValueError``). On an integer type an id is a positive int in the
    column's range, or the decimal string of one (``7`` or ``"7"``); anything else (a bool, a
    float, ``"007"``, ``"1:2"``, a negative, an int too large) raises ``InvalidConfigError``
    ``STORAGE_CONFIG_002`` before anything is read or written. Ids read back are ints there.
    Message ids share ``id_type``: a graph on an integer schema needs integer message ids
    (``StateGraph(id_generator=BigIntIDGenerator())``, or ids of your own).
    """


    def __init__(
        self,
        postgres_dsn: str | None = None,
        pg_pool: Any = None,
        pool_config: dict[str, Any] | None = None,
        redis_url: str | None = None,
        redis: Any = None,
        redis_pool: Any = None,
        redis_pool_config: dict[str, Any] | None = None,
        schema: str = "public",
        **kwargs: Any,
    ) -> None:
        super().__init__()
        given = {"pg_pool": pg_pool, "redis": redis, "redis_pool": redis_pool}
        for name in _UNSUPPORTED_OBJECTS:
            if given[name] is not None:
                raise TypeError(
                    f"{name}= takes a Python driver object, which the Rust core cannot use; "
                    "pass postgres_dsn= / redis_url= instead"
                )
        if not postgres_dsn:
            raise ValueError("PgCheckpointer needs postgres_dsn")
        self.id_type = _id_type_option("id_type", kwargs.get("id_type", "string"))
        self.user_id_type = _id_type_option("user_id_type", kwargs.get("user_id_type", "string"))
        unknown = set(kwargs) - {"user_id_type", "id_type", "cache_ttl", "release_resources", "state_history_limit",
                                 "enforce_user_isolation"}
        if unknown:
            raise TypeError(f"unexpected arguments: {sorted(unknown)}")
        pool = dict(pool_config or {})
        self.schema = schema
        self.enforce_user_isolation = bool(kwargs.get("enforce_user_isolation", True))
        self.cache_ttl = float(kwargs.get("cache_ttl", 86400))
        self.state_history_limit = int(kwargs.get("state_history_limit", 20))
        # Shown by repr and read by code that logs its objects: never with the password.
        self.redis_url = redact(redis_url) if redis_url else redis_url
        self._native = _core.NativeStore.postgres(
            postgres_dsn,
            redis_url,
            schema,
            int(pool.get("max_size", pool.get("max_connections", 10))),
            float(pool.get("timeout", pool.get("acquire_timeout", 10.0))),
            self.state_history_limit,
            self.enforce_user_isolation,
            self.cache_ttl,
            self.id_type,
            self.user_id_type,
            _seconds(pool, ("command_timeout", "statement_timeout"), 30.0),
            _seconds(pool, ("lock_timeout",), 5.0),
        )

    def __repr__(self) -> str:
        ids = "" if self.id_type == self.user_id_type == "string" else \
            f", id_type={self.id_type!r}, user_id_type={self.user_id_type!r}"
        return f"PgCheckpointer(schema={self.schema!r}, redis={'on' if self.redis_url else 'off'}{ids})"

    # -- ids read back in the column's type ------------------------------------------------

    def _typed_thread(self, info: ThreadInfo) -> ThreadInfo:
        return info.model_copy(update={"thread_id": _as_id(info.thread_id, self.id_type),
                                       "user_id": _as_id(info.user_id, self.user_id_type)})

    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread's ``ThreadInfo`` (None when absent or another user's); on an integer
        schema its ``thread_id`` / ``user_id`` are ints, as 10xGraph's."""
        info = await super().aget_thread(config)
        return None if info is None else self._typed_thread(info)

    async def alist_threads(self, config: dict[str, Any], search: str | None = None,
                            offset: int | None = None, limit: int | None = None) -> list[ThreadInfo]:
        """As ``NativeCheckpointer.alist_threads``; ids typed as in ``aget_thread``."""
        return [self._typed_thread(t) for t in await super().alist_threads(config, search, offset, limit)]

    async def aget_thread_owner(self, thread_id: str | int, config: dict[str, Any] | None = None) -> Any:
        """As ``NativeCheckpointer.aget_thread_owner``; an int on an integer ``user_id_type``."""
        return _as_id(await super().aget_thread_owner(thread_id, config), self.user_id_type)

    # -- return values as 10xGraph's PgCheckpointer gives them ------------------------------

    async def asetup(self) -> bool:
        """Connects (on first use) and migrates the schema; True. Raises the typed storage error
        (``TransientStorageError`` STORAGE_TRANSIENT_001 when the database is unreachable)."""
        return bool(await self._native.setup())

    async def aclear_state(self, config: dict[str, Any]) -> None:
        await super().aclear_state(config)

    async def aput_state_cache(self, config: dict[str, Any], state: Any) -> bool | None:
        """True when cached; None when not (a newer version is cached), as 10xGraph's."""
        return True if await self._state_cache_put(config, state) else None

    async def aput_cache_value(self, namespace: str, key: str, value: Any, ttl_seconds: int | None = None) -> bool:
        await super().aput_cache_value(namespace, key, value, ttl_seconds)
        return True

    async def aclear_cache_value(self, namespace: str, key: str) -> int:
        """How many keys were removed (1 or 0), as Redis' DEL answers."""
        existed = await self.aget_cache_value(namespace, key) is not None
        await super().aclear_cache_value(namespace, key)
        return 1 if existed else 0

    async def aclear_stop_request(self, config: dict[str, Any]) -> int:
        return int(await super().aclear_stop_request(config))

    async def aput_messages(self, config: dict[str, Any], messages: list[Message],
                            metadata: dict[str, Any] | None = None) -> None:
        await super().aput_messages(config, messages, metadata)

    async def adelete_message(self, config: dict[str, Any], message_id: str | int) -> None:
        await super().adelete_message(config, message_id)

    async def aclean_thread(self, config: dict[str, Any]) -> None:
        await super().aclean_thread(config)

    async def arelease(self) -> None:
        await super().arelease()
