//! Opening a store: the DSN checked, the server probed with retries, the pool built, the schema
//! migrated, Redis attached.

use super::errors::{map_err, redact};
use super::ident::quote_schema;
use super::{PgOptions, PgStore, RedisCache, Sql, migrate};
use crate::store::{StoreError, StoreResult};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};
use std::str::FromStr;
use std::time::Duration;

impl PgStore {
    /// Connects (retrying a refused or timed-out connection `connect_retries` times with backoff)
    /// and migrates to `CURRENT_VERSION`; `redis_url` is optional, and an unreachable Redis is not
    /// an error. A bad schema name or DSN is `StoreError::InvalidInput` before anything is
    /// created; an unreachable server after the retries is `StoreError::Transient`. No message
    /// carries the DSN's password.
    pub async fn connect(dsn: &str, redis_url: Option<&str>, opts: PgOptions) -> StoreResult<Self> {
        let schema = quote_schema(&opts.schema)?;
        let mut connect = PgConnectOptions::from_str(dsn)
            .map_err(|e| StoreError::InvalidInput(format!("invalid postgres_dsn: {}", redact(&e.to_string()))))?;
        // The user's own `application_name` in the DSN is how their monitoring tells services
        // apart: it is kept, and only a DSN without one is labelled ours.
        if connect.get_application_name().is_none() {
            connect = connect.application_name("tenxgraph");
        }
        // Probe with one plain connection first: a pool retries a refused connection until its
        // acquire timeout and then reports only "timed out", hiding the cause.
        let mut attempt = 0;
        loop {
            let probe = tokio::time::timeout(
                opts.acquire_timeout,
                <sqlx::PgConnection as sqlx::Connection>::connect_with(&connect),
            )
            .await;
            let err = match probe {
                Ok(Ok(c)) => {
                    let _ = sqlx::Connection::close(c).await;
                    break;
                }
                Ok(Err(e)) => map_err("connect", e, None),
                Err(_) => {
                    StoreError::Transient { op: "connect", message: "the database is unreachable: timed out".into() }
                }
            };
            attempt += 1;
            if !matches!(err, StoreError::Transient { .. }) || attempt >= opts.connect_retries.max(1) {
                return Err(err);
            }
            tracing::warn!("postgres connect failed (attempt {attempt}), retrying: {err}");
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
        }
        // The server's halves of the deadline (the client's is `Conns::deadline`): a lock wait
        // ends (a row held by a frozen session means busy, not wait for ever), and so does a
        // transaction a frozen client left open, with its locks. A statement ends on the server
        // before the client gives up on it (`server_deadline`): a step, input or ledger write
        // waiting for a row lock (they wait past `lock_timeout`, migration 12) committed after
        // the client had reported STORAGE_TRANSIENT_001, "nothing was written". A lower
        // `statement_timeout` of the role or database is kept. The migration and a dry-run prune
        // lift it for their own transactions (they may rightly run for minutes).
        let ms = |d: Duration| d.as_millis().max(1);
        let statement_ms = ms(server_deadline(opts.statement_deadline));
        let server_limits = format!(
            "SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}; \
             SELECT current_setting('transaction_read_only'); \
             SELECT set_config('statement_timeout', CASE WHEN s.setting::bigint BETWEEN 1 AND {statement_ms} \
             THEN s.setting ELSE '{statement_ms}' END, false) FROM pg_settings s WHERE s.name = 'statement_timeout'",
            ms(opts.lock_wait),
            ms(opts.statement_deadline * 2)
        );
        let release_deadline = opts.statement_deadline;
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections)
            .acquire_timeout(opts.acquire_timeout)
            .after_connect(move |conn, _meta| {
                let server_limits = server_limits.clone();
                Box::pin(async move {
                    // A killed client's transaction must end, not wait for a lock and commit
                    // later: let the server notice dead clients (PostgreSQL 14+; older servers
                    // reject the setting, which is then skipped).
                    let _ = sqlx::Executor::execute(&mut *conn, "SET client_connection_check_interval = 1000").await;
                    // In the same round trip: whether the session is read-only (a standby, or a
                    // database set read-only), which it stays for life (read_only.rs).
                    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(server_limits)).fetch_all(&mut *conn).await?;
                    let read_only = rows.first().and_then(|r| r.try_get::<String, _>(0).ok());
                    if read_only.as_deref() == Some("on") {
                        super::read_only::note_read_only_session();
                    }
                    Ok(())
                })
            })
            // A session opened before the server refused a write as read-only may still be
            // read-only: closed instead of handed out or kept (read_only.rs).
            .before_acquire(|_conn, meta| Box::pin(async move { Ok(!super::read_only::retired(meta.age)) }))
            .after_release(move |conn, meta| {
                Box::pin(async move {
                    if super::read_only::retired(meta.age) {
                        return Ok(false);
                    }
                    // A statement dropped mid-flight (`PgStore::bounded` gave up on it, or its run
                    // was cancelled) left the connection waiting for its ReadyForQuery, and a
                    // dropped transaction its ROLLBACK queued too; sqlx's own ping on return has no
                    // deadline: on a network that stopped answering it would hold the pool slot
                    // until TCP gives up. `should_flush` only sees the queued ROLLBACK (the write
                    // buffer), not a plain statement or a BEGIN dropped in flight (empty write
                    // buffer, reply pending), so every release is pinged here within the deadline;
                    // past it the connection is closed hard (an `Err` here), and the slot freed.
                    // Costs one round trip more per release (sqlx pings again after this).
                    // A ping that failed (the server ended the session: a restart, an
                    // administrator's terminate) closes the connection without a word of sqlx's
                    // ("error from `after_release`", a WARNING per connection, ~200 in a red-team
                    // run that terminated backends under load): the statement that met the broken
                    // connection has already said so, as a transient storage error.
                    match tokio::time::timeout(release_deadline, sqlx::Connection::ping(&mut *conn)).await {
                        Ok(Ok(())) => Ok(true),
                        Ok(Err(e)) => {
                            tracing::debug!("a released connection failed its ping and is closed: {e}");
                            Ok(false)
                        }
                        Err(_) => Err(super::conns::timed_out(release_deadline)),
                    }
                })
            })
            .connect_with(connect.clone())
            .await
            .map_err(|e| map_err("connect", e, None))?;
        let ids = migrate(&pool, &opts.schema, (opts.id_type, opts.user_id_type), opts.statement_deadline).await?;
        let redis = match redis_url {
            Some(url) => {
                Some(RedisCache::connect(url, &store_id(&pool, &schema, opts.statement_deadline).await?).await?)
            }
            None => None,
        };
        let deadline = opts.statement_deadline;
        Ok(PgStore {
            conns: super::conns::Conns::new(pool, deadline),
            sql: Sql::new(&schema, ids),
            opts,
            redis,
            unrecorded: Default::default(),
            legacy_scan_error: Default::default(),
        })
    }

    /// Sets how long Redis keeps a state cache entry; without Redis it does nothing.
    pub fn set_cache_ttl(&mut self, ttl: Duration) {
        if let Some(r) = self.redis.as_mut() {
            r.state_ttl = ttl;
        }
    }

    /// The store's connection pool (for callers that read the tables themselves; the
    /// connections the store keeps aside between statements are given back to it first).
    pub fn pool(&self) -> &PgPool {
        self.conns.pool()
    }
}

/// The database's and schema's id (`tenx_store`, made by the migration): the namespace of its
/// Redis keys.
async fn store_id(pool: &sqlx::PgPool, schema: &str, deadline: Duration) -> StoreResult<String> {
    let q = format!("SELECT store_id FROM {schema}.tenx_store");
    let read = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(q)).fetch_one(pool);
    tokio::time::timeout(deadline, read)
        .await
        .map_err(|_| StoreError::Transient { op: "connect", message: super::conns::timed_out(deadline).to_string() })?
        .map_err(|e| map_err("connect", e, None))
}

/// How long the server lets one statement run: the client's deadline less a margin for the
/// answer's way back (a fifth, at least 100 ms), so a statement the client gives up on has
/// already been cancelled, and rolled back, on the server.
pub(super) fn server_deadline(client: Duration) -> Duration {
    let margin = (client / 5).max(Duration::from_millis(100));
    client.saturating_sub(margin).max(Duration::from_millis(1))
}
