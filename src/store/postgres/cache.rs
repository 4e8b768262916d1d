//! The generic cache (stop requests, `aput_cache_value` and the like): the `tenx_cache` table,
//! with or without Redis. Until session 32 it went to Redis first when Redis was up and to the
//! table while it was down; a value has no version, so after a Redis blip the older one Redis
//! held won over the table's newer one (a put lost, a cleared stop request that stopped the
//! next turn), and Redis keys had no namespace of the database (two services on one Redis
//! stopped each other's runs). The state cache, whose entries are versioned, keeps Redis.

use super::{PgStore, Stmt, map_err};
use crate::store::{LegacyCache, STATE_CACHE_NS, StoreResult, ThreadRef, generic_state_cache};
use serde_json::Value;

pub(super) struct Stmts {
    put: Stmt,
    put_absent: Stmt,
    get: Stmt,
    clear: Stmt,
    keys: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str) -> Self {
        Stmts {
            put: Stmt::new(format!(
                "INSERT INTO {s}.tenx_cache (namespace, key, value, expires_at) VALUES ($1, $2, $3, \
                 CASE WHEN $4::float8 IS NULL THEN NULL ELSE NOW() + make_interval(secs => $4::float8) END) \
                 ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at"
            )),
            put_absent: Stmt::new(format!(
                "INSERT INTO {s}.tenx_cache AS c (namespace, key, value, expires_at) VALUES ($1, $2, $3, \
                 CASE WHEN $4::float8 IS NULL THEN NULL ELSE NOW() + make_interval(secs => $4::float8) END) \
                 ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at \
                 WHERE c.expires_at IS NOT NULL AND c.expires_at <= NOW()"
            )),
            get: Stmt::new(format!(
                "SELECT value FROM {s}.tenx_cache WHERE namespace = $1 AND key = $2 AND (expires_at IS NULL OR expires_at > NOW())"
            )),
            clear: Stmt::new(format!("DELETE FROM {s}.tenx_cache WHERE namespace = $1 AND key = $2")),
            keys: Stmt::new(format!(
                "SELECT key FROM {s}.tenx_cache WHERE namespace = $1 AND ($2::text IS NULL OR starts_with(key, $2)) \
                 AND (expires_at IS NULL OR expires_at > NOW())"
            )),
        }
    }
}

pub(super) async fn cache_put(s: &PgStore, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()> {
    table_write(s, &s.sql.cache.put, ns, key, value, ttl).await.map(drop)
}

/// The table's write of `cache_put` (`put`) or `cache_put_absent` (`put_absent`): rows written.
async fn table_write(
    s: &PgStore,
    stmt: &Stmt,
    ns: &str,
    key: &str,
    value: &Value,
    ttl: Option<f64>,
) -> StoreResult<u64> {
    // jsonb holds no U+0000: replaced, as in states, messages and ledger rows (it was the one JSON
    // write without it, and failed with "unsupported Unicode escape sequence").
    let mut value = value.clone();
    super::nul::strip_nul(&mut value);
    let done = sqlx::query(stmt.q())
        .bind(ns)
        .bind(key)
        .bind(&value)
        .bind(ttl.filter(|t| *t > 0.0))
        .execute(&s.conns)
        .await
        .map_err(|e| map_err("cache write", e, None))?;
    Ok(done.rows_affected())
}

pub(super) async fn cache_put_absent(
    s: &PgStore,
    ns: &str,
    key: &str,
    value: &Value,
    ttl: Option<f64>,
) -> StoreResult<bool> {
    Ok(table_write(s, &s.sql.cache.put_absent, ns, key, value, ttl).await? > 0)
}

pub(super) async fn cache_get(s: &PgStore, ns: &str, key: &str) -> StoreResult<Option<Value>> {
    sqlx::query_scalar(s.sql.cache.get.q())
        .bind(ns)
        .bind(key)
        .fetch_optional(&s.conns)
        .await
        .map_err(|e| map_err("cache read", e, None))
}

pub(super) async fn cache_clear(s: &PgStore, ns: &str, key: &str) -> StoreResult<()> {
    sqlx::query(s.sql.cache.clear.q())
        .bind(ns)
        .bind(key)
        .execute(&s.conns)
        .await
        .map_err(|e| map_err("cache clear", e, None))?;
    Ok(())
}

pub(super) async fn cache_keys(s: &PgStore, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
    let mut keys: Vec<String> = sqlx::query_scalar(s.sql.cache.keys.q())
        .bind(ns)
        .bind(prefix)
        .fetch_all(&s.conns)
        .await
        .map_err(|e| map_err("cache keys", e, None))?;
    keys.sort();
    Ok(keys)
}

pub(super) async fn state_cache_put(s: &PgStore, t: &ThreadRef, version: i64, state: &Value) -> StoreResult<bool> {
    let via_redis = match s.redis() {
        Some(r) => r.put_state(t, version, state).await,
        None => None,
    };
    match via_redis {
        Some(written) => Ok(written),
        // Without Redis (or while it is down) the cache table serves, with the same guard.
        _ => generic_state_cache::put(s, t, version, state).await,
    }
}

pub(super) async fn state_cache_get(s: &PgStore, t: &ThreadRef) -> StoreResult<Option<(i64, Value)>> {
    if let Some(hit) = match s.redis() {
        Some(r) => r.get_state(t).await,
        None => None,
    } {
        return Ok(Some(hit));
    }
    generic_state_cache::get(s, t).await
}

pub(super) async fn state_cache_clear(s: &PgStore, t: &ThreadRef) -> StoreResult<()> {
    if let Some(r) = s.redis() {
        r.clear_state_cache(t).await;
    }
    cache_clear(s, STATE_CACHE_NS, &generic_state_cache::key(t)).await
}

pub(super) async fn legacy_state_cache(s: &PgStore, t: &ThreadRef) -> StoreResult<LegacyCache> {
    // Not `s.redis()`: a Redis marked down is an error here, not "no entry" (a run 10xGraph left
    // only there would be lost or run again); the caller decides what it may go on without.
    match s.redis_configured() {
        Some(r) => r.get_legacy_state(t).await,
        None => Ok(LegacyCache::Absent),
    }
}
