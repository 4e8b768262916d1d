//! `LazyStore`: a store that opens its backend on first use, not when it is made.
//!
//! 10xGraph's `PgCheckpointer(...)` does not connect in its constructor, so a module-level
//! checkpointer (the one `10xgraph.json` names) imports while the database is down. The backend
//! is opened by the first call that needs it (`setup()` included); an open that fails is not
//! remembered, so the next call tries again and a database started later is picked up.

use super::{
    ChangeMark, Checkpoint, Checkpointer, KnownHead, LeaseAttempt, LeaseInfo, LeaseRequest, LedgerEntry, LegacyCache,
    PruneReport, PruneRules, RawJson, StateVersion, StepWrite, StoreError, StoreResult, StoredMessage, ThreadRef,
    ThreadRow,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::OnceCell;

/// Opens the backend (connect, migrate). Called again after a failure.
pub type Opener = Box<dyn Fn() -> BoxFuture<'static, StoreResult<Arc<dyn Checkpointer>>> + Send + Sync>;

/// A store opened on first use: every method opens the backend (through `Opener`) if it is not
/// open yet, and a failed open is retried by the next call instead of being remembered.
pub struct LazyStore {
    // Shared with the open's task (see `get`).
    cell: Arc<OnceCell<Arc<dyn Checkpointer>>>,
    open: Arc<Opener>,
    // Known without connecting: the engine asks it synchronously.
    isolates_users: bool,
    // How many times `release` was called: an open in flight across a release closes what it
    // opened (see `get`).
    releases: Arc<AtomicU64>,
}

impl LazyStore {
    /// A store not yet opened; `isolates_users` is answered without opening it.
    pub fn new(isolates_users: bool, open: Opener) -> Self {
        LazyStore {
            cell: Arc::new(OnceCell::new()),
            open: Arc::new(open),
            isolates_users,
            releases: Default::default(),
        }
    }

    /// Whether the backend has been opened.
    pub fn is_open(&self) -> bool {
        self.cell.initialized()
    }

    async fn get(&self) -> StoreResult<&Arc<dyn Checkpointer>> {
        if let Some(s) = self.cell.get() {
            return Ok(s);
        }
        // Concurrent first users wait for one open; a failed open leaves the cell empty. The open
        // (connect, migrate under the schema's lock) runs as a task that fills the cell itself:
        // run in the caller's future, a caller whose loop stopped for good held the cell's
        // initialisation, and every later call of the process waited for it for ever.
        let (cell, open, releases) = (self.cell.clone(), self.open.clone(), self.releases.clone());
        let before = releases.load(Ordering::SeqCst);
        super::task::to_the_end("open", async move {
            let store = cell.get_or_try_init(|| open()).await?;
            // A release that came while this open was in flight found nothing to close: the pool
            // opened here would stay connected for the rest of the process.
            if releases.load(Ordering::SeqCst) != before {
                let _ = store.release().await;
            }
            Ok(())
        })
        .await?;
        // The task returned Ok only with the cell filled (by it or by another caller's open).
        self.cell.get().ok_or_else(|| StoreError::Transient { op: "open", message: "the store did not open".into() })
    }
}

#[async_trait]
impl Checkpointer for LazyStore {
    async fn setup(&self) -> StoreResult<()> {
        // Opening runs the migrations; `setup` on the opened store is then a cheap re-check.
        self.get().await?.setup().await
    }
    async fn load(&self, t: &ThreadRef) -> StoreResult<Option<Checkpoint>> {
        self.get().await?.load(t).await
    }
    async fn load_with(&self, t: &ThreadRef, known: Option<KnownHead<'_>>) -> StoreResult<Option<Checkpoint>> {
        self.get().await?.load_with(t, known).await
    }
    async fn lease_and_load(
        &self,
        t: &ThreadRef,
        known: Option<KnownHead<'_>>,
    ) -> (StoreResult<Option<LeaseInfo>>, StoreResult<Option<Checkpoint>>) {
        match self.get().await {
            Ok(s) => s.lease_and_load(t, known).await,
            // A lease that could not be read is not held; the run fails on the load's error.
            Err(e) => (Ok(None), Err(e)),
        }
    }
    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        self.get().await?.put_step(t, w).await
    }

    fn joins_ledger_to_step(&self) -> bool {
        // Before the first use nobody knows the backend: not joined until it is open.
        self.cell.get().is_some_and(|s| s.joins_ledger_to_step())
    }

    async fn put_step_with_ledger(
        &self,
        t: &ThreadRef,
        w: StepWrite<'_>,
        rows: &[super::LedgerRow],
    ) -> StoreResult<i64> {
        self.get().await?.put_step_with_ledger(t, w, rows).await
    }
    async fn put_input_leased(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<super::StopKey<'_>>,
    ) -> StoreResult<super::LeasedInput> {
        self.get().await?.put_input_leased(t, req, w, stop).await
    }
    fn checks_head_at_input(&self) -> bool {
        // Before the first use the backend is unknown: the run reads, which opens it.
        self.cell.get().is_some_and(|s| s.checks_head_at_input())
    }
    async fn put_input_on_head(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<super::StopKey<'_>>,
    ) -> StoreResult<super::LeasedInput> {
        self.get().await?.put_input_on_head(t, req, w, stop).await
    }
    async fn clear_state(&self, t: &ThreadRef) -> StoreResult<()> {
        self.get().await?.clear_state(t).await
    }
    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage], after: Option<&ChangeMark>) -> StoreResult<()> {
        self.get().await?.put_messages(t, msgs, after).await
    }
    async fn get_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<Option<RawJson>> {
        self.get().await?.get_message(t, message_id).await
    }
    async fn list_messages(
        &self,
        t: &ThreadRef,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<RawJson>> {
        self.get().await?.list_messages(t, search, offset, limit).await
    }
    async fn delete_message(&self, t: &ThreadRef, message_id: &str, after: Option<&ChangeMark>) -> StoreResult<bool> {
        self.get().await?.delete_message(t, message_id, after).await
    }
    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
        self.get().await?.put_thread(t, name, meta).await
    }
    async fn get_thread(&self, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
        self.get().await?.get_thread(t).await
    }
    async fn list_threads(
        &self,
        user_id: Option<&str>,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<ThreadRow>> {
        self.get().await?.list_threads(user_id, search, offset, limit).await
    }
    async fn clean_thread(&self, t: &ThreadRef) -> StoreResult<()> {
        self.get().await?.clean_thread(t).await
    }
    async fn thread_owner(&self, thread_id: &str) -> StoreResult<Option<String>> {
        self.get().await?.thread_owner(thread_id).await
    }
    async fn running_threads(&self, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
        self.get().await?.running_threads(after, limit).await
    }
    fn isolates_users(&self) -> bool {
        self.isolates_users
    }

    fn running_threads_unlisted(&self) -> Option<String> {
        self.cell.get().and_then(|s| s.running_threads_unlisted())
    }

    fn unrecorded(&self) -> Option<&super::UnrecordedResults> {
        // A tool node runs after the run's first store call, which opened it.
        self.cell.get().and_then(|s| s.unrecorded())
    }
    async fn is_owner(&self, t: &ThreadRef) -> StoreResult<bool> {
        self.get().await?.is_owner(t).await
    }
    async fn cache_put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()> {
        self.get().await?.cache_put(ns, key, value, ttl).await
    }
    async fn cache_get(&self, ns: &str, key: &str) -> StoreResult<Option<Value>> {
        self.get().await?.cache_get(ns, key).await
    }
    async fn cache_put_absent(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<bool> {
        self.get().await?.cache_put_absent(ns, key, value, ttl).await
    }
    async fn cache_clear(&self, ns: &str, key: &str) -> StoreResult<()> {
        self.get().await?.cache_clear(ns, key).await
    }
    async fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
        self.get().await?.cache_keys(ns, prefix).await
    }
    async fn state_cache_put(&self, t: &ThreadRef, version: i64, state: &Value) -> StoreResult<bool> {
        self.get().await?.state_cache_put(t, version, state).await
    }
    async fn state_cache_get(&self, t: &ThreadRef) -> StoreResult<Option<(i64, Value)>> {
        self.get().await?.state_cache_get(t).await
    }
    async fn state_cache_clear(&self, t: &ThreadRef) -> StoreResult<()> {
        self.get().await?.state_cache_clear(t).await
    }
    async fn legacy_state_cache(&self, t: &ThreadRef) -> StoreResult<LegacyCache> {
        // A default-bodied trait method: a wrapper that does not forward it silently answers with
        // the default (here: no 10xGraph entry, so a run 10xGraph died in resumed at the wrong node).
        self.get().await?.legacy_state_cache(t).await
    }
    async fn may_hold_legacy_run(&self, t: &ThreadRef) -> StoreResult<bool> {
        self.get().await?.may_hold_legacy_run(t).await
    }
    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        self.get().await?.ledger_get(t, keys).await
    }
    async fn ledger_put_many(
        &self,
        t: &ThreadRef,
        entries: &[super::LedgerRow],
        fence: Option<i64>,
    ) -> StoreResult<usize> {
        self.get().await?.ledger_put_many(t, entries, fence).await
    }
    async fn ledger_mark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        self.get().await?.ledger_mark(t, marks, fence).await
    }
    async fn ledger_begin(
        &self,
        t: &ThreadRef,
        intents: &[(String, Value)],
        also_read: &[String],
        fence: Option<i64>,
    ) -> StoreResult<(HashMap<String, Value>, Result<(), StoreError>)> {
        self.get().await?.ledger_begin(t, intents, also_read, fence).await
    }
    async fn ledger_put(&self, t: &ThreadRef, key: &str, result: &Value) -> StoreResult<bool> {
        self.get().await?.ledger_put(t, key, result).await
    }
    async fn lease_acquire(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        self.get().await?.lease_acquire(thread_id, req).await
    }
    async fn lease_renew(&self, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
        self.get().await?.lease_renew(thread_id, token, ttl).await
    }
    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        self.get().await?.lease_release(thread_id, token).await
    }
    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        self.get().await?.lease_get(thread_id).await
    }
    async fn check_ids(&self, t: &ThreadRef) -> StoreResult<()> {
        self.get().await?.check_ids(t).await
    }
    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport> {
        self.get().await?.prune(rules).await
    }
    async fn release(&self) -> StoreResult<()> {
        // Never connects just to close; an open in flight closes what it opens (see `get`).
        self.releases.fetch_add(1, Ordering::SeqCst);
        match self.cell.get() {
            Some(s) => s.release().await,
            None => Ok(()),
        }
    }
    async fn ledger_list(&self, t: &ThreadRef) -> StoreResult<Vec<LedgerEntry>> {
        self.get().await?.ledger_list(t).await
    }
    async fn state_versions(&self, t: &ThreadRef) -> StoreResult<Vec<StateVersion>> {
        self.get().await?.state_versions(t).await
    }
    async fn schema_version(&self) -> StoreResult<Option<i64>> {
        self.get().await?.schema_version().await
    }
}
