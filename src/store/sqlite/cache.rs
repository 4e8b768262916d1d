//! The generic key/value cache (10xGraph's `cache_*`), with optional expiry.

use super::*;

pub(super) async fn cache_put(
    s: &SqliteStore,
    ns: &str,
    key: &str,
    value: &Value,
    ttl: Option<f64>,
) -> StoreResult<()> {
    let expires = ttl.filter(|t| *t > 0.0).map(|t| now_secs() + t);
    sqlx::query(
        "INSERT INTO cache (namespace, key, value, expires_at) VALUES (?, ?, ?, ?) \
         ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
    )
    .bind(ns)
    .bind(key)
    .bind(to_text(value))
    .bind(expires)
    .execute(&s.pool)
    .await
    .map_err(be("cache write"))?;
    Ok(())
}

/// One statement: an unexpired row stays as it is.
pub(super) async fn cache_put_absent(
    s: &SqliteStore,
    ns: &str,
    key: &str,
    value: &Value,
    ttl: Option<f64>,
) -> StoreResult<bool> {
    let now = now_secs();
    let expires = ttl.filter(|t| *t > 0.0).map(|t| now + t);
    let done = sqlx::query(
        "INSERT INTO cache (namespace, key, value, expires_at) VALUES (?, ?, ?, ?) \
         ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at \
         WHERE cache.expires_at IS NOT NULL AND cache.expires_at <= ?",
    )
    .bind(ns)
    .bind(key)
    .bind(to_text(value))
    .bind(expires)
    .bind(now)
    .execute(&s.pool)
    .await
    .map_err(be("cache write"))?;
    Ok(done.rows_affected() > 0)
}

pub(super) async fn cache_get(s: &SqliteStore, ns: &str, key: &str) -> StoreResult<Option<Value>> {
    let s: Option<String> = sqlx::query_scalar(
        "SELECT value FROM cache WHERE namespace = ? AND key = ? AND (expires_at IS NULL OR expires_at > ?)",
    )
    .bind(ns)
    .bind(key)
    .bind(now_secs())
    .fetch_optional(&s.pool)
    .await
    .map_err(be("cache read"))?;
    s.map(|s| parse("cache read", &s)).transpose()
}

pub(super) async fn cache_clear(s: &SqliteStore, ns: &str, key: &str) -> StoreResult<()> {
    sqlx::query("DELETE FROM cache WHERE namespace = ? AND key = ?")
        .bind(ns)
        .bind(key)
        .execute(&s.pool)
        .await
        .map_err(be("cache clear"))?;
    Ok(())
}

pub(super) async fn cache_keys(s: &SqliteStore, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
    sqlx::query_scalar(
        "SELECT key FROM cache WHERE namespace = ? AND (? IS NULL OR substr(key, 1, length(?)) = ?) \
         AND (expires_at IS NULL OR expires_at > ?) ORDER BY key",
    )
    .bind(ns)
    .bind(prefix)
    .bind(prefix)
    .bind(prefix)
    .bind(now_secs())
    .fetch_all(&s.pool)
    .await
    .map_err(be("cache keys"))
}
