//! Embedded SQLite backend (sqlx). WAL, `BEGIN IMMEDIATE` for every read-then-write transaction so
//! two processes on one file serialise instead of failing with BUSY_SNAPSHOT.

use super::{
    Checkpoint, KnownHead, Checkpointer, LeaseAttempt, LeaseInfo, LeaseRequest, PruneReport, PruneRules, StepWrite, StoreError,
    StoreResult, StoredMessage, ThreadRef, ThreadRow, fence_ok, is_intent, may_take, now_secs,
};
use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqliteConnection};
use std::collections::HashMap;
use std::sync::Arc;
use std::str::FromStr;
use std::time::Duration;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
const STATE_HISTORY: i64 = 20;

/// Threads `prune` may clear around: latest state completed, lease not held (`?1` = now).
const FINISHED: &str = "SELECT s.thread_id FROM states s \
     WHERE s.version = (SELECT MAX(version) FROM states WHERE thread_id = s.thread_id) \
       AND json_extract(s.state_data, '$.execution_meta.status') = 'completed' \
       AND s.thread_id NOT IN (SELECT thread_id FROM leases WHERE released = 0 AND expires_at > ?1)";

/// Refuses the write when the thread's lease has moved on from `fence` (inside the write's
/// transaction: BEGIN IMMEDIATE already excludes a concurrent takeover).
async fn check_fence(c: &mut SqliteConnection, thread_id: &str, fence: Option<i64>) -> StoreResult<()> {
    if fence.is_none() {
        return Ok(());
    }
    let current: Option<i64> = sqlx::query_scalar("SELECT token FROM leases WHERE thread_id = ?")
        .bind(thread_id)
        .fetch_optional(&mut *c)
        .await
        .map_err(be("read lease"))?;
    if fence_ok(current, fence) {
        Ok(())
    } else {
        Err(StoreError::Fenced { thread_id: thread_id.to_owned(), token: fence.unwrap_or_default(), current })
    }
}

async fn release_in(c: &mut SqliteConnection, thread_id: &str, token: i64) -> StoreResult<()> {
    sqlx::query("UPDATE leases SET released = 1, expires_at = ? WHERE thread_id = ? AND token = ?")
        .bind(now_secs())
        .bind(thread_id)
        .bind(token)
        .execute(c)
        .await
        .map_err(be("release lease"))?;
    Ok(())
}

fn lease_info(r: &sqlx::sqlite::SqliteRow, now: f64) -> LeaseInfo {
    LeaseInfo {
        token: r.get("token"),
        holder: r.get("holder"),
        host: r.get("host"),
        pid: r.get("pid"),
        pid_start: r.get("pid_start"),
        expires_in: r.get::<f64, _>("expires_at") - now,
        released: r.get::<i64, _>("released") != 0,
    }
}

const LEASE_COLUMNS: &str = "SELECT token, holder, host, pid, pid_start, expires_at, released FROM leases WHERE thread_id = ?";

/// A `BEGIN IMMEDIATE` transaction on a pooled connection, ended by hand. sqlx's own Transaction
/// keeps counting a transaction whose COMMIT failed (e.g. disk full), and that connection then
/// refuses every later BEGIN, so a thread could never be resumed after the disk was freed. Here a
/// transaction that did not commit is rolled back before its connection is reused, and a
/// connection that cannot even roll back is closed.
/// How long a write waits for the database (SQLite's busy handler) and, before that, for this
/// process's other writers.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

struct WriteTx {
    conn: Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>,
    // Held until commit or drop. SQLite admits one writer at a time anyway; queueing this
    // process's writers here, first come first served, leaves SQLite's busy handler (sleep and
    // retry, no order) to arbitrate between processes only. Without it, 64 concurrent runs on
    // 4 connections starved one writer past the 10 s busy timeout ("database is locked").
    _gate: tokio::sync::OwnedMutexGuard<()>,
}

impl WriteTx {
    async fn begin(pool: &SqlitePool, gate: &Arc<tokio::sync::Mutex<()>>, op: &'static str) -> StoreResult<Self> {
        // Bounded like SQLite's own busy wait, so a writer queued behind many others (each of
        // which may wait out another process's lock) gives up instead of hanging.
        let gate = tokio::time::timeout(BUSY_TIMEOUT, gate.clone().lock_owned()).await.map_err(|_| {
            StoreError::backend(op, std::io::Error::new(std::io::ErrorKind::TimedOut, format!(
                "database is locked: waited {} s behind this process's other writers", BUSY_TIMEOUT.as_secs()
            )))
        })?;
        let mut conn = pool.acquire().await.map_err(be(op))?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await.map_err(be(op))?;
        Ok(WriteTx { conn: Some(conn), _gate: gate })
    }

    fn conn(&mut self) -> &mut SqliteConnection {
        self.conn.as_mut().expect("present until commit or drop")
    }

    async fn commit(mut self, op: &'static str) -> StoreResult<()> {
        let mut conn = self.conn.take().expect("present until commit or drop");
        match sqlx::query("COMMIT").execute(&mut *conn).await {
            Ok(_) => Ok(()),
            Err(e) => {
                finish_failed(conn).await;
                Err(be(op)(e))
            }
        }
    }
}

/// Messages changed outside a step: the latest state row no longer describes them (see
/// `clear_write_mark`).
async fn unmark_latest(c: &mut SqliteConnection, t: &ThreadRef) -> StoreResult<()> {
    sqlx::query(
        "UPDATE states SET state_data = json_set(state_data, '$.__state_meta__.write', ?) \
         WHERE thread_id = ? AND version = (SELECT MAX(version) FROM states WHERE thread_id = ?)",
    )
    .bind(super::MESSAGES_CHANGED)
    .bind(&t.thread_id)
    .bind(&t.thread_id)
    .execute(&mut *c)
    .await
    .map_err(be("write messages"))?;
    Ok(())
}

/// SQLITE_BUSY ("database is locked").
fn is_locked(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("5"))
}

/// Rolls back an unfinished transaction; closes the connection when even that fails.
async fn finish_failed(mut conn: sqlx::pool::PoolConnection<sqlx::Sqlite>) {
    if sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err() {
        // No transaction left (SQLite already rolled it back) is fine; anything else: close.
        if sqlx::query("SELECT 1").execute(&mut *conn).await.is_err() {
            conn.close_on_drop();
        }
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        // An error return or a cancelled future: roll back before the connection is reused. The
        // connection stays out of the pool until then, so nobody sees the open transaction.
        if let Some(mut conn) = self.conn.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn(finish_failed(conn));
                }
                Err(_) => conn.close_on_drop(),
            }
        }
    }
}

pub struct SqliteStore {
    pool: SqlitePool,
    enforce_user_isolation: bool,
    /// Orders this process's write transactions (see `WriteTx`).
    write_gate: Arc<tokio::sync::Mutex<()>>,
}

fn be(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::backend(op, e)
}

fn to_text(v: &Value) -> String {
    // serde_json never fails on a Value.
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

fn parse(op: &'static str, s: &str) -> StoreResult<Value> {
    serde_json::from_str(s).map_err(|e| StoreError::backend(op, e))
}

impl SqliteStore {
    /// Opens (creating if missing) the database. `path` may be ":memory:".
    /// `durable_sync`: fsync every commit (`synchronous=FULL`); otherwise `NORMAL`, which survives a
    /// process crash but may lose the last commits on power loss.
    pub async fn open(path: &str, enforce_user_isolation: bool, durable_sync: bool) -> StoreResult<Self> {
        // Before any connection of ours exists: see sqlite_locks.rs.
        super::sqlite_locks::install();
        let memory = path == ":memory:";
        let url = if memory { "sqlite::memory:".to_owned() } else { format!("sqlite://{path}") };
        let opts = SqliteConnectOptions::from_str(&url)
            .map_err(be("open"))?
            .create_if_missing(true)
            .journal_mode(if memory { SqliteJournalMode::Memory } else { SqliteJournalMode::Wal })
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            .synchronous(if durable_sync { SqliteSynchronous::Full } else { SqliteSynchronous::Normal });
        if !memory {
            if let Some(dir) = std::path::Path::new(path).parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::backend("create directory", e))?;
            }
        }
        // ":memory:" is per connection, so it must stay one connection that never expires.
        let mut pool_opts = SqlitePoolOptions::new().max_connections(if memory { 1 } else { 4 });
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
        Ok(Self { pool, enforce_user_isolation, write_gate: Default::default() })
    }

    /// Ensures the thread row exists and that `t.user_id` may write it.
    async fn own_thread(&self, c: &mut SqliteConnection, t: &ThreadRef) -> StoreResult<bool> {
        let owner: Option<String> = sqlx::query_scalar("SELECT user_id FROM threads WHERE thread_id = ?")
            .bind(&t.thread_id)
            .fetch_optional(&mut *c)
            .await
            .map_err(be("read thread"))?;
        match owner {
            Some(o) if self.enforce_user_isolation && o != t.user_id => {
                Err(StoreError::Forbidden { thread_id: t.thread_id.clone() })
            }
            Some(_) => Ok(false),
            None => {
                let now = now_secs();
                sqlx::query(
                    "INSERT INTO threads (thread_id, user_id, meta, created_at, updated_at) VALUES (?, ?, '{}', ?, ?)",
                )
                .bind(&t.thread_id)
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

    async fn readable(&self, t: &ThreadRef) -> StoreResult<bool> {
        if !self.enforce_user_isolation {
            return Ok(true);
        }
        Ok(self.thread_owner(&t.thread_id).await?.is_none_or(|o| o == t.user_id))
    }

    async fn upsert_messages(c: &mut SqliteConnection, t: &ThreadRef, msgs: &[StoredMessage]) -> StoreResult<()> {
        let now = now_secs();
        for m in msgs {
            sqlx::query(
                "INSERT INTO messages (thread_id, message_id, message_data, created_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (thread_id, message_id) DO UPDATE SET message_data = excluded.message_data",
            )
            .bind(&t.thread_id)
            .bind(&m.id)
            .bind(to_text(&m.data))
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(be("write message"))?;
        }
        Ok(())
    }
}

fn thread_row(r: &sqlx::sqlite::SqliteRow) -> StoreResult<ThreadRow> {
    let meta: String = r.get("meta");
    Ok(ThreadRow {
        thread_id: r.get("thread_id"),
        user_id: r.get("user_id"),
        thread_name: r.get("thread_name"),
        meta: parse("read thread", &meta)?,
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
    })
}

#[async_trait]
impl Checkpointer for SqliteStore {
    fn isolates_users(&self) -> bool {
        self.enforce_user_isolation
    }

    async fn setup(&self) -> StoreResult<()> {
        // Several processes opening a new file at once race on the migration table (BUSY, or a
        // duplicate version row); the migrations are idempotent, so the loser retries.
        let mut attempt = 0;
        loop {
            match MIGRATOR.run(&self.pool).await {
                Ok(()) => return Ok(()),
                Err(e) if attempt < 8 => {
                    attempt += 1;
                    tracing::debug!("sqlite migration attempt {attempt} failed, retrying: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
                }
                Err(e) => return Err(StoreError::Schema(e.to_string())),
            }
        }
    }

    async fn load_with(&self, t: &ThreadRef, known: Option<KnownHead<'_>>) -> StoreResult<Option<Checkpoint>> {
        // A non-owner reads nothing (writes are what raise).
        if !self.readable(t).await? {
            return Ok(None);
        }
        let mut c = self.pool.acquire().await.map_err(be("load"))?;
        let row = sqlx::query("SELECT version, state_data FROM states WHERE thread_id = ? ORDER BY version DESC LIMIT 1")
            .bind(&t.thread_id)
            .fetch_optional(&mut *c)
            .await
            .map_err(be("load state"))?;
        let Some(row) = row else { return Ok(None) };
        let state_text: String = row.get("state_data");
        let version: i64 = row.get("version");
        let state = parse("load state", &state_text)?;
        if known.is_some_and(|k| k.matches(version, &state)) {
            return Ok(Some(Checkpoint { version, state, messages: Vec::new(), rewrite_messages: false, messages_known: true }));
        }
        let msgs: Vec<String> =
            sqlx::query_scalar("SELECT message_data FROM messages WHERE thread_id = ? ORDER BY seq")
                .bind(&t.thread_id)
                .fetch_all(&mut *c)
                .await
                .map_err(be("load messages"))?;
        Ok(Some(Checkpoint {
            version,
            state,
            messages: msgs.iter().map(|m| parse("load messages", m)).collect::<StoreResult<_>>()?,
            rewrite_messages: false,
            messages_known: false,
        }))
    }

    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "begin step").await?;
        check_fence(tx.conn(), &t.thread_id, w.fence).await?;
        self.own_thread(tx.conn(), t).await?;
        let latest: Option<(i64, Option<String>)> = sqlx::query_as(
            "SELECT version, json_extract(state_data, '$.__state_meta__.write') FROM states WHERE thread_id = ? \
             ORDER BY version DESC LIMIT 1",
        )
        .bind(&t.thread_id)
        .fetch_optional(tx.conn())
        .await
        .map_err(be("read version"))?;
        let current = latest.as_ref().map_or(0, |(v, _)| *v);
        if current != w.expected_version {
            // Dropping `tx` rolls back: nothing of this step is written.
            return Err(StoreError::Stale { thread_id: t.thread_id.clone(), expected: w.expected_version, current });
        }
        let new_version = current + 1;
        let now = now_secs();
        sqlx::query("INSERT INTO states (thread_id, version, state_data, created_at) VALUES (?, ?, ?, ?)")
            .bind(&t.thread_id)
            .bind(new_version)
            .bind(to_text(&super::chained_state(&w, latest.as_ref().and_then(|(_, m)| m.as_deref()))))
            .bind(now)
            .execute(tx.conn())
            .await
            .map_err(be("write state"))?;
        sqlx::query("DELETE FROM states WHERE thread_id = ? AND version <= ?")
            .bind(&t.thread_id)
            .bind(new_version - STATE_HISTORY)
            .execute(tx.conn())
            .await
            .map_err(be("prune states"))?;
        if w.replace_messages {
            sqlx::query("DELETE FROM messages WHERE thread_id = ?")
                .bind(&t.thread_id)
                .execute(tx.conn())
                .await
                .map_err(be("replace messages"))?;
        }
        Self::upsert_messages(tx.conn(), t, w.new_messages).await?;
        sqlx::query("UPDATE threads SET updated_at = ? WHERE thread_id = ?")
            .bind(now)
            .bind(&t.thread_id)
            .execute(tx.conn())
            .await
            .map_err(be("touch thread"))?;
        if let (true, Some(token)) = (w.release_lease, w.fence) {
            release_in(tx.conn(), &t.thread_id, token).await?;
        }
        if let Some(h) = w.in_tx {
            h.in_transaction().await.map_err(StoreError::Failpoint)?; // dropping tx rolls back
        }
        tx.commit("commit step").await?;
        Ok(new_version)
    }

    async fn clear_state(&self, t: &ThreadRef) -> StoreResult<()> {
        // Checked before BEGIN: ":memory:" has a single connection, which the transaction holds.
        if !self.readable(t).await? {
            return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
        }
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "clear state").await?;
        for q in ["DELETE FROM states WHERE thread_id = ?", "DELETE FROM messages WHERE thread_id = ?"] {
            sqlx::query(q).bind(&t.thread_id).execute(tx.conn()).await.map_err(be("clear state"))?;
        }
        tx.commit("clear state").await
    }

    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage]) -> StoreResult<()> {
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "write messages").await?;
        self.own_thread(tx.conn(), t).await?;
        Self::upsert_messages(tx.conn(), t, msgs).await?;
        if !msgs.is_empty() {
            unmark_latest(tx.conn(), t).await?;
        }
        tx.commit("write messages").await
    }

    async fn get_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<Option<Value>> {
        if !self.readable(t).await? {
            return Ok(None);
        }
        let s: Option<String> =
            sqlx::query_scalar("SELECT message_data FROM messages WHERE thread_id = ? AND message_id = ?")
                .bind(&t.thread_id)
                .bind(message_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(be("read message"))?;
        s.map(|s| parse("read message", &s)).transpose()
    }

    async fn list_messages(
        &self,
        t: &ThreadRef,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<Value>> {
        if !self.readable(t).await? {
            return Ok(vec![]);
        }
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT message_data FROM messages WHERE thread_id = ? \
             AND (? IS NULL OR instr(json_extract(message_data, '$.content'), ?) > 0) \
             ORDER BY seq LIMIT ? OFFSET ?",
        )
        .bind(&t.thread_id)
        .bind(search)
        .bind(search)
        .bind(limit.unwrap_or(-1))
        .bind(offset.unwrap_or(0).max(0))
        .fetch_all(&self.pool)
        .await
        .map_err(be("list messages"))?;
        rows.iter().map(|s| parse("list messages", s)).collect()
    }

    async fn delete_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<bool> {
        if !self.readable(t).await? {
            return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
        }
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "delete message").await?;
        let r = sqlx::query("DELETE FROM messages WHERE thread_id = ? AND message_id = ?")
            .bind(&t.thread_id)
            .bind(message_id)
            .execute(tx.conn())
            .await
            .map_err(be("delete message"))?;
        let deleted = r.rows_affected() > 0;
        if deleted {
            unmark_latest(tx.conn(), t).await?;
        }
        tx.commit("delete message").await?;
        Ok(deleted)
    }

    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "write thread").await?;
        let inserted = self.own_thread(tx.conn(), t).await?;
        sqlx::query(
            "UPDATE threads SET thread_name = COALESCE(?, thread_name), meta = ?, updated_at = ? WHERE thread_id = ?",
        )
        .bind(name)
        .bind(to_text(meta))
        .bind(now_secs())
        .bind(&t.thread_id)
        .execute(tx.conn())
        .await
        .map_err(be("write thread"))?;
        tx.commit("write thread").await?;
        Ok(inserted)
    }

    async fn get_thread(&self, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
        if !self.readable(t).await? {
            return Ok(None);
        }
        let r = sqlx::query("SELECT * FROM threads WHERE thread_id = ?")
            .bind(&t.thread_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(be("read thread"))?;
        r.as_ref().map(thread_row).transpose()
    }

    async fn list_threads(
        &self,
        user_id: Option<&str>,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<ThreadRow>> {
        let pattern = search.map(|s| format!("%{s}%"));
        let rows = sqlx::query(
            "SELECT * FROM threads WHERE (? IS NULL OR user_id = ?) \
             AND (? IS NULL OR thread_name LIKE ? OR thread_id LIKE ?) \
             ORDER BY updated_at DESC LIMIT ? OFFSET ?",
        )
        .bind(user_id)
        .bind(user_id)
        .bind(&pattern)
        .bind(&pattern)
        .bind(&pattern)
        .bind(limit.unwrap_or(-1))
        .bind(offset.unwrap_or(0).max(0))
        .fetch_all(&self.pool)
        .await
        .map_err(be("list threads"))?;
        rows.iter().map(thread_row).collect()
    }

    async fn clean_thread(&self, t: &ThreadRef) -> StoreResult<()> {
        if !self.readable(t).await? {
            return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
        }
        // Foreign keys cascade to states, messages and the ledger.
        sqlx::query("DELETE FROM threads WHERE thread_id = ?")
            .bind(&t.thread_id)
            .execute(&self.pool)
            .await
            .map_err(be("delete thread"))?;
        Ok(())
    }

    async fn thread_owner(&self, thread_id: &str) -> StoreResult<Option<String>> {
        sqlx::query_scalar("SELECT user_id FROM threads WHERE thread_id = ?")
            .bind(thread_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(be("read thread owner"))
    }

    async fn running_threads(&self, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
        let rows = sqlx::query(
            "SELECT t.thread_id, t.user_id FROM threads t JOIN states s ON s.thread_id = t.thread_id \
             WHERE s.version = (SELECT MAX(version) FROM states WHERE thread_id = t.thread_id) \
               AND json_extract(s.state_data, '$.execution_meta.status') = 'running' \
               AND (?1 IS NULL OR t.thread_id > ?1) \
             ORDER BY t.thread_id LIMIT ?2",
        )
        .bind(after)
        .bind(limit.max(0))
        .fetch_all(&self.pool)
        .await
        .map_err(be("list running threads"))?;
        Ok(rows.iter().map(|r| ThreadRef::new(r.get::<String, _>("thread_id"), r.get::<String, _>("user_id"))).collect())
    }

    async fn cache_put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()> {
        let expires = ttl.filter(|t| *t > 0.0).map(|t| now_secs() + t);
        sqlx::query(
            "INSERT INTO cache (namespace, key, value, expires_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
        )
        .bind(ns)
        .bind(key)
        .bind(to_text(value))
        .bind(expires)
        .execute(&self.pool)
        .await
        .map_err(be("cache write"))?;
        Ok(())
    }

    async fn cache_get(&self, ns: &str, key: &str) -> StoreResult<Option<Value>> {
        let s: Option<String> = sqlx::query_scalar(
            "SELECT value FROM cache WHERE namespace = ? AND key = ? AND (expires_at IS NULL OR expires_at > ?)",
        )
        .bind(ns)
        .bind(key)
        .bind(now_secs())
        .fetch_optional(&self.pool)
        .await
        .map_err(be("cache read"))?;
        s.map(|s| parse("cache read", &s)).transpose()
    }

    async fn cache_clear(&self, ns: &str, key: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM cache WHERE namespace = ? AND key = ?")
            .bind(ns)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(be("cache clear"))?;
        Ok(())
    }

    async fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(
            "SELECT key FROM cache WHERE namespace = ? AND (? IS NULL OR substr(key, 1, length(?)) = ?) \
             AND (expires_at IS NULL OR expires_at > ?) ORDER BY key",
        )
        .bind(ns)
        .bind(prefix)
        .bind(prefix)
        .bind(prefix)
        .bind(now_secs())
        .fetch_all(&self.pool)
        .await
        .map_err(be("cache keys"))
    }

    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        // One query for the whole node: the keys go in as a JSON array. A non-owner under user
        // isolation reads nothing, checked in the same query.
        let rows = sqlx::query(
            "SELECT tool_call_id, result FROM tool_executions WHERE thread_id = ?1 \
             AND tool_call_id IN (SELECT value FROM json_each(?2)) \
             AND (?3 = 0 OR NOT EXISTS (SELECT 1 FROM threads WHERE thread_id = ?1 AND user_id <> ?4))",
        )
        .bind(&t.thread_id)
        .bind(to_text(&Value::from(keys.to_vec())))
        .bind(self.enforce_user_isolation)
        .bind(&t.user_id)
        .fetch_all(&self.pool)
        .await
        .map_err(be("ledger read"))?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in rows {
            let text: String = r.get("result");
            // A row that is not JSON is "no record": the caller runs the tool.
            if let Ok(v) = serde_json::from_str(&text) {
                out.insert(r.get("tool_call_id"), v);
            }
        }
        Ok(out)
    }

    async fn ledger_put_many(&self, t: &ThreadRef, entries: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "ledger write").await?;
        check_fence(tx.conn(), &t.thread_id, fence).await?;
        self.own_thread(tx.conn(), t).await?;
        let now = now_secs();
        let mut inserted = 0;
        for (key, result) in entries {
            let r = sqlx::query(
                "INSERT INTO tool_executions (thread_id, tool_call_id, result, created_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (thread_id, tool_call_id) DO UPDATE SET result = excluded.result, created_at = excluded.created_at \
                 WHERE json_extract(tool_executions.result, '$.__kind__') = 'started' \
                   AND json_extract(excluded.result, '$.__kind__') IS NOT 'started'",
            )
            .bind(&t.thread_id)
            .bind(key)
            .bind(to_text(result))
            .bind(now)
            .execute(tx.conn())
            .await
            .map_err(be("ledger write"))?;
            inserted += r.rows_affected() as usize;
        }
        tx.commit("ledger write").await?;
        Ok(inserted)
    }

    async fn ledger_mark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "ledger write").await?;
        check_fence(tx.conn(), &t.thread_id, fence).await?;
        self.own_thread(tx.conn(), t).await?;
        let now = now_secs();
        let mut written = 0;
        for (key, mark) in marks.iter().filter(|(_, m)| is_intent(m)) {
            let r = sqlx::query(
                "UPDATE tool_executions SET result = ?, created_at = ? WHERE thread_id = ? AND tool_call_id = ? \
                 AND json_extract(result, '$.__kind__') = 'started'",
            )
            .bind(to_text(mark))
            .bind(now)
            .bind(&t.thread_id)
            .bind(key)
            .execute(tx.conn())
            .await
            .map_err(be("ledger write"))?;
            written += r.rows_affected() as usize;
        }
        tx.commit("ledger write").await?;
        Ok(written)
    }

    async fn lease_acquire(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "acquire lease").await?;
        if let Some(user) = req.user_id.as_deref().filter(|_| self.enforce_user_isolation) {
            // Inside BEGIN IMMEDIATE: no writer can create or hand over the thread in between.
            let owner: Option<String> = sqlx::query_scalar("SELECT user_id FROM threads WHERE thread_id = ?")
                .bind(thread_id)
                .fetch_optional(tx.conn())
                .await
                .map_err(be("read thread"))?;
            if owner.is_some_and(|o| o != user) {
                return Err(StoreError::Forbidden { thread_id: thread_id.to_owned() });
            }
        }
        let now = now_secs();
        let cur = sqlx::query(LEASE_COLUMNS)
            .bind(thread_id)
            .fetch_optional(tx.conn())
            .await
            .map_err(be("read lease"))?
            .map(|r| lease_info(&r, now));
        if !may_take(cur.as_ref(), req) {
            return Ok(LeaseAttempt::Held(cur.expect("may_take is true without a row")));
        }
        let token = cur.map(|c| c.token).unwrap_or(0) + 1;
        sqlx::query(
            "INSERT INTO leases (thread_id, token, holder, host, pid, pid_start, expires_at, released, acquired_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT (thread_id) DO UPDATE SET token = excluded.token, \
             holder = excluded.holder, host = excluded.host, pid = excluded.pid, pid_start = excluded.pid_start, \
             expires_at = excluded.expires_at, released = 0, acquired_at = excluded.acquired_at",
        )
        .bind(thread_id)
        .bind(token)
        .bind(&req.holder)
        .bind(&req.host)
        .bind(req.pid)
        .bind(req.pid_start)
        .bind(now + req.ttl.as_secs_f64())
        .bind(now)
        .execute(tx.conn())
        .await
        .map_err(be("acquire lease"))?;
        tx.commit("acquire lease").await?;
        Ok(LeaseAttempt::Acquired { token })
    }

    async fn lease_renew(&self, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
        let r = sqlx::query("UPDATE leases SET expires_at = ? WHERE thread_id = ? AND token = ? AND released = 0")
            .bind(now_secs() + ttl.as_secs_f64())
            .bind(thread_id)
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(be("renew lease"))?;
        Ok(r.rows_affected() > 0)
    }

    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        let mut c = self.pool.acquire().await.map_err(be("release lease"))?;
        release_in(&mut c, thread_id, token).await
    }

    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        let now = now_secs();
        Ok(sqlx::query(LEASE_COLUMNS)
            .bind(thread_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(be("read lease"))?
            .map(|r| lease_info(&r, now)))
    }

    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport> {
        let now = now_secs();
        let mut tx = WriteTx::begin(&self.pool, &self.write_gate, "prune").await?;
        let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
        // Each rule is counted with the WHERE clause it deletes with, so a dry run reports exactly
        // what the real run would remove.
        let mut plan: Vec<(String, f64)> = Vec::new();
        if let Some(keep) = rules.keep_versions {
            plan.push((
                "FROM states WHERE version <= (SELECT MAX(version) FROM states s2 WHERE s2.thread_id = states.thread_id) - ?2".into(),
                keep.max(1) as f64,
            ));
        }
        if let Some(age) = rules.finished_older_than {
            plan.push((format!("FROM threads WHERE updated_at < ?2 AND thread_id IN ({FINISHED})"), now - age));
        }
        if let Some(ttl) = rules.ledger_ttl {
            // Rows of threads the rule above deletes are counted there, not twice.
            let spared = match rules.finished_older_than {
                Some(age) => format!(" AND thread_id NOT IN (SELECT thread_id FROM threads WHERE updated_at < {})", now - age),
                None => String::new(),
            };
            plan.push((format!("FROM tool_executions WHERE created_at < ?2 AND thread_id IN ({FINISHED}){spared}"), now - ttl));
        }
        for (from, arg) in plan {
            let counted: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) {from}")))
                .bind(now)
                .bind(arg)
                .fetch_one(tx.conn())
                .await
                .map_err(be("prune"))?;
            if from.starts_with("FROM threads") {
                // The ledger rows that go with the threads (cascade) are reported too.
                let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT COUNT(*) FROM tool_executions WHERE thread_id IN (SELECT thread_id {from})"
                )))
                .bind(now)
                .bind(arg)
                .fetch_one(tx.conn())
                .await
                .map_err(be("prune"))?;
                report.threads += counted as u64;
                report.ledger_rows += rows as u64;
            } else if from.starts_with("FROM states") {
                report.state_versions += counted as u64;
            } else {
                report.ledger_rows += counted as u64;
            }
            if !rules.dry_run {
                sqlx::query(sqlx::AssertSqlSafe(format!("DELETE {from}")))
                    .bind(now)
                    .bind(arg)
                    .execute(tx.conn())
                    .await
                    .map_err(be("prune"))?;
            }
        }
        tx.commit("prune").await?;
        Ok(report)
    }

    async fn release(&self) -> StoreResult<()> {
        self.pool.close().await;
        Ok(())
    }

    async fn ledger_list(&self, t: &ThreadRef) -> StoreResult<Vec<super::LedgerEntry>> {
        if !self.readable(t).await? {
            return Ok(vec![]);
        }
        let rows = sqlx::query(
            "SELECT tool_call_id, result, created_at FROM tool_executions WHERE thread_id = ? ORDER BY created_at, rowid",
        )
        .bind(&t.thread_id)
        .fetch_all(&self.pool)
        .await
        .map_err(be("ledger list"))?;
        Ok(rows
            .iter()
            .map(|r| super::LedgerEntry {
                key: r.get("tool_call_id"),
                // Shown as malformed rather than failing the whole listing.
                result: serde_json::from_str(&r.get::<String, _>("result")).ok(),
                created_at: Some(r.get("created_at")),
            })
            .collect())
    }

    async fn state_versions(&self, t: &ThreadRef) -> StoreResult<Vec<super::StateVersion>> {
        if !self.readable(t).await? {
            return Ok(vec![]);
        }
        let rows = sqlx::query("SELECT version, state_data, created_at FROM states WHERE thread_id = ? ORDER BY version DESC")
            .bind(&t.thread_id)
            .fetch_all(&self.pool)
            .await
            .map_err(be("state versions"))?;
        rows.iter()
            .map(|r| {
                Ok(super::StateVersion {
                    version: r.get("version"),
                    created_at: Some(r.get("created_at")),
                    state: parse("state versions", &r.get::<String, _>("state_data"))?,
                })
            })
            .collect()
    }

    async fn schema_version(&self) -> StoreResult<Option<i64>> {
        sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(&self.pool)
            .await
            .map_err(be("read schema version"))
    }
}
