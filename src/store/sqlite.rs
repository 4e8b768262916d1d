//! Embedded SQLite backend (sqlx). WAL, `BEGIN IMMEDIATE` for every read-then-write transaction so
//! two processes on one file serialise instead of failing with BUSY_SNAPSHOT.

use super::{
    Checkpoint, Checkpointer, StepWrite, StoreError, StoreResult, StoredMessage, ThreadRef, ThreadRow,
    now_secs,
};
use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqliteConnection};
use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
const STATE_HISTORY: i64 = 20;

/// A `BEGIN IMMEDIATE` transaction on a pooled connection, ended by hand. sqlx's own Transaction
/// keeps counting a transaction whose COMMIT failed (e.g. disk full), and that connection then
/// refuses every later BEGIN, so a thread could never be resumed after the disk was freed. Here a
/// transaction that did not commit is rolled back before its connection is reused, and a
/// connection that cannot even roll back is closed.
struct WriteTx {
    conn: Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>,
}

impl WriteTx {
    async fn begin(pool: &SqlitePool, op: &'static str) -> StoreResult<Self> {
        let mut conn = pool.acquire().await.map_err(be(op))?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await.map_err(be(op))?;
        Ok(WriteTx { conn: Some(conn) })
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
        let memory = path == ":memory:";
        let url = if memory { "sqlite::memory:".to_owned() } else { format!("sqlite://{path}") };
        let opts = SqliteConnectOptions::from_str(&url)
            .map_err(be("open"))?
            .create_if_missing(true)
            .journal_mode(if memory { SqliteJournalMode::Memory } else { SqliteJournalMode::Wal })
            .busy_timeout(Duration::from_secs(10))
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
        let pool = pool_opts.connect_with(opts).await.map_err(be("connect"))?;
        Ok(Self { pool, enforce_user_isolation })
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

    async fn load(&self, t: &ThreadRef) -> StoreResult<Option<Checkpoint>> {
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
        let msgs: Vec<String> =
            sqlx::query_scalar("SELECT message_data FROM messages WHERE thread_id = ? ORDER BY seq")
                .bind(&t.thread_id)
                .fetch_all(&mut *c)
                .await
                .map_err(be("load messages"))?;
        Ok(Some(Checkpoint {
            version: row.get("version"),
            state: parse("load state", &state_text)?,
            messages: msgs.iter().map(|m| parse("load messages", m)).collect::<StoreResult<_>>()?,
            rewrite_messages: false,
        }))
    }

    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        let mut tx = WriteTx::begin(&self.pool, "begin step").await?;
        self.own_thread(tx.conn(), t).await?;
        let current: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM states WHERE thread_id = ?")
            .bind(&t.thread_id)
            .fetch_one(tx.conn())
            .await
            .map_err(be("read version"))?;
        if current != w.expected_version {
            // Dropping `tx` rolls back: nothing of this step is written.
            return Err(StoreError::Stale { thread_id: t.thread_id.clone(), expected: w.expected_version, current });
        }
        let new_version = current + 1;
        let now = now_secs();
        sqlx::query("INSERT INTO states (thread_id, version, state_data, created_at) VALUES (?, ?, ?, ?)")
            .bind(&t.thread_id)
            .bind(new_version)
            .bind(to_text(w.state))
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
        let mut tx = WriteTx::begin(&self.pool, "clear state").await?;
        for q in ["DELETE FROM states WHERE thread_id = ?", "DELETE FROM messages WHERE thread_id = ?"] {
            sqlx::query(q).bind(&t.thread_id).execute(tx.conn()).await.map_err(be("clear state"))?;
        }
        tx.commit("clear state").await
    }

    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage]) -> StoreResult<()> {
        let mut tx = WriteTx::begin(&self.pool, "write messages").await?;
        self.own_thread(tx.conn(), t).await?;
        Self::upsert_messages(tx.conn(), t, msgs).await?;
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
        let r = sqlx::query("DELETE FROM messages WHERE thread_id = ? AND message_id = ?")
            .bind(&t.thread_id)
            .bind(message_id)
            .execute(&self.pool)
            .await
            .map_err(be("delete message"))?;
        Ok(r.rows_affected() > 0)
    }

    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
        let mut tx = WriteTx::begin(&self.pool, "write thread").await?;
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
        // One query for the whole node: the keys go in as a JSON array.
        let rows = sqlx::query(
            "SELECT tool_call_id, result FROM tool_executions WHERE thread_id = ? \
             AND tool_call_id IN (SELECT value FROM json_each(?))",
        )
        .bind(&t.thread_id)
        .bind(to_text(&Value::from(keys.to_vec())))
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

    async fn ledger_put_many(&self, t: &ThreadRef, entries: &[(String, Value)]) -> StoreResult<usize> {
        let mut tx = WriteTx::begin(&self.pool, "ledger write").await?;
        self.own_thread(tx.conn(), t).await?;
        let now = now_secs();
        let mut inserted = 0;
        for (key, result) in entries {
            let r = sqlx::query(
                "INSERT INTO tool_executions (thread_id, tool_call_id, result, created_at) VALUES (?, ?, ?, ?) \
                 ON CONFLICT (thread_id, tool_call_id) DO NOTHING",
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
