//! The generic cache (stop requests and the like) and the state cache: Redis first when it is
//! configured and up, the `tenx_cache` table otherwise, so nothing is lost while Redis is down.

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
    if let Some(r) = s.redis()
        && r.put(ns, key, value, ttl).await
    {
        return Ok(());
    }
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

/// The table's value of a key (`cache_get` without Redis, or when Redis misses).
async fn table_get(s: &PgStore, ns: &str, key: &str) -> StoreResult<Option<Value>> {
    sqlx::query_scalar(s.sql.cache.get.q())
        .bind(ns)
        .bind(key)
        .fetch_optional(&s.conns)
        .await
        .map_err(|e| map_err("cache read", e, None))
}

/// The table's value decides first: one written there while Redis was down is what `cache_get`
/// would fall back to only on a Redis miss, so a Redis write beside it would hide it.
pub(super) async fn cache_put_absent(
    s: &PgStore,
    ns: &str,
    key: &str,
    value: &Value,
    ttl: Option<f64>,
) -> StoreResult<bool> {
    if let Some(r) = s.redis() {
        if table_get(s, ns, key).await?.is_some() {
            return Ok(false);
        }
        if let Some(written) = r.put_absent(ns, key, value, ttl).await {
            return Ok(written);
        }
    }
    Ok(table_write(s, &s.sql.cache.put_absent, ns, key, value, ttl).await? > 0)
}

pub(super) async fn cache_get(s: &PgStore, ns: &str, key: &str) -> StoreResult<Option<Value>> {
    if let Some(r) = s.redis()
        && let Some(Some(found)) = r.get(ns, key).await
    {
        return Ok(Some(found));
    }
    table_get(s, ns, key).await
}

pub(super) async fn cache_clear(s: &PgStore, ns: &str, key: &str) -> StoreResult<()> {
    if let Some(r) = s.redis() {
        r.clear(ns, key).await;
    }
    // Always clear the table too: a value written while Redis was down lives there.
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
    if let Some(r) = s.redis() {
        keys.extend(r.keys(ns, prefix).await);
    }
    keys.sort();
    keys.dedup();
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

pub(super) async fn legacy_state_cache(s: &PgStore, t: &ThreadRef) -> LegacyCache {
    match s.redis() {
        Some(r) => r.get_legacy_state(t).await,
        None => LegacyCache::Absent,
    }
}
