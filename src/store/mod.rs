//! Storage: the `Checkpointer` trait and its backends. No Python types here.
//!
//! Every backend gives the same guarantees: a step is one transaction (state row + the step's new
//! messages), writes are versioned (compare-and-swap on the version the run started from), the tool
//! ledger keeps the first recorded result, and ledger rows go with their thread.

#![warn(missing_docs)]

mod error;
pub mod id_text;
mod input_lease;
mod inspect;
mod lazy;
mod lease;
pub mod legacy_log;
mod memory;
pub mod postgres;
mod sqlite;
mod sqlite_locks;
pub mod task;
mod types;
mod unrecorded;

/// The key of the header a stored state carries (class, format, and the write mark the stores
/// compare). The stores' SQL names it too.
pub const STATE_META_KEY: &str = "__state_meta__";

pub use error::{StoreError, StoreResult};
pub use id_text::MAX_ID_CHARS;
pub use input_lease::{LeasedInput, StopKey};
pub use inspect::{LedgerEntry, StateVersion};
pub use lazy::{LazyStore, Opener};
pub use lease::{
    INTENT_KIND, LeaseAttempt, LeaseInfo, LeaseRequest, PruneReport, PruneRules, THREAD_MUST_EXIST, fence_ok,
    is_completed_state, is_intent, is_intent_text, is_paused, is_running_state, may_take,
};
pub use memory::MemoryStore;
pub use postgres::{PgOptions, PgStore};
pub use sqlite::SqliteStore;
pub use types::{
    ChangeMark, Checkpoint, KnownHead, LedgerRow, LegacyCache, MESSAGES_CHANGED, RawJson, SharedJson, StepWrite,
    StoredMessage, ThreadRef, ThreadRow, TxHook, WRITE_MARK_PATH, chained_state, changed_mark, check_head, decode_raw,
    lone_surrogates_replaced, marked_state, messages_changed_mark, raw_json, raw_json_from_text, set_write_mark,
    shared_json, shared_json_from_text, state_row, unique_mark, write_mark, write_mark_json_path,
};
pub use unrecorded::{Unrecorded, UnrecordedResults};

use async_trait::async_trait;
use serde_json::Value;
use std::collections::HashMap;

/// The durable store behind a compiled graph.
///
/// Versions: a thread without any state row is at version 0; each committed step adds one.
#[async_trait]
pub trait Checkpointer: Send + Sync + 'static {
    /// Creates tables / runs migrations. Idempotent; safe to call from several processes.
    async fn setup(&self) -> StoreResult<()>;

    /// The latest state row and every message of the thread, in order. One read per run start.
    async fn load(&self, t: &ThreadRef) -> StoreResult<Option<Checkpoint>> {
        self.load_with(t, None).await
    }

    /// `load`, except that when the latest row is `known` the messages are not read
    /// (`messages_known`): a run whose process kept the live state of the thread's last run pays
    /// for the state row only, not for the thread's history.
    async fn load_with(&self, t: &ThreadRef, known: Option<KnownHead<'_>>) -> StoreResult<Option<Checkpoint>>;

    /// The start of a run that takes its lease with its input commit (`put_input_leased`): the
    /// thread's lease row as `lease_get` reads it and the thread as `load_with` loads it. Both
    /// reads go out at once; a store that can answer both in one round trip does (PostgreSQL).
    async fn lease_and_load(
        &self,
        t: &ThreadRef,
        known: Option<KnownHead<'_>>,
    ) -> (StoreResult<Option<LeaseInfo>>, StoreResult<Option<Checkpoint>>) {
        futures::join!(self.lease_get(&t.thread_id), self.load_with(t, known))
    }

    /// Commits one step atomically. Fails with `StoreError::Stale` and writes nothing when the
    /// thread's version is no longer `w.expected_version`. Returns the new version.
    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64>;

    /// Whether `put_step_with_ledger` commits the rows and the step in one transaction. The engine
    /// folds a tool node's last ledger rows into its step only where it does.
    fn joins_ledger_to_step(&self) -> bool {
        false
    }

    /// `put_step`, with ledger rows recorded (as `ledger_put_many` records them, fenced by
    /// `w.fence`) in the same transaction: both or neither. The default writes the rows first, in
    /// their own commit, and writes no step when they fail; it is not atomic, which is why
    /// `joins_ledger_to_step` says false for it.
    async fn put_step_with_ledger(&self, t: &ThreadRef, w: StepWrite<'_>, rows: &[LedgerRow]) -> StoreResult<i64> {
        if !rows.is_empty() {
            self.ledger_put_many(t, rows, w.fence).await?;
        }
        self.put_step(t, w).await
    }

    /// A run's first commit: takes the thread's lease for `req` (as `lease_acquire` would: free,
    /// expired, released, or `req.steal` naming its token) and commits `w` fenced by the new token,
    /// in one transaction, clearing the stop request `stop` in it where the store keeps its cache
    /// in the same database (else right after). `w.fence` and `w.release_lease` are ignored.
    /// Refused with nothing written: `Held` when another lease is live, `StoreError::Stale` when
    /// the thread is no longer at `w.expected_version`, `StoreError::Forbidden` for another user's
    /// thread under isolation. No default body: every store, and every wrapper that forwards to
    /// one, says how it keeps this atomic.
    async fn put_input_leased(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<StopKey<'_>>,
    ) -> StoreResult<LeasedInput>;

    /// Whether `put_input_on_head` checks the thread's head itself, so that a run holding the
    /// state of the thread's last commit may skip its start read (`lease_and_load`): one round
    /// trip less per turn where a read is one.
    fn checks_head_at_input(&self) -> bool {
        false
    }

    /// `put_input_leased` for a run that did not read the thread: it holds the commit at
    /// `w.expected_version` whose write mark is `w.previous_mark` and built `w` on it. Refused as
    /// `StoreError::Stale` unless the latest row is that very commit (a row at that version with
    /// another mark too: a thread deleted and written again). The engine calls it only where
    /// `checks_head_at_input` says true; the default refuses, which sends a run back to the
    /// usual start (lease, then a full read), never past a check it did not make.
    async fn put_input_on_head(
        &self,
        t: &ThreadRef,
        _req: &LeaseRequest,
        w: StepWrite<'_>,
        _stop: Option<StopKey<'_>>,
    ) -> StoreResult<LeasedInput> {
        Err(StoreError::Stale { thread_id: t.thread_id.clone(), expected: w.expected_version, current: -1 })
    }

    /// Drops the thread's state rows and messages (the thread row and its ledger stay).
    async fn clear_state(&self, t: &ThreadRef) -> StoreResult<()>;

    /// Upserts messages by id (outside a step; order of first insertion is kept). The latest state
    /// row gets a new write mark (see `ChangeMark` for `after`).
    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage], after: Option<&ChangeMark>) -> StoreResult<()>;
    /// One message of the thread by id; None when absent, in another thread, or (under isolation)
    /// the thread is another user's.
    async fn get_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<Option<RawJson>>;
    /// The thread's messages in order, those containing `search` in their text only, paged by
    /// `offset`/`limit`; empty for another user's thread under isolation.
    async fn list_messages(
        &self,
        t: &ThreadRef,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<RawJson>>;
    /// Deletes one message of the thread; true when it existed (then the latest state row gets a
    /// new write mark, see `ChangeMark`). Another user's thread under isolation is
    /// `StoreError::Forbidden`, nothing deleted.
    async fn delete_message(&self, t: &ThreadRef, message_id: &str, after: Option<&ChangeMark>) -> StoreResult<bool>;

    /// Inserts or updates the thread row; true when it was inserted.
    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool>;
    /// The thread row; None when absent or (under isolation) another user's.
    async fn get_thread(&self, t: &ThreadRef) -> StoreResult<Option<ThreadRow>>;
    /// Threads, newest update first: those of `user_id` when given, those whose name or id contains
    /// `search`, paged by `offset`/`limit`.
    async fn list_threads(
        &self,
        user_id: Option<&str>,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<ThreadRow>>;
    /// Deletes the thread with its states, messages and ledger rows.
    async fn clean_thread(&self, t: &ThreadRef) -> StoreResult<()>;
    /// The thread's owner, for anyone: callers that answer a user check `is_owner` first.
    async fn thread_owner(&self, thread_id: &str) -> StoreResult<Option<String>>;

    /// Threads whose latest state says a run is under way (`execution_meta.status` is
    /// `running`), of every user: each `ThreadRef` names the thread's owner. Ordered by thread id,
    /// those after `after` only, at most `limit`, so recovery pages through a large store without
    /// skipping threads whose state changes meanwhile. Reads one state row per thread, no messages.
    async fn running_threads(&self, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>>;

    /// What the last `running_threads` could not look at (a source of unfinished runs that did
    /// not answer: 10xGraph's Redis entries), for recovery's report; None: it saw everything.
    fn running_threads_unlisted(&self) -> Option<String> {
        None
    }

    /// Whether threads are private to the user who created them (`enforce_user_isolation`).
    fn isolates_users(&self) -> bool {
        false
    }

    /// Where this store keeps the results of tool calls that completed but could not be recorded
    /// (see `unrecorded.rs`); None: such results are lost with the failed write.
    fn unrecorded(&self) -> Option<&UnrecordedResults> {
        None
    }

    /// Whether `t.user_id` may see what the store keeps about the thread outside its rows (its
    /// lease, its owner's name): isolation is off, or the thread's owner is that user. A thread
    /// nobody owns yet (a run holds its lease and has not written) counts as another user's, so a
    /// run in flight is never described to somebody else.
    async fn is_owner(&self, t: &ThreadRef) -> StoreResult<bool> {
        if !t.isolated(self.isolates_users()) {
            return Ok(true);
        }
        Ok(self.thread_owner(&t.thread_id).await?.as_deref() == Some(t.user_id.as_str()))
    }

    /// Generic key/value cache with optional expiry (seconds). Used for stop requests.
    async fn cache_put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()>;
    /// The unexpired value under `ns`/`key`, or None.
    async fn cache_get(&self, ns: &str, key: &str) -> StoreResult<Option<Value>>;
    /// Writes `value` under `ns`/`key` only when no unexpired value is there; true when written.
    /// A preemption asks this way, so it never replaces a user's hard stop under the same key.
    /// The backends do it in one operation; this fallback (a checkpointer written in Python)
    /// reads, then writes.
    async fn cache_put_absent(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<bool> {
        if self.cache_get(ns, key).await?.is_some() {
            return Ok(false);
        }
        self.cache_put(ns, key, value, ttl).await.map(|_| true)
    }
    /// Removes the value under `ns`/`key` (absent is fine).
    async fn cache_clear(&self, ns: &str, key: &str) -> StoreResult<()>;
    /// The unexpired keys of `ns` starting with `prefix`, sorted, each once.
    async fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>>;

    /// The state cache: a whole encoded state with its version. A write never replaces a newer
    /// version. Backends without a faster cache keep it in the generic cache.
    async fn state_cache_put(&self, t: &ThreadRef, version: i64, state: &Value) -> StoreResult<bool> {
        generic_state_cache::put(self, t, version, state).await
    }
    /// The cached version and state of the thread; None on a miss.
    async fn state_cache_get(&self, t: &ThreadRef) -> StoreResult<Option<(i64, Value)>> {
        generic_state_cache::get(self, t).await
    }
    /// Drops the thread's state cache entry, so the next read goes to the rows.
    async fn state_cache_clear(&self, t: &ThreadRef) -> StoreResult<()> {
        self.cache_clear(STATE_CACHE_NS, &generic_state_cache::key(t)).await
    }

    /// 10xGraph 0.10's own state cache entry for the thread (see `LegacyCache`), read only when a
    /// thread it was running is resumed. Stores without a Redis that 10xGraph could have shared
    /// have none. Err: the Redis it would be in could not be read (or failed moments ago).
    async fn legacy_state_cache(&self, _t: &ThreadRef) -> StoreResult<LegacyCache> {
        Ok(LegacyCache::Absent)
    }

    /// Whether 10xGraph may have a run of this thread in its Redis entry alone, whose tools ran:
    /// the latest state row is 10xGraph's, or there is none and the ledger holds tools. What a
    /// store that cannot read that entry (`legacy_state_cache` Err) refuses to go on without.
    async fn may_hold_legacy_run(&self, _t: &ThreadRef) -> StoreResult<bool> {
        Ok(false)
    }

    /// Recorded ledger rows for the given keys, in one round trip: results, and intent records
    /// (`is_intent`) of calls that started but never recorded a result. A non-owner under user
    /// isolation reads nothing.
    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>>;
    /// Records ledger rows in one transaction. For each key the first result ever recorded wins;
    /// an intent record is written only where no row exists, and a result replaces an intent.
    /// With `fence`, nothing is written (`StoreError::Fenced`) unless the thread's lease still
    /// carries that token. Returns how many rows were written.
    async fn ledger_put_many(&self, t: &ThreadRef, entries: &[LedgerRow], fence: Option<i64>) -> StoreResult<usize>;

    /// Replaces intent records, and only intent records, with other intent records (a call marked
    /// paused at `interrupt()`, or started again when its thread is resumed); a key whose row is a
    /// result, or that has no row, is left alone. Fenced like `ledger_put_many`. Returns how many
    /// rows were replaced.
    async fn ledger_mark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize>;

    /// The start of a tool node: the rows already recorded for `intents`' keys and for the keys
    /// of `also_read` (read, never written: 10xGraph's old-format keys), as `ledger_get` returns
    /// them, and, for every key of `intents` without a row, its intent record written (fenced,
    /// like `ledger_put_many`). Returns the rows found (not the intents it wrote) and whether the
    /// intents were written. An error means nothing could be read (or `Fenced`). One round trip
    /// where the store can; the default is a read, then a write whose failure (other than
    /// `Fenced`) keeps what the read found.
    async fn ledger_begin(
        &self,
        t: &ThreadRef,
        intents: &[(String, Value)],
        also_read: &[String],
        fence: Option<i64>,
    ) -> StoreResult<(HashMap<String, Value>, Result<(), StoreError>)> {
        let keys: Vec<String> = intents.iter().map(|(k, _)| k.clone()).chain(also_read.iter().cloned()).collect();
        let found = self.ledger_get(t, &keys).await?;
        let missing: Vec<LedgerRow> =
            intents.iter().filter(|(k, _)| !found.contains_key(k)).map(|(k, v)| (k.clone(), shared_json(v))).collect();
        if missing.is_empty() {
            return Ok((found, Ok(())));
        }
        match self.ledger_put_many(t, &missing, fence).await {
            Err(e @ StoreError::Fenced { .. }) => Err(e),
            written => Ok((found, written.map(|_| ()))),
        }
    }

    /// Records one tool result; true when this call inserted it (false: a result was already there).
    async fn ledger_put(&self, t: &ThreadRef, key: &str, result: &Value) -> StoreResult<bool> {
        Ok(self.ledger_put_many(t, &[(key.to_owned(), shared_json(result))], None).await? > 0)
    }

    /// Takes the thread's lease when it is free, expired, released or `req.steal` names its
    /// current token; the new holder gets the next fencing token. Otherwise reports the holder.
    /// Under user isolation, `req.user_id` naming somebody other than the thread's owner is
    /// `StoreError::Forbidden` and changes nothing.
    async fn lease_acquire(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt>;
    /// Extends the lease; false when a newer holder has taken it (the lease is lost for good).
    /// An expired lease nobody took over is revived.
    async fn lease_renew(&self, thread_id: &str, token: i64, ttl: std::time::Duration) -> StoreResult<bool>;
    /// Frees the lease at once if `token` still holds it.
    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()>;
    /// The thread's lease row as it is now (live, expired or released); None when never taken.
    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>>;

    /// Refuses a thread and user id this store cannot hold, as every read and write of the
    /// thread does; for the calls that reach no thread row (the stop-request keys), which took
    /// "007" or "-1" on an int schema and wrote a key no run of the thread reads.
    async fn check_ids(&self, t: &ThreadRef) -> StoreResult<()> {
        id_text::check_ref(t)
    }

    /// Retention (see `PruneRules`): never touches a thread that is not completed or whose lease
    /// is held, and always keeps each thread's latest state.
    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport>;

    /// Closes connections; the store must not be used afterwards.
    async fn release(&self) -> StoreResult<()>;

    /// Every ledger row of the thread, oldest first (the CLI's `ledger` command). A non-owner
    /// under user isolation reads nothing.
    async fn ledger_list(&self, t: &ThreadRef) -> StoreResult<Vec<LedgerEntry>>;

    /// The thread's stored state versions, newest first (at most the backend's history limit).
    /// A non-owner under user isolation reads nothing.
    async fn state_versions(&self, t: &ThreadRef) -> StoreResult<Vec<StateVersion>>;

    /// The applied schema version, for `tenxgraph migrate`; None for a store without one.
    async fn schema_version(&self) -> StoreResult<Option<i64>> {
        Ok(None)
    }
}

/// The generic cache namespace of the state cache of a store without Redis. Users' namespaces
/// never start with `tenxgraph:` (the Python cache methods refuse it): under `"state_cache"` a
/// user's `aput_cache_value` replaced, and `aget_cache_value` read, any user's cached state.
const STATE_CACHE_NS: &str = "tenxgraph:state_cache";

/// The state cache kept in a backend's generic cache (no Redis): same version guard.
/// `"<a>:<b>"` with `:` and `%` of each part percent-escaped (`%3A`, `%25`): no two (thread,
/// user) pairs give one key, and ids without them (nearly all) keep 10xGraph's plain form. The
/// key of stop requests (`engine::stop_key`) and of state cache entries.
pub fn pair_key(a: &str, b: &str) -> String {
    fn esc(part: &str) -> std::borrow::Cow<'_, str> {
        if part.contains([':', '%']) {
            std::borrow::Cow::Owned(part.replace('%', "%25").replace(':', "%3A"))
        } else {
            std::borrow::Cow::Borrowed(part)
        }
    }
    format!("{}:{}", esc(a), esc(b))
}

pub(crate) mod generic_state_cache {
    use super::{Checkpointer, STATE_CACHE_NS, StoreResult, ThreadRef};
    use serde_json::{Value, json};

    /// The cache key of the thread's state entry (per thread and user). `:` and `%` in an id are
    /// escaped (`%3A`, `%25`): as `"<thread>:<user>"` the thread `a:b` of the user `c` and the
    /// thread `a` of the user `b:c` shared one entry, so under user isolation one user's
    /// `aput_state_cache` replaced what the other read back (the stop key had the same flaw).
    pub fn key(t: &ThreadRef) -> String {
        super::pair_key(&t.thread_id, &t.user_id)
    }

    /// Writes the entry unless a newer version is cached; false when it was not written.
    pub async fn put<S: Checkpointer + ?Sized>(s: &S, t: &ThreadRef, version: i64, state: &Value) -> StoreResult<bool> {
        if let Some((cur, _)) = get(s, t).await?
            && cur > version
        {
            return Ok(false);
        }
        s.cache_put(STATE_CACHE_NS, &key(t), &json!({"v": version, "d": state}), Some(86400.0)).await?;
        Ok(true)
    }

    /// The cached version and state; None when absent or unreadable.
    pub async fn get<S: Checkpointer + ?Sized>(s: &S, t: &ThreadRef) -> StoreResult<Option<(i64, Value)>> {
        Ok(s.cache_get(STATE_CACHE_NS, &key(t)).await?.and_then(|e| Some((e.get("v")?.as_i64()?, e.get("d")?.clone()))))
    }
}

/// The longest expiry of a generic cache value (about 31 years, the cap of the run's timeouts):
/// Postgres cannot hold `NOW()` plus much more, and Redis refuses a `PX` past 2^63 ms.
pub const MAX_CACHE_TTL_SECONDS: f64 = 1e9;

/// Seconds since the epoch (0 if the clock is before it).
pub(crate) fn now_secs() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Substring match used by `list_messages(search=...)` on the memory and SQLite stores: `needle`
/// in the compact JSON text of the message's `content`, ignoring case (Unicode lower case), as
/// every 10xGraph 0.10 checkpointer searches. `needle` comes lower-cased (`to_lowercase`, once per
/// listing). Only `content` is decoded, so a message whose metadata nests past serde_json's 128
/// levels is still searched (its text is listed as stored).
pub(crate) fn message_matches(data: &RawJson, needle: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Content {
        content: Option<Value>,
    }
    match serde_json::from_str::<Content>(data.get()) {
        Ok(Content { content: Some(c) }) => c.to_string().to_lowercase().contains(needle),
        _ => false,
    }
}

/// `list_threads(search=...)` on the memory and SQLite stores: `needle` (lower-cased once) in the
/// thread's name or id, ignoring case, taken literally (`%` and `_` are characters, as in
/// 10xGraph's in-memory and SQLite checkpointers).
pub(crate) fn thread_matches(row: &ThreadRow, needle: &str) -> bool {
    row.thread_name.as_deref().unwrap_or("").to_lowercase().contains(needle)
        || row.thread_id.to_lowercase().contains(needle)
}

/// A page of an already filtered listing: `offset` items skipped, at most `limit` kept.
pub(crate) fn page<T>(items: impl Iterator<Item = T>, offset: Option<i64>, limit: Option<i64>) -> Vec<T> {
    let it = items.skip(offset.unwrap_or(0).max(0) as usize);
    match limit {
        Some(l) => it.take(l.max(0) as usize).collect(),
        None => it.collect(),
    }
}
