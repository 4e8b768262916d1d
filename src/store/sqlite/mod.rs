//! Embedded SQLite backend (sqlx). WAL, `BEGIN IMMEDIATE` for every read-then-write transaction so
//! two processes on one file serialise instead of failing with BUSY_SNAPSHOT.
//!
//! One file per concept: `steps`, `messages`, `threads`, `ledger`, `lease`, `cache`, `prune`,
//! `migrations` (the schema is the `.sql` files of `migrations/sqlite`) and `tx` (the write
//! transaction). Here: the store itself, how it opens, the ownership checks every concept shares,
//! and the `Checkpointer` impl, which only routes each method to its concept.

use super::UnrecordedResults;
use super::id_text;
use super::{
    ChangeMark, Checkpoint, Checkpointer, KnownHead, LeaseAttempt, LeaseInfo, LeaseRequest, LedgerRow, PruneReport,
    PruneRules, RawJson, StepWrite, StoreError, StoreResult, StoredMessage, ThreadRef, ThreadRow, fence_ok, is_intent,
    may_take, now_secs,
};
use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqliteConnection};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

mod cache;
mod file_id;
mod input_lease;
mod lease;
mod ledger;
mod messages;
mod migrations;
mod prune;
mod steps;
mod task;
mod threads;
mod tx;

use file_id::FileId;
use lease::{check_fence, release_in};
use task::OwnedStep;
use tx::{BUSY_TIMEOUT, Tx, is_locked};

/// A `Checkpointer` on one SQLite file (or `:memory:`), safe to share between processes on one
/// machine: writes serialise (`BEGIN IMMEDIATE`), a commit survives a process crash. A clone
/// shares the pool and the write gate (see `in_task`).
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    enforce_user_isolation: bool,
    /// Orders this process's write transactions (see `Tx`).
    write_gate: Arc<tokio::sync::Mutex<()>>,
    /// How long past its ttl a lease stays held (see `lease::expires_at`).
    lease_grace: Duration,
    /// Shared by the clones the store's tasks run on.
    unrecorded: Arc<UnrecordedResults>,
    /// The file opened (None for ":memory:"), checked by every write transaction.
    file: Option<Arc<FileId>>,
}

fn be(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    // Another writer (another process) held the database past the busy wait: a retry can pass.
    move |e| if tx::is_locked(&e) { locked(op, e.to_string()) } else { StoreError::backend(op, e) }
}

/// The database stayed locked by other writers past the busy wait (TransientStorageError).
fn locked(op: &'static str, detail: String) -> StoreError {
    StoreError::LockWait {
        op,
        message: format!(
            "{detail} (another writer held it past the {} s wait; retry later)",
            tx::BUSY_TIMEOUT.as_secs()
        ),
    }
}

fn to_text(v: &Value) -> String {
    // serde_json never fails on a Value.
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

fn parse(op: &'static str, s: &str) -> StoreResult<Value> {
    serde_json::from_str(s).map_err(|e| StoreError::backend(op, e))
}

/// A stored document's text, checked to be one JSON value and not decoded (a corrupt row is
/// STORAGE_001 as a decode failure was): the message readers hand Python the text as stored.
fn stored_text(op: &'static str, s: String) -> StoreResult<RawJson> {
    super::raw_json_from_text(s).map_err(|e| StoreError::backend(op, e))
}

impl SqliteStore {
    /// Opens (creating if missing) the database. `path` may be ":memory:".
    /// `durable_sync`: fsync every commit (`synchronous=FULL`); otherwise `NORMAL`, which survives a
    /// process crash but may lose the last commits on power loss.
    pub async fn open(path: &str, enforce_user_isolation: bool, durable_sync: bool) -> StoreResult<Self> {
        // Before any connection of ours exists: see sqlite_locks.rs.
        crate::store::sqlite_locks::install();
        let memory = path == ":memory:";
        let opts = if memory {
            SqliteConnectOptions::from_str("sqlite::memory:").map_err(be("open"))?
        } else {
            // The path is a file name, as 10xGraph's is: read as a `sqlite://` URL it was
            // percent-decoded (`a%41.db` was `aA.db`) and cut at `?`. sqlx opens every file with
            // SQLITE_OPEN_URI, so a name starting with `file:` would still be read as a URI.
            let literal = if path.starts_with("file:") { format!("./{path}") } else { path.to_owned() };
            SqliteConnectOptions::new().filename(literal)
        };
        let opts = opts
            .create_if_missing(true)
            .journal_mode(if memory { SqliteJournalMode::Memory } else { SqliteJournalMode::Wal })
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            .synchronous(if durable_sync { SqliteSynchronous::Full } else { SqliteSynchronous::Normal });
        if !memory && let Some(dir) = std::path::Path::new(path).parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::backend("create directory", e))?;
        }
        // ":memory:" is per connection, so it must stay one connection that never expires.
        // No ping when the pool hands a connection out: a SQLite connection has no server that
        // could have dropped it, and the ping is a round trip to the connection's worker thread
        // on every statement's path.
        let mut pool_opts =
            SqlitePoolOptions::new().max_connections(if memory { 1 } else { 4 }).test_before_acquire(false);
        if memory {
            pool_opts = pool_opts.idle_timeout(None).max_lifetime(None).min_connections(1);
        }
        // Two processes opening a new file at once can find it locked while the other switches it
        // to WAL: that happens before the busy timeout applies, so wait here instead.
        let started = std::time::Instant::now();
        let pool = loop {
            match pool_opts.clone().connect_with(opts.clone()).await {
                Ok(pool) => break pool,
                Err(e) if is_locked(&e) && started.elapsed() < BUSY_TIMEOUT => {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Err(e) => return Err(be("connect")(e)),
            }
        };
        // After the pool opened it: create_if_missing made the file if it was not there.
        let file = if memory { None } else { Some(Arc::new(FileId::of(path)?)) };
        Ok(Self {
            pool,
            enforce_user_isolation,
            file,
            write_gate: Default::default(),
            lease_grace: BUSY_TIMEOUT,
            unrecorded: Default::default(),
        })
    }

    /// The store with leases that lapse `grace` past their ttl instead of the busy wait
    /// (`BUSY_TIMEOUT`): for tests of the ttl rule itself, which a 10 s grace would slow down.
    pub fn with_lease_grace(mut self, grace: Duration) -> Self {
        self.lease_grace = grace;
        self
    }

    /// A write transaction (see `Tx::write`) on the file this store opened: refused once the
    /// path names another file or none (see file_id.rs). Checked after BEGIN IMMEDIATE, with
    /// the write lock held.
    async fn write_tx(&self, op: &'static str) -> StoreResult<Tx> {
        let tx = Tx::write(&self.pool, &self.write_gate, op).await?;
        if let Some(f) = &self.file {
            f.check(op)?;
        }
        Ok(tx)
    }

    /// `e`, or the error saying the file is no longer at its path when it is not (file_id.rs): a
    /// read on a connection the pool opened after the file was deleted found an empty database
    /// ("no such table"), and a turn's first read is where that shows.
    fn file_gone_or(&self, e: StoreError) -> StoreError {
        match self.file.as_ref().map(|f| f.check("load")) {
            Some(Err(gone)) => gone,
            _ => e,
        }
    }

    /// Ensures the thread row exists and that `t.user_id` may write it.
    async fn own_thread(&self, c: &mut SqliteConnection, t: &ThreadRef) -> StoreResult<bool> {
        let owner: Option<String> = sqlx::query_scalar("SELECT user_id FROM threads WHERE thread_id = ?")
            .bind(&t.thread_id)
            .fetch_optional(&mut *c)
            .await
            .map_err(be("read thread"))?;
        match owner {
            Some(o) if t.isolated(self.enforce_user_isolation) && o != t.user_id => {
                Err(StoreError::Forbidden { thread_id: t.thread_id.clone() })
            }
            Some(_) => Ok(false),
            None => {
                let now = now_secs();
                sqlx::query(
                    "INSERT INTO threads (thread_id, thread_name, user_id, meta, created_at, updated_at) VALUES (?, ?, ?, '{}', ?, ?)",
                )
                .bind(&t.thread_id)
                // 10xGraph's name for a thread its first write creates, on every backend.
                .bind(id_text::default_thread_name(&t.thread_id))
                .bind(&t.user_id)
                .bind(now)
                .bind(now)
                .execute(&mut *c)
                .await
                .map_err(be("create thread"))?;
                Ok(true)
            }
        }
    }

    /// Whether `t.user_id` may read the thread, asked on the connection of the transaction that
    /// then reads (or writes) it: checked on another connection, the thread could be deleted and
    /// created again by another user in between, and the read would show that user's rows.
    async fn readable(&self, c: &mut SqliteConnection, t: &ThreadRef) -> StoreResult<bool> {
        if !t.isolated(self.enforce_user_isolation) {
            return Ok(true);
        }
        Ok(threads::owner_on(c, &t.thread_id).await?.is_none_or(|o| o == t.user_id))
    }
}

#[async_trait]
impl Checkpointer for SqliteStore {
    fn isolates_users(&self) -> bool {
        self.enforce_user_isolation
    }

    fn unrecorded(&self) -> Option<&UnrecordedResults> {
        Some(&self.unrecorded)
    }

    async fn setup(&self) -> StoreResult<()> {
        migrations::setup(self).await
    }

    async fn load_with(&self, t: &ThreadRef, known: Option<KnownHead<'_>>) -> StoreResult<Option<Checkpoint>> {
        id_text::check_ref(t)?;
        let (t, known) = (t.clone(), known.map(|k| (k.version, k.mark.to_owned())));
        self.in_task("load", move |s| async move {
            steps::load_with(&s, &t, known.as_ref().map(|(version, mark)| KnownHead { version: *version, mark })).await
        })
        .await
        .map_err(|e| self.file_gone_or(e))
    }

    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        self.put_step_with_ledger(t, w, &[]).await
    }

    fn joins_ledger_to_step(&self) -> bool {
        true
    }

    async fn put_step_with_ledger(&self, t: &ThreadRef, w: StepWrite<'_>, rows: &[LedgerRow]) -> StoreResult<i64> {
        id_text::check_ref(t)?;
        id_text::check_messages(w.new_messages)?;
        if w.in_tx.is_some() {
            return steps::put_step(self, t, w, rows).await;
        }
        let (t, w, rows) = (t.clone(), OwnedStep::of(&w), rows.to_vec());
        self.in_task("step", move |s| async move { steps::put_step(&s, &t, w.write(), &rows).await }).await
    }

    async fn put_input_leased(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<super::StopKey<'_>>,
    ) -> StoreResult<super::LeasedInput> {
        id_text::check_ref(t)?;
        id_text::check_messages(w.new_messages)?;
        if let Some(u) = &req.user_id {
            id_text::check_text_id("user_id", u)?;
        }
        if w.in_tx.is_some() {
            return input_lease::put_input_leased(self, t, req, w, stop).await;
        }
        let (t, req, w) = (t.clone(), req.clone(), OwnedStep::of(&w));
        let stop = stop.map(|k| (k.namespace.to_owned(), k.key.to_owned()));
        self.in_task("input", move |s| async move {
            let stop = stop.as_ref().map(|(namespace, key)| super::StopKey { namespace, key });
            input_lease::put_input_leased(&s, &t, &req, w.write(), stop).await
        })
        .await
    }

    async fn clear_state(&self, t: &ThreadRef) -> StoreResult<()> {
        id_text::check_ref(t)?;
        let thread_id = t.thread_id.clone();
        let t = t.clone();
        self.in_task("clear state", move |s| async move { steps::clear_state(&s, &t).await }).await?;
        self.unrecorded.forget_thread(&thread_id);
        Ok(())
    }

    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage], after: Option<&ChangeMark>) -> StoreResult<()> {
        id_text::check_ref(t)?;
        id_text::check_messages(msgs)?;
        let (t, msgs, after) = (t.clone(), msgs.to_vec(), after.cloned());
        self.in_task(
            "write messages",
            move |s| async move { messages::put_messages(&s, &t, &msgs, after.as_ref()).await },
        )
        .await
    }

    async fn get_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<Option<RawJson>> {
        id_text::check_ref(t)?;
        id_text::check_text_id("message_id", message_id)?;
        let (t, id) = (t.clone(), message_id.to_owned());
        self.in_task("read message", move |s| async move { messages::get_message(&s, &t, &id).await }).await
    }

    async fn list_messages(
        &self,
        t: &ThreadRef,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<RawJson>> {
        id_text::check_ref(t)?;
        let (t, search) = (t.clone(), search.map(str::to_owned));
        self.in_task("list messages", move |s| async move {
            messages::list_messages(&s, &t, search.as_deref(), offset, limit).await
        })
        .await
    }

    async fn delete_message(&self, t: &ThreadRef, message_id: &str, after: Option<&ChangeMark>) -> StoreResult<bool> {
        id_text::check_ref(t)?;
        id_text::check_text_id("message_id", message_id)?;
        let (t, id, after) = (t.clone(), message_id.to_owned(), after.cloned());
        self.in_task(
            "delete message",
            move |s| async move { messages::delete_message(&s, &t, &id, after.as_ref()).await },
        )
        .await
    }

    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
        id_text::check_ref(t)?;
        id_text::check_thread_name(name)?;
        let (t, name, meta) = (t.clone(), name.map(str::to_owned), meta.clone());
        self.in_task("write thread", move |s| async move { threads::put_thread(&s, &t, name.as_deref(), &meta).await })
            .await
    }

    async fn get_thread(&self, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
        id_text::check_ref(t)?;
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
            id_text::check_text_id("user_id", u)?;
        }
        threads::list_threads(self, user_id, search, offset, limit).await
    }

    async fn clean_thread(&self, t: &ThreadRef) -> StoreResult<()> {
        id_text::check_ref(t)?;
        let thread_id = t.thread_id.clone();
        let t = t.clone();
        self.in_task("delete thread", move |s| async move { threads::clean_thread(&s, &t).await }).await?;
        self.unrecorded.forget_thread(&thread_id);
        Ok(())
    }

    async fn thread_owner(&self, thread_id: &str) -> StoreResult<Option<String>> {
        id_text::check_text_id("thread_id", thread_id)?;
        threads::thread_owner(self, thread_id).await
    }

    async fn running_threads(&self, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
        if let Some(a) = after {
            id_text::check_text_id("thread_id", a)?;
        }
        threads::running_threads(self, after, limit).await
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

    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        id_text::check_ref(t)?;
        ledger::ledger_get(self, t, keys).await
    }

    async fn ledger_put_many(&self, t: &ThreadRef, entries: &[LedgerRow], fence: Option<i64>) -> StoreResult<usize> {
        id_text::check_ref(t)?;
        let (t, entries) = (t.clone(), entries.to_vec());
        self.in_task("ledger write", move |s| async move { ledger::ledger_put_many(&s, &t, &entries, fence).await })
            .await
    }

    async fn ledger_mark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        id_text::check_ref(t)?;
        let (t, marks) = (t.clone(), marks.to_vec());
        self.in_task("ledger write", move |s| async move { ledger::ledger_mark(&s, &t, &marks, fence).await }).await
    }

    async fn lease_acquire(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        id_text::check_text_id("thread_id", thread_id)?;
        if let Some(u) = &req.user_id {
            id_text::check_text_id("user_id", u)?;
        }
        let (thread_id, req) = (thread_id.to_owned(), req.clone());
        self.in_task("acquire lease", move |s| async move { lease::lease_acquire(&s, &thread_id, &req).await }).await
    }

    async fn lease_renew(&self, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
        id_text::check_text_id("thread_id", thread_id)?;
        lease::lease_renew(self, thread_id, token, ttl).await
    }

    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        id_text::check_text_id("thread_id", thread_id)?;
        let thread_id = thread_id.to_owned();
        self.in_task("release lease", move |s| async move { lease::lease_release(&s, &thread_id, token).await }).await
    }

    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        id_text::check_text_id("thread_id", thread_id)?;
        lease::lease_get(self, thread_id).await
    }

    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport> {
        let rules = rules.clone();
        self.in_task("prune", move |s| async move { prune::prune(&s, &rules).await }).await
    }

    async fn release(&self) -> StoreResult<()> {
        self.pool.close().await;
        Ok(())
    }

    async fn ledger_list(&self, t: &ThreadRef) -> StoreResult<Vec<crate::store::LedgerEntry>> {
        id_text::check_ref(t)?;
        let t = t.clone();
        self.in_task("ledger list", move |s| async move { ledger::ledger_list(&s, &t).await }).await
    }

    async fn state_versions(&self, t: &ThreadRef) -> StoreResult<Vec<crate::store::StateVersion>> {
        id_text::check_ref(t)?;
        let t = t.clone();
        self.in_task("state versions", move |s| async move { steps::state_versions(&s, &t).await }).await
    }

    async fn schema_version(&self) -> StoreResult<Option<i64>> {
        migrations::schema_version(self).await
    }
}
