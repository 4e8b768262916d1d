//! PostgreSQL backend (sqlx, runtime queries: no database at build time). A durable step is one
//! call of `tenx_put_step` (one round trip, one transaction); the ledger keeps the first result
//! (`ON CONFLICT DO NOTHING`); ledger rows go with their thread (foreign key cascade). Redis, when
//! configured, serves the generic cache and stop requests; without it (or while it is down) the
//! `tenx_cache` table does.

mod cache;
mod input_lease;
mod ledger;
mod lease;
mod schema;

pub use cache::RedisCache;
pub use schema::{CURRENT_VERSION, migrate, validate_schema};

use super::{
    Checkpoint, KnownHead, Checkpointer, LeaseAttempt, LeaseInfo, LeaseRequest, PruneReport, PruneRules, StepWrite, StoreError,
    StoreResult, StoredMessage, ThreadRef, ThreadRow,
};
use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool, Row};
use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct PgOptions {
    pub schema: String,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    pub state_history_limit: i32,
    pub enforce_user_isolation: bool,
    /// Connection attempts before `TransientStorageError` (with 0.2 s, 0.4 s, ... backoff).
    pub connect_retries: u32,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: "public".into(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            state_history_limit: 20,
            enforce_user_isolation: true,
            connect_retries: 3,
        }
    }
}

pub struct PgStore {
    pool: PgPool,
    opts: PgOptions,
    sql: Sql,
    redis: Option<RedisCache>,
}

/// Statements with the (validated) schema spliced in, built once.
struct Sql {
    put_step: String,
    lock_thread: String,
    load: String,
    messages: String,
    ledger_get: String,
    ledger_put: String,
    ledger_begin: String,
    ledger_mark: String,
    lease_acquire: String,
    lease_renew: String,
    lease_release: String,
    lease_get: String,
    finished: String,
    s: String,
}

impl Sql {
    fn new(s: &str) -> Self {
        let message_json = format!(
            "COALESCE(message_data, jsonb_build_object('message_id', message_id, 'role', role::text, \
             'content', COALESCE(content, '[]')::jsonb, 'tools_calls', tool_calls, 'reasoning', reasoning, \
             'usages', NULLIF(usages, '{{}}'::jsonb), 'metadata', COALESCE(meta, '{{}}'::jsonb)))"
        );
        Sql {
            put_step: format!("SELECT {s}.tenx_put_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"),
            lock_thread: format!("SELECT {s}.tenx_lock_thread($1, $2, $3)"),
            // One round trip: the owner check, the latest state and the thread's messages as one
            // array (NULL for a row written by 10xGraph, whose context is inside the state).
            // With $4/$5 naming the row the caller still holds (KnownHead), the messages are
            // not read and `known` is true.
            load: format!(
                // The latest row is picked first (LIMIT 1 in a subquery): with the CASE on the
                // outer level it runs for that row only. At the level of the ORDER BY it ran for
                // every kept state row, and any older row made it read all the messages.
                "SELECT st.version, st.state_data, st.known, \
                   CASE WHEN jsonb_typeof(st.state_data->'context') = 'array' OR st.known THEN NULL ELSE \
                     (SELECT COALESCE(jsonb_agg(x.m ORDER BY x.seq, x.created_at), '[]'::jsonb) FROM \
                       (SELECT {message_json} AS m, seq, created_at FROM {s}.messages WHERE thread_id = $1) x) \
                   END AS msgs \
                 FROM (SELECT version, state_data, \
                         COALESCE(version = $4 AND state_data->'__state_meta__'->>'write' = $5, false) AS known \
                       FROM {s}.states WHERE thread_id = $1 \
                         AND (NOT $2 OR NOT EXISTS (SELECT 1 FROM {s}.threads th WHERE th.thread_id = $1 AND th.user_id <> $3)) \
                       ORDER BY version DESC, state_id DESC LIMIT 1) st"
            ),
            messages: format!("SELECT {message_json} AS m FROM {s}.messages WHERE thread_id = $1 ORDER BY seq, created_at"),
            // $3: the caller's user when isolation is on (NULL otherwise); a non-owner reads nothing.
            ledger_get: format!(
                "SELECT tool_call_id, result FROM {s}.tool_executions WHERE thread_id = $1 AND tool_call_id = ANY($2) \
                 AND ($3::text IS NULL OR NOT EXISTS (SELECT 1 FROM {s}.threads th WHERE th.thread_id = $1 AND th.user_id <> $3))"
            ),
            ledger_put: format!("SELECT {s}.tenx_ledger_put($1, $2, $3, $4::text[], $5::jsonb[], $6)"),
            ledger_begin: format!("SELECT * FROM {s}.tenx_ledger_begin($1, $2, $3, $4::text[], $5::jsonb[], $6, $7::text[])"),
            ledger_mark: format!("SELECT {s}.tenx_ledger_mark($1, $2, $3, $4::text[], $5::jsonb[], $6)"),
            // $8: the run's user when isolation is on (NULL otherwise). The owner check is a scalar
            // subquery, so it becomes a one-time filter evaluated before the function scan: for
            // another user's thread the function never runs (no row back, and the lease row is
            // untouched). One round trip, like the take itself. A thread created by its owner
            // between this statement's snapshot and the take is caught by the run's first write.
            lease_acquire: format!(
                "SELECT * FROM {s}.tenx_lease_acquire($1, $2, $3, $4, $5, $6, $7) \
                 WHERE (SELECT $8::text IS NULL OR NOT EXISTS \
                   (SELECT 1 FROM {s}.threads th WHERE th.thread_id = $1 AND th.user_id <> $8))"
            ),
            lease_renew: format!(
                "UPDATE {s}.tenx_leases SET expires_at = clock_timestamp() + make_interval(secs => $3) \
                 WHERE thread_id = $1 AND token = $2 AND NOT released"
            ),
            lease_release: format!(
                "UPDATE {s}.tenx_leases SET released = TRUE, expires_at = clock_timestamp() WHERE thread_id = $1 AND token = $2"
            ),
            lease_get: format!(
                "SELECT TRUE AS acquired, token, holder, host, pid, pid_start, \
                 EXTRACT(EPOCH FROM expires_at - clock_timestamp())::FLOAT8 AS expires_in, released \
                 FROM {s}.tenx_leases WHERE thread_id = $1 AND token > 0"
            ),
            finished: format!(
                "SELECT st.thread_id FROM {s}.states st \
                 WHERE st.version = (SELECT MAX(version) FROM {s}.states WHERE thread_id = st.thread_id) \
                   AND st.state_data->'execution_meta'->>'status' = 'completed' \
                   AND st.thread_id NOT IN (SELECT thread_id FROM {s}.tenx_leases WHERE NOT released AND expires_at > clock_timestamp())"
            ),
            s: s.to_owned(),
        }
    }
}

/// Maps sqlx errors: connection trouble is transient, our RAISE codes become their variants.
fn map_err(op: &'static str, e: sqlx::Error, t: Option<&ThreadRef>) -> StoreError {
    let tid = || t.map(|t| t.thread_id.clone()).unwrap_or_default();
    if let Some(db) = e.as_database_error() {
        match db.code().as_deref() {
            Some("TX001") => {
                let detail = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .and_then(|p| p.detail().map(str::to_owned))
                    .unwrap_or_default();
                let mut parts = detail.split(',').map(|x| x.trim().parse::<i64>().unwrap_or(-1));
                let (expected, current) = (parts.next().unwrap_or(-1), parts.next().unwrap_or(-1));
                return StoreError::Stale { thread_id: tid(), expected, current };
            }
            Some("TX002") => return StoreError::Forbidden { thread_id: tid() },
            Some("TX003") => return StoreError::MessageInOtherThread { message_id: String::new() },
            Some("TX004") => {
                let detail = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .and_then(|p| p.detail().map(str::to_owned))
                    .unwrap_or_default();
                let mut parts = detail.split(',').map(|x| x.trim().parse::<i64>().ok());
                let token = parts.next().flatten().unwrap_or(-1);
                return StoreError::Fenced { thread_id: tid(), token, current: parts.next().flatten() };
            }
            _ => {}
        }
    }
    if matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Tls(_))
        || e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c.starts_with("08") || c == "57P01" || c == "57P03")
    {
        return StoreError::Transient { op, message: redact(&e.to_string()) };
    }
    StoreError::Backend { op, source: redact(&e.to_string()).into() }
}

/// Never let a DSN password reach a message or a log line.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        // The credentials run to the last '@' of the line, not to the first space: a password
        // may hold spaces or '@' (unencoded, as users paste them), and the host never has '@'.
        let line_end = rest.find('\n').unwrap_or(rest.len());
        let end = match rest[..line_end].rfind('@') {
            Some(at) => at + rest[at..line_end].find(|c: char| c.is_whitespace() || c == '"' || c == '\'').unwrap_or(line_end - at),
            None => rest.find(|c: char| c.is_whitespace() || c == '"' || c == '\'').unwrap_or(rest.len()),
        };
        let token = &rest[..end];
        match token.rfind('@') {
            Some(at) => {
                let cred = &token[..at];
                match cred.find(':') {
                    Some(colon) => {
                        out.push_str(&cred[..colon]);
                        out.push_str(":***");
                    }
                    None => out.push_str(cred),
                }
                out.push_str(&token[at..]);
            }
            None => out.push_str(token),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn message_rows(msgs: &[StoredMessage]) -> Value {
    Value::Array(
        msgs.iter()
            .map(|m| {
                let mut v = m.data.clone();
                if let Some(o) = v.as_object_mut() {
                    // The row's key is the id the engine tracks, whatever type the JSON used.
                    o.insert("message_id".into(), Value::String(m.id.clone()));
                }
                strip_nul(&mut v);
                v
            })
            .collect(),
    )
}

/// PostgreSQL rejects U+0000 in text and jsonb, and model output can contain it: it is stored as
/// U+FFFD. That changes the data, so it is never silent: a warning and a counter.
fn strip_nul(v: &mut Value) {
    fn walk(v: &mut Value) -> usize {
        match v {
            Value::String(s) if s.contains('\0') => {
                let n = s.matches('\0').count();
                *s = s.replace('\0', "\u{FFFD}");
                n
            }
            Value::Array(a) => a.iter_mut().map(walk).sum(),
            Value::Object(o) => o.values_mut().map(walk).sum(),
            _ => 0,
        }
    }
    let replaced = walk(v);
    if replaced > 0 {
        crate::metrics::inc(&crate::metrics::metrics().nul_replaced);
        tracing::warn!(
            event = "nul_replaced",
            "{replaced} NUL character(s) stored as U+FFFD: PostgreSQL cannot store U+0000 in text or jsonb"
        );
    }
}

impl PgStore {
    /// Connects (retrying with backoff) and migrates. `redis_url` is optional.
    pub async fn connect(dsn: &str, redis_url: Option<&str>, opts: PgOptions) -> StoreResult<Self> {
        validate_schema(&opts.schema)?;
        let connect = PgConnectOptions::from_str(dsn)
            .map_err(|e| StoreError::InvalidInput(format!("invalid postgres_dsn: {}", redact(&e.to_string()))))?
            .application_name("tenxgraph");
        // Probe with one plain connection first: a pool retries a refused connection until its
        // acquire timeout and then reports only "timed out", hiding the cause.
        let mut attempt = 0;
        loop {
            let probe = tokio::time::timeout(opts.acquire_timeout, <sqlx::PgConnection as sqlx::Connection>::connect_with(&connect)).await;
            let err = match probe {
                Ok(Ok(c)) => {
                    let _ = sqlx::Connection::close(c).await;
                    break;
                }
                Ok(Err(e)) => map_err("connect", e, None),
                Err(_) => StoreError::Transient { op: "connect", message: "timed out".into() },
            };
            attempt += 1;
            if !matches!(err, StoreError::Transient { .. }) || attempt >= opts.connect_retries.max(1) {
                return Err(err);
            }
            tracing::warn!("postgres connect failed (attempt {attempt}), retrying: {err}");
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
        }
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections)
            .acquire_timeout(opts.acquire_timeout)
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    // A killed client's transaction must end, not wait for a lock and commit
                    // later: let the server notice dead clients (PostgreSQL 14+; older servers
                    // reject the setting, which is then skipped).
                    let _ = sqlx::Executor::execute(&mut *conn, "SET client_connection_check_interval = 1000").await;
                    Ok(())
                })
            })
            .connect_with(connect.clone())
            .await
            .map_err(|e| map_err("connect", e, None))?;
        migrate(&pool, &opts.schema).await?;
        let redis = match redis_url {
            Some(url) => Some(RedisCache::connect(url).await?),
            None => None,
        };
        let sql = Sql::new(&opts.schema);
        Ok(PgStore { pool, opts, sql, redis })
    }

    pub fn set_cache_ttl(&mut self, ttl: Duration) {
        if let Some(r) = self.redis.as_mut() {
            r.state_ttl = ttl;
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn q(&self, sql: String) -> AssertSqlSafe<String> {
        AssertSqlSafe(sql)
    }

    async fn readable(&self, t: &ThreadRef) -> StoreResult<bool> {
        if !self.opts.enforce_user_isolation {
            return Ok(true);
        }
        Ok(self.thread_owner(&t.thread_id).await?.is_none_or(|o| o == t.user_id))
    }

    /// Messages changed outside a step: the latest state row no longer describes them (see
    /// `clear_write_mark`).
    async fn unmark_latest(&self, tx: &mut sqlx::PgConnection, t: &ThreadRef) -> StoreResult<()> {
        let s = &self.sql.s;
        sqlx::query(self.q(format!(
            "UPDATE {s}.states SET state_data = jsonb_set(state_data, '{{__state_meta__}}', \
               COALESCE(state_data->'__state_meta__', '{{}}'::jsonb) || jsonb_build_object('write', $2::text)) \
             WHERE thread_id = $1 AND version = (SELECT MAX(version) FROM {s}.states WHERE thread_id = $1)"
        )))
        .bind(&t.thread_id)
        .bind(super::MESSAGES_CHANGED)
        .execute(&mut *tx)
        .await
        .map_err(|e| map_err("write messages", e, Some(t)))?;
        Ok(())
    }

    /// Ensures and locks the thread row inside `tx`, checking the owner.
    async fn lock_thread(&self, tx: &mut sqlx::PgConnection, t: &ThreadRef, op: &'static str) -> StoreResult<()> {
        sqlx::query(AssertSqlSafe(self.sql.lock_thread.clone()))
            .bind(&t.thread_id)
            .bind(&t.user_id)
            .bind(self.opts.enforce_user_isolation)
            .execute(tx)
            .await
            .map_err(|e| map_err(op, e, Some(t)))?;
        Ok(())
    }

    /// Runs the PG fallback for the cache when Redis is absent or failing.
    fn redis(&self) -> Option<&RedisCache> {
        self.redis.as_ref().filter(|r| r.is_up())
    }
}

#[async_trait]
impl Checkpointer for PgStore {
    fn isolates_users(&self) -> bool {
        self.opts.enforce_user_isolation
    }

    async fn setup(&self) -> StoreResult<()> {
        migrate(&self.pool, &self.opts.schema).await
    }

    async fn load_with(&self, t: &ThreadRef, known: Option<KnownHead<'_>>) -> StoreResult<Option<Checkpoint>> {
        let row = sqlx::query(AssertSqlSafe(self.sql.load.clone()))
            .bind(&t.thread_id)
            .bind(self.opts.enforce_user_isolation)
            .bind(&t.user_id)
            .bind(known.map(|k| k.version))
            .bind(known.map(|k| k.mark))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| map_err("load", e, Some(t)))?;
        // A non-owner reads nothing (writes are what raise).
        let Some(row) = row else { return Ok(None) };
        let mut state: Value = row.get("state_data");
        let messages_known: bool = row.get("known");
        // A row written by 10xGraph carries the whole context; ours keeps messages in their rows.
        let legacy_context = state.as_object_mut().and_then(|o| o.remove("context"));
        let (messages, rewrite_messages) = match (legacy_context, row.get::<Option<Value>, _>("msgs")) {
            (Some(Value::Array(ctx)), _) => (ctx, true),
            (_, Some(Value::Array(msgs))) => (msgs, false),
            _ => (Vec::new(), false),
        };
        Ok(Some(Checkpoint { version: row.get("version"), state, messages, rewrite_messages, messages_known }))
    }

    async fn put_input_leased(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<crate::store::StopKey<'_>>,
    ) -> StoreResult<crate::store::LeasedInput> {
        self.input_leased(t, req, w, stop).await
    }

    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        let mut state = w.state.clone();
        strip_nul(&mut state);
        let step = sqlx::query_scalar(AssertSqlSafe(self.sql.put_step.clone()))
            .bind(&t.thread_id)
            .bind(&t.user_id)
            .bind(w.expected_version)
            .bind(&state)
            .bind(message_rows(w.new_messages))
            .bind(w.replace_messages)
            .bind(self.opts.state_history_limit)
            .bind(self.opts.enforce_user_isolation)
            .bind(w.fence)
            .bind(w.release_lease)
            .bind(w.previous_mark);
        let r: Result<i64, sqlx::Error> = match w.in_tx {
            None => step.fetch_one(&self.pool).await,
            // Armed failpoint: an explicit transaction, so the hook runs before COMMIT.
            Some(h) => {
                let mut tx = self.pool.begin().await.map_err(|e| map_err("write step", e, Some(t)))?;
                let v = step.fetch_one(&mut *tx).await;
                if v.is_ok() {
                    h.in_transaction().await.map_err(StoreError::Failpoint)?;
                    tx.commit().await.map_err(|e| map_err("write step", e, Some(t)))?;
                }
                v
            }
        };
        match r {
            Ok(v) => Ok(v),
            Err(e) => {
                let err = map_err("write step", e, Some(t));
                if matches!(err, StoreError::Stale { .. }) {
                    if let Some(r) = self.redis() {
                        r.clear_state_cache(t).await; // a conflicting writer's cache must not be trusted
                    }
                }
                Err(err)
            }
        }
    }

    async fn clear_state(&self, t: &ThreadRef) -> StoreResult<()> {
        if !self.readable(t).await? {
            return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
        }
        let s = &self.sql.s;
        let mut tx = self.pool.begin().await.map_err(|e| map_err("clear state", e, Some(t)))?;
        for q in [format!("DELETE FROM {s}.states WHERE thread_id = $1"), format!("DELETE FROM {s}.messages WHERE thread_id = $1")] {
            sqlx::query(self.q(q)).bind(&t.thread_id).execute(&mut *tx).await.map_err(|e| map_err("clear state", e, Some(t)))?;
        }
        tx.commit().await.map_err(|e| map_err("clear state", e, Some(t)))
    }

    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage]) -> StoreResult<()> {
        // Outside a step (no new state version): the same upsert, under the thread lock.
        let mut tx = self.pool.begin().await.map_err(|e| map_err("write messages", e, Some(t)))?;
        self.lock_thread(&mut tx, t, "write messages").await?;
        sqlx::query(self.q(format!("SELECT {}.tenx_upsert_messages($1, $2)", self.sql.s)))
            .bind(&t.thread_id)
            .bind(message_rows(msgs))
            .execute(&mut *tx)
            .await
            .map_err(|e| map_err("write messages", e, Some(t)))?;
        if !msgs.is_empty() {
            self.unmark_latest(&mut tx, t).await?;
        }
        tx.commit().await.map_err(|e| map_err("write messages", e, Some(t)))
    }

    async fn get_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<Option<Value>> {
        if !self.readable(t).await? {
            return Ok(None);
        }
        let q = self.sql.messages.replace("WHERE thread_id = $1", "WHERE thread_id = $1 AND message_id = $2");
        sqlx::query_scalar(self.q(q))
            .bind(&t.thread_id)
            .bind(message_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| map_err("read message", e, Some(t)))
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
        let q = self.sql.messages.replace(
            "WHERE thread_id = $1",
            "WHERE thread_id = $1 AND ($2::text IS NULL OR strpos(COALESCE(message_data->>'content', content), $2) > 0)",
        ) + " OFFSET $3 LIMIT $4";
        sqlx::query_scalar(self.q(q))
            .bind(&t.thread_id)
            .bind(search)
            .bind(offset.unwrap_or(0).max(0))
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_err("list messages", e, Some(t)))
    }

    async fn delete_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<bool> {
        if !self.readable(t).await? {
            return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
        }
        let mut tx = self.pool.begin().await.map_err(|e| map_err("delete message", e, Some(t)))?;
        let r = sqlx::query(self.q(format!("DELETE FROM {}.messages WHERE thread_id = $1 AND message_id = $2", self.sql.s)))
            .bind(&t.thread_id)
            .bind(message_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| map_err("delete message", e, Some(t)))?;
        let deleted = r.rows_affected() > 0;
        if deleted {
            self.unmark_latest(&mut tx, t).await?;
        }
        tx.commit().await.map_err(|e| map_err("delete message", e, Some(t)))?;
        Ok(deleted)
    }

    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
        let s = &self.sql.s;
        let mut tx = self.pool.begin().await.map_err(|e| map_err("write thread", e, Some(t)))?;
        let existed: bool = sqlx::query_scalar(self.q(format!("SELECT EXISTS (SELECT 1 FROM {s}.threads WHERE thread_id = $1)")))
            .bind(&t.thread_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| map_err("write thread", e, Some(t)))?;
        self.lock_thread(&mut tx, t, "write thread").await?;
        sqlx::query(self.q(format!(
            "UPDATE {s}.threads SET thread_name = COALESCE($2, thread_name), meta = $3, updated_at = NOW() WHERE thread_id = $1"
        )))
        .bind(&t.thread_id)
        .bind(name)
        .bind(meta)
        .execute(&mut *tx)
        .await
        .map_err(|e| map_err("write thread", e, Some(t)))?;
        tx.commit().await.map_err(|e| map_err("write thread", e, Some(t)))?;
        Ok(!existed)
    }

    async fn get_thread(&self, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
        if !self.readable(t).await? {
            return Ok(None);
        }
        let rows = self.threads_query("WHERE thread_id = $1", Some(&t.thread_id), None, None, None).await?;
        Ok(rows.into_iter().next())
    }

    async fn list_threads(
        &self,
        user_id: Option<&str>,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<ThreadRow>> {
        self.threads_query(
            "WHERE ($1::text IS NULL OR user_id = $1) AND ($2::text IS NULL OR thread_name ILIKE $2 OR thread_id ILIKE $2)",
            user_id,
            search.map(|s| format!("%{s}%")),
            offset,
            limit,
        )
        .await
    }

    async fn clean_thread(&self, t: &ThreadRef) -> StoreResult<()> {
        if !self.readable(t).await? {
            return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
        }
        sqlx::query(self.q(format!("DELETE FROM {}.threads WHERE thread_id = $1", self.sql.s)))
            .bind(&t.thread_id)
            .execute(&self.pool)
            .await
            .map_err(|e| map_err("delete thread", e, Some(t)))?;
        if let Some(r) = self.redis() {
            r.clear_state_cache(t).await;
        }
        Ok(())
    }

    async fn thread_owner(&self, thread_id: &str) -> StoreResult<Option<String>> {
        sqlx::query_scalar(self.q(format!("SELECT user_id FROM {}.threads WHERE thread_id = $1", self.sql.s)))
            .bind(thread_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| map_err("read thread owner", e, None))
    }

    async fn running_threads(&self, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
        // One index lookup (thread_id, version DESC) per thread for its latest row.
        let rows = sqlx::query(self.q(format!(
            "SELECT t.thread_id, t.user_id FROM {s}.threads t \
             CROSS JOIN LATERAL (SELECT state_data FROM {s}.states st WHERE st.thread_id = t.thread_id \
                                 ORDER BY version DESC, state_id DESC LIMIT 1) st \
             WHERE st.state_data->'execution_meta'->>'status' = 'running' \
               AND ($1::text IS NULL OR t.thread_id > $1) \
             ORDER BY t.thread_id LIMIT $2",
            s = self.sql.s
        )))
        .bind(after)
        .bind(limit.max(0))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| map_err("list running threads", e, None))?;
        Ok(rows.iter().map(|r| ThreadRef::new(r.get::<String, _>("thread_id"), r.get::<String, _>("user_id"))).collect())
    }

    async fn cache_put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()> {
        if let Some(r) = self.redis() {
            if r.put(ns, key, value, ttl).await {
                return Ok(());
            }
        }
        sqlx::query(self.q(format!(
            "INSERT INTO {}.tenx_cache (namespace, key, value, expires_at) VALUES ($1, $2, $3, \
             CASE WHEN $4::float8 IS NULL THEN NULL ELSE NOW() + make_interval(secs => $4::float8) END) \
             ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at",
            self.sql.s
        )))
        .bind(ns)
        .bind(key)
        .bind(value)
        .bind(ttl.filter(|t| *t > 0.0))
        .execute(&self.pool)
        .await
        .map_err(|e| map_err("cache write", e, None))?;
        Ok(())
    }

    async fn cache_get(&self, ns: &str, key: &str) -> StoreResult<Option<Value>> {
        if let Some(r) = self.redis() {
            if let Some(Some(found)) = r.get(ns, key).await {
                return Ok(Some(found));
            }
        }
        sqlx::query_scalar(self.q(format!(
            "SELECT value FROM {}.tenx_cache WHERE namespace = $1 AND key = $2 AND (expires_at IS NULL OR expires_at > NOW())",
            self.sql.s
        )))
        .bind(ns)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| map_err("cache read", e, None))
    }

    async fn cache_clear(&self, ns: &str, key: &str) -> StoreResult<()> {
        if let Some(r) = self.redis() {
            r.clear(ns, key).await;
        }
        // Always clear the table too: a value written while Redis was down lives there.
        sqlx::query(self.q(format!("DELETE FROM {}.tenx_cache WHERE namespace = $1 AND key = $2", self.sql.s)))
            .bind(ns)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(|e| map_err("cache clear", e, None))?;
        Ok(())
    }

    async fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
        let mut keys: Vec<String> = sqlx::query_scalar(self.q(format!(
            "SELECT key FROM {}.tenx_cache WHERE namespace = $1 AND ($2::text IS NULL OR starts_with(key, $2)) \
             AND (expires_at IS NULL OR expires_at > NOW())",
            self.sql.s
        )))
        .bind(ns)
        .bind(prefix)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| map_err("cache keys", e, None))?;
        if let Some(r) = self.redis() {
            keys.extend(r.keys(ns, prefix).await);
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    async fn state_cache_put(&self, t: &ThreadRef, version: i64, state: &Value) -> StoreResult<bool> {
        let via_redis = match self.redis() {
            Some(r) => r.put_state(t, version, state).await,
            None => None,
        };
        match via_redis {
            Some(written) => Ok(written),
            // Without Redis (or while it is down) the cache table serves, with the same guard.
            _ => super::generic_state_cache::put(self, t, version, state).await,
        }
    }

    async fn state_cache_get(&self, t: &ThreadRef) -> StoreResult<Option<(i64, Value)>> {
        if let Some(hit) = match self.redis() {
            Some(r) => r.get_state(t).await,
            None => None,
        } {
            return Ok(Some(hit));
        }
        super::generic_state_cache::get(self, t).await
    }

    async fn state_cache_clear(&self, t: &ThreadRef) -> StoreResult<()> {
        if let Some(r) = self.redis() {
            r.clear_state_cache(t).await;
        }
        self.cache_clear("state_cache", &super::generic_state_cache::key(t)).await
    }

    async fn legacy_state_cache(&self, t: &ThreadRef) -> super::LegacyCache {
        match self.redis() {
            Some(r) => r.get_legacy_state(t).await,
            None => super::LegacyCache::Absent,
        }
    }

    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        self.ledger_read(t, keys).await
    }

    async fn ledger_put_many(&self, t: &ThreadRef, entries: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        self.ledger_write(t, entries, fence).await
    }

    async fn ledger_mark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        self.ledger_remark(t, marks, fence).await
    }

    async fn ledger_begin(
        &self,
        t: &ThreadRef,
        intents: &[(String, Value)],
        also_read: &[String],
        fence: Option<i64>,
    ) -> StoreResult<(HashMap<String, Value>, Result<(), StoreError>)> {
        self.ledger_start(t, intents, also_read, fence).await
    }

    async fn lease_acquire(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        self.lease_take(thread_id, req).await
    }

    async fn lease_renew(&self, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
        self.lease_extend(thread_id, token, ttl).await
    }

    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        self.lease_free(thread_id, token).await
    }

    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        self.lease_read(thread_id).await
    }

    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport> {
        let s = &self.sql.s;
        let finished = &self.sql.finished;
        let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
        let mut tx = self.pool.begin().await.map_err(|e| map_err("prune", e, None))?;
        // Each rule is counted with the WHERE clause it deletes with, so a dry run reports exactly
        // what the real run would remove.
        let mut plan: Vec<(&str, String, f64)> = Vec::new();
        if let Some(keep) = rules.keep_versions {
            plan.push((
                "states",
                format!("FROM {s}.states WHERE version <= (SELECT MAX(version) FROM {s}.states s2 WHERE s2.thread_id = {s}.states.thread_id) - CAST($1 AS BIGINT)"),
                keep.max(1) as f64,
            ));
        }
        if let Some(age) = rules.finished_older_than {
            plan.push((
                "threads",
                format!("FROM {s}.threads WHERE updated_at < clock_timestamp() - make_interval(secs => $1) AND thread_id IN ({finished})"),
                age,
            ));
        }
        if let Some(ttl) = rules.ledger_ttl {
            plan.push((
                "ledger",
                // Rows of threads the rule above deletes are counted there, not twice.
                format!(
                    "FROM {s}.tool_executions WHERE created_at < clock_timestamp() - make_interval(secs => $1) \
                     AND thread_id IN ({finished}){}",
                    rules.finished_older_than.map_or(String::new(), |age| format!(
                        " AND thread_id NOT IN (SELECT thread_id FROM {s}.threads \
                         WHERE updated_at < clock_timestamp() - make_interval(secs => {age}::float8))"
                    ))
                ),
                ttl,
            ));
        }
        for (what, from, arg) in plan {
            let counted: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) {from}")))
                .bind(arg)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| map_err("prune", e, None))?;
            match what {
                "states" => report.state_versions += counted as u64,
                "threads" => {
                    report.threads += counted as u64;
                    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                        "SELECT COUNT(*) FROM {s}.tool_executions WHERE thread_id IN (SELECT thread_id {from})"
                    )))
                    .bind(arg)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| map_err("prune", e, None))?;
                    report.ledger_rows += rows as u64;
                }
                _ => report.ledger_rows += counted as u64,
            }
            if !rules.dry_run {
                sqlx::query(AssertSqlSafe(format!("DELETE {from}")))
                    .bind(arg)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| map_err("prune", e, None))?;
            }
        }
        tx.commit().await.map_err(|e| map_err("prune", e, None))?;
        Ok(report)
    }

    async fn release(&self) -> StoreResult<()> {
        self.pool.close().await;
        Ok(())
    }

    async fn ledger_list(&self, t: &ThreadRef) -> StoreResult<Vec<super::LedgerEntry>> {
        self.ledger_rows_of(t).await
    }

    async fn state_versions(&self, t: &ThreadRef) -> StoreResult<Vec<super::StateVersion>> {
        if !self.readable(t).await? {
            return Ok(vec![]);
        }
        let rows = sqlx::query(self.q(format!(
            "SELECT version, state_data, EXTRACT(EPOCH FROM created_at)::float8 AS created_at \
             FROM {}.states WHERE thread_id = $1 ORDER BY version DESC, state_id DESC",
            self.sql.s
        )))
        .bind(&t.thread_id)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| map_err("state versions", e, Some(t)))?;
        Ok(rows
            .iter()
            .map(|r| {
                let mut state: Value = r.get("state_data");
                // A row 10xGraph wrote carries the whole context; a version listing wants the rest.
                if let Some(o) = state.as_object_mut() {
                    o.remove("context");
                }
                super::StateVersion { version: r.get("version"), created_at: r.get("created_at"), state }
            })
            .collect())
    }

    async fn schema_version(&self) -> StoreResult<Option<i64>> {
        sqlx::query_scalar(self.q(format!("SELECT MAX(version)::int8 FROM {}.schema_version", self.sql.s)))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_err("read schema version", e, None))
    }
}

impl PgStore {
    async fn threads_query(
        &self,
        filter: &str,
        a: Option<&str>,
        b: Option<String>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<ThreadRow>> {
        let q = format!(
            "SELECT thread_id, user_id, thread_name, COALESCE(meta, '{{}}'::jsonb) AS meta, \
             EXTRACT(EPOCH FROM created_at)::float8 AS created_at, EXTRACT(EPOCH FROM updated_at)::float8 AS updated_at \
             FROM {}.threads {filter} ORDER BY updated_at DESC OFFSET $3 LIMIT $4",
            self.sql.s
        );
        let rows = sqlx::query(self.q(q))
            .bind(a)
            .bind(b)
            .bind(offset.unwrap_or(0).max(0))
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_err("read threads", e, None))?;
        Ok(rows
            .iter()
            .map(|r| ThreadRow {
                thread_id: r.get("thread_id"),
                user_id: r.get("user_id"),
                thread_name: r.get("thread_name"),
                meta: r.get("meta"),
                created_at: r.get::<Option<f64>, _>("created_at").unwrap_or(0.0),
                updated_at: r.get::<Option<f64>, _>("updated_at").unwrap_or(0.0),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgresql://app:s3cret@db:5432/x failed"), "postgresql://app:***@db:5432/x failed");
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact("no url here"), "no url here");
        assert_eq!(redact("postgresql://app@db/x"), "postgresql://app@db/x");
        assert_eq!(redact("postgresql://app:pa ss@db/x failed"), "postgresql://app:***@db/x failed");
        assert_eq!(redact("postgresql://app:p@ss w@db/x: bad"), "postgresql://app:***@db/x: bad");
    }
}
