//! PostgreSQL backend (sqlx, runtime queries: no database at build time). A durable step is one
//! call of `tenx_put_step` (one round trip, one transaction); the ledger keeps the first result
//! (`ON CONFLICT DO NOTHING`); ledger rows go with their thread (foreign key cascade). Redis, when
//! configured, serves the generic cache and stop requests; without it (or while it is down) the
//! `tenx_cache` table does.
//!
//! One file per concept: `options` and `connect` (how a store is configured and opened),
//! `errors` (error mapping, password redaction), `read_only` (a server that refuses writes),
//! `ident` (the schema name, checked and quoted),
//! `nul` (U+0000), `migrations` (the `.sql` files of `migrations/postgres`), `steps`, `messages`,
//! `threads`, `ledger`, `lease`, `prune`, `cache` (the generic and state caches, Redis first), `input_lease` (a run's first
//! commit: lease, input step and stop-key clear in one statement),
//! `redis_cache` (the Redis side) and `versions` (state versions, schema version). Each concept
//! file holds its statements, built once at connect with the quoted schema in them, and the
//! bodies of its trait methods under the trait's names. Here: the store, the ownership check the
//! concepts share, and the `Checkpointer` impl, which only routes each method to its concept.

mod cache;
mod connect;
mod conns;
mod errors;
mod gate;
mod id_check;
mod ident;
mod input_lease;
mod lease;
mod ledger;
mod messages;
mod migrations;
mod nul;
mod options;
mod owned;
mod pooled;
mod prune;
mod read_only;
mod redis_cache;
mod start_read;
mod steps;
mod threads;
mod versions;

pub use errors::redact;
pub use ident::{quote_schema, validate_schema};
pub use migrations::{CURRENT_VERSION, migrate};
pub use options::{IdType, PgOptions};
pub use redis_cache::RedisCache;

use super::{
    ChangeMark, Checkpoint, Checkpointer, KnownHead, LeaseAttempt, LeaseInfo, LeaseRequest, LedgerEntry, LegacyCache,
    PruneReport, PruneRules, RawJson, StateVersion, StepWrite, StoreError, StoreResult, StoredMessage, ThreadRef,
    ThreadRow,
};
use async_trait::async_trait;
use errors::map_err;
use serde_json::Value;
use sqlx::AssertSqlSafe;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A `Checkpointer` on PostgreSQL (with Redis as an optional cache): the store 10xGraph 0.10's
/// `PgCheckpointer` databases are read and written by, same tables, same schema versions 1-3.
pub struct PgStore {
    conns: conns::Conns,
    opts: PgOptions,
    sql: Sql,
    redis: Option<RedisCache>,
    unrecorded: super::UnrecordedResults,
    /// Why the last recovery listing missed 10xGraph's Redis entries (`running_threads_unlisted`).
    legacy_scan_error: std::sync::Mutex<Option<String>>,
}

/// One statement's text, the quoted schema spliced in once when the store connects (never a
/// value: values are bind parameters); sharing it with a query costs a reference count.
#[derive(Clone)]
struct Stmt(Arc<str>);

impl Stmt {
    fn new(text: String) -> Self {
        Stmt(text.into())
    }

    /// The text as sqlx takes it. Safe: built only from literals and `quote_schema`'s output.
    fn q(&self) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(self.0.clone())
    }
}

/// Every statement of every concept, built once per store.
struct Sql {
    steps: steps::Stmts,
    messages: messages::Stmts,
    threads: threads::Stmts,
    ledger: ledger::Stmts,
    lease: lease::Stmts,
    prune: prune::Stmts,
    cache: cache::Stmts,
    versions: versions::Stmts,
    input_lease: input_lease::Stmts,
    start_read: start_read::Stmts,
}

impl Sql {
    /// `s`: the schema as `quote_schema` returns it; `ids`: the database's id types (thread and
    /// message, user), which the statements cast their text parameters to.
    fn new(s: &str, ids: (options::IdType, options::IdType)) -> Self {
        let c = Casts { id: ids.0.cast(), user: ids.1.cast(), id_text: ids.0.text(), user_text: ids.1.text() };
        let steps = steps::Stmts::new(s, &c);
        Sql {
            start_read: start_read::Stmts::new(s, &steps.load),
            steps,
            messages: messages::Stmts::new(s, &c),
            threads: threads::Stmts::new(s, &c),
            ledger: ledger::Stmts::new(s, &c),
            lease: lease::Stmts::new(s, &c),
            prune: prune::Stmts::new(s, &c),
            cache: cache::Stmts::new(s),
            versions: versions::Stmts::new(s, &c),
            input_lease: input_lease::Stmts::new(s),
        }
    }
}

/// What a statement splices next to an id: the cast of a text parameter to the column's type, and
/// the cast of the column back to text (all empty for string ids, so those statements are
/// unchanged).
struct Casts {
    id: &'static str,
    user: &'static str,
    id_text: &'static str,
    user_text: &'static str,
}

impl PgStore {
    /// `fut` (a transaction: BEGIN, its statements and COMMIT) bounded by twice the statement
    /// deadline: each statement of a transaction runs on `&mut *tx`, outside `Conns`' own
    /// per-statement bound.
    async fn bounded<T>(
        &self,
        op: &'static str,
        fut: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let limit = self.opts.statement_deadline * 2;
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Transient { op, message: conns::timed_out(limit).to_string() }),
        }
    }

    /// Redis while it is configured and not marked down; None sends the caller to the tables.
    fn redis(&self) -> Option<&RedisCache> {
        self.redis.as_ref().filter(|r| r.is_up())
    }

    /// The Redis given, marked down or not.
    fn redis_configured(&self) -> Option<&RedisCache> {
        self.redis.as_ref()
    }
}

#[async_trait]
impl Checkpointer for PgStore {
    fn isolates_users(&self) -> bool {
        self.opts.enforce_user_isolation
    }

    fn unrecorded(&self) -> Option<&super::UnrecordedResults> {
        Some(&self.unrecorded)
    }

    async fn setup(&self) -> StoreResult<()> {
        let ids = (self.opts.id_type, self.opts.user_id_type);
        migrate(self.conns.pool(), &self.opts.schema, ids, self.opts.statement_deadline).await.map(|_| ())
    }

    async fn load_with(&self, t: &ThreadRef, known: Option<KnownHead<'_>>) -> StoreResult<Option<Checkpoint>> {
        self.check_thread(t)?;
        steps::load_with(self, t, known).await
    }

    async fn lease_and_load(
        &self,
        t: &ThreadRef,
        known: Option<KnownHead<'_>>,
    ) -> (StoreResult<Option<LeaseInfo>>, StoreResult<Option<Checkpoint>>) {
        if let Err(e) = self.check_thread(t) {
            // As with the two reads: the lease is not read, the run fails on the load's error.
            return (Ok(None), Err(e));
        }
        start_read::lease_and_load(self, t, known).await
    }

    async fn put_input_leased(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<crate::store::StopKey<'_>>,
    ) -> StoreResult<crate::store::LeasedInput> {
        self.bounded("write input", input_lease::put_input(self, t, req, w, stop, false)).await
    }
    fn checks_head_at_input(&self) -> bool {
        true
    }
    async fn put_input_on_head(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<crate::store::StopKey<'_>>,
    ) -> StoreResult<crate::store::LeasedInput> {
        self.bounded("write input", input_lease::put_input(self, t, req, w, stop, true)).await
    }

    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        self.put_step_with_ledger(t, w, &[]).await
    }

    fn joins_ledger_to_step(&self) -> bool {
        true
    }

    async fn put_step_with_ledger(
        &self,
        t: &ThreadRef,
        w: StepWrite<'_>,
        rows: &[crate::store::LedgerRow],
    ) -> StoreResult<i64> {
        self.check_thread(t)?;
        self.check_messages(w.new_messages)?;
        self.bounded("write step", steps::put_step(self, t, w, rows)).await
    }

    async fn clear_state(&self, t: &ThreadRef) -> StoreResult<()> {
        self.check_thread(t)?;
        self.bounded("clear state", steps::clear_state(self, t)).await?;
        self.unrecorded.forget_thread(&t.thread_id);
        Ok(())
    }

    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage], after: Option<&ChangeMark>) -> StoreResult<()> {
        self.check_thread(t)?;
        self.check_messages(msgs)?;
        self.bounded("write messages", messages::put_messages(self, t, msgs, after)).await
    }

    async fn get_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<Option<RawJson>> {
        self.check_thread(t)?;
        self.check_message_id(message_id)?;
        messages::get_message(self, t, message_id).await
    }

    async fn list_messages(
        &self,
        t: &ThreadRef,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<RawJson>> {
        self.check_thread(t)?;
        messages::list_messages(self, t, search, offset, limit).await
    }

    async fn delete_message(&self, t: &ThreadRef, message_id: &str, after: Option<&ChangeMark>) -> StoreResult<bool> {
        self.check_thread(t)?;
        self.check_message_id(message_id)?;
        // A transaction: its statements run on `&mut *tx`, outside `Conns`' per-statement bound.
        self.bounded("delete message", messages::delete_message(self, t, message_id, after)).await
    }

    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
        self.check_thread(t)?;
        crate::store::id_text::check_thread_name(name)?;
        self.bounded("write thread", threads::put_thread(self, t, name, meta)).await
    }

    async fn get_thread(&self, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
        self.check_thread(t)?;
        threads::get_thread(self, t).await
    }

    async fn list_threads(
        &self,
        user_id: Option<&str>,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<ThreadRow>> {
        if let Some(u) = user_id {
            self.check_user_id(u)?;
        }
        threads::list_threads(self, user_id, search, offset, limit).await
    }

    async fn clean_thread(&self, t: &ThreadRef) -> StoreResult<()> {
        self.check_thread(t)?;
        self.bounded("delete thread", threads::clean_thread(self, t)).await?;
        self.unrecorded.forget_thread(&t.thread_id);
        Ok(())
    }

    async fn thread_owner(&self, thread_id: &str) -> StoreResult<Option<String>> {
        self.check_thread_id(thread_id)?;
        threads::thread_owner(self, thread_id).await
    }

    async fn running_threads(&self, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
        if let Some(a) = after {
            self.check_thread_id(a)?;
        }
        threads::running_threads(self, after, limit).await
    }

    async fn may_hold_legacy_run(&self, t: &ThreadRef) -> StoreResult<bool> {
        self.check_thread(t)?;
        threads::may_hold_legacy_run(self, &self.conns, t).await.map_err(|e| map_err("read thread", e, Some(t)))
    }

    fn running_threads_unlisted(&self) -> Option<String> {
        self.legacy_scan_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn cache_put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()> {
        cache::cache_put(self, ns, key, value, ttl).await
    }

    async fn cache_get(&self, ns: &str, key: &str) -> StoreResult<Option<Value>> {
        cache::cache_get(self, ns, key).await
    }

    async fn cache_put_absent(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<bool> {
        cache::cache_put_absent(self, ns, key, value, ttl).await
    }

    async fn cache_clear(&self, ns: &str, key: &str) -> StoreResult<()> {
        cache::cache_clear(self, ns, key).await
    }

    async fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
        cache::cache_keys(self, ns, prefix).await
    }

    async fn state_cache_put(&self, t: &ThreadRef, version: i64, state: &Value) -> StoreResult<bool> {
        self.check_thread(t)?;
        cache::state_cache_put(self, t, version, state).await
    }

    async fn state_cache_get(&self, t: &ThreadRef) -> StoreResult<Option<(i64, Value)>> {
        self.check_thread(t)?;
        cache::state_cache_get(self, t).await
    }

    async fn state_cache_clear(&self, t: &ThreadRef) -> StoreResult<()> {
        self.check_thread(t)?;
        cache::state_cache_clear(self, t).await
    }

    async fn legacy_state_cache(&self, t: &ThreadRef) -> StoreResult<LegacyCache> {
        cache::legacy_state_cache(self, t).await
    }

    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        self.check_thread(t)?;
        ledger::ledger_get(self, t, keys).await
    }

    async fn ledger_put_many(
        &self,
        t: &ThreadRef,
        entries: &[crate::store::LedgerRow],
        fence: Option<i64>,
    ) -> StoreResult<usize> {
        self.check_thread(t)?;
        ledger::ledger_put_many(self, t, entries, fence).await
    }

    async fn ledger_mark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        self.check_thread(t)?;
        ledger::ledger_mark(self, t, marks, fence).await
    }

    async fn ledger_begin(
        &self,
        t: &ThreadRef,
        intents: &[(String, Value)],
        also_read: &[String],
        fence: Option<i64>,
    ) -> StoreResult<(HashMap<String, Value>, Result<(), StoreError>)> {
        self.check_thread(t)?;
        ledger::ledger_begin(self, t, intents, also_read, fence).await
    }

    async fn ledger_list(&self, t: &ThreadRef) -> StoreResult<Vec<LedgerEntry>> {
        self.check_thread(t)?;
        ledger::ledger_list(self, t).await
    }

    async fn lease_acquire(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        self.check_thread_id(thread_id)?;
        if let Some(u) = &req.user_id {
            self.check_user_id(u)?;
        }
        lease::lease_acquire(self, thread_id, req).await
    }

    async fn lease_renew(&self, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
        self.check_thread_id(thread_id)?;
        lease::lease_renew(self, thread_id, token, ttl).await
    }

    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        self.check_thread_id(thread_id)?;
        lease::lease_release(self, thread_id, token).await
    }

    async fn check_ids(&self, t: &ThreadRef) -> StoreResult<()> {
        crate::store::id_text::check_ref(t)?;
        self.check_thread(t)
    }
    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        self.check_thread_id(thread_id)?;
        lease::lease_get(self, thread_id).await
    }

    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport> {
        // A real run's batches are each bounded (each reads one window of rows and commits); the
        // whole is not, and neither is a dry run (one transaction): on a large database either may
        // rightly take minutes.
        prune::prune(self, rules).await
    }

    async fn release(&self) -> StoreResult<()> {
        // A statement stuck on a frozen server, or one whose caller gave up waiting (a kept
        // result's write behind a row lock: the connection stays busy until the server's own
        // statement_timeout), would hold `close` (the pool waits for every connection): bounded,
        // the stuck connections are dropped with the pool. A write still in flight then commits
        // or not on its own, as a cancelled one does.
        let bound = self.opts.statement_deadline.min(std::time::Duration::from_secs(2));
        let _ = tokio::time::timeout(bound, self.conns.close()).await;
        Ok(())
    }

    async fn state_versions(&self, t: &ThreadRef) -> StoreResult<Vec<StateVersion>> {
        self.check_thread(t)?;
        versions::state_versions(self, t).await
    }

    async fn schema_version(&self) -> StoreResult<Option<i64>> {
        versions::schema_version(self).await
    }
}
