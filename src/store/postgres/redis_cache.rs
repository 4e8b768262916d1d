//! Redis as a cache and signal bus, never the source of truth. Every operation has a bounded
//! timeout; a failure marks Redis down (warning logged once) and the caller falls back to
//! Postgres; Redis is tried again a few seconds later, so a restarted Redis is picked up again.

use crate::store::{LegacyCache, StoreError, StoreResult, ThreadRef};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde_json::Value;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Writes only when the incoming version is not older than the cached one: a slow writer can
/// never move the cached state backwards. 10xGraph 0.10 keeps a JSON string under the same key;
/// a write of ours supersedes it (on a hash-only command the string would fail every write with
/// WRONGTYPE and mark Redis down for all threads).
const STATE_CAS: &str = r#"
if redis.call('TYPE', KEYS[1]).ok == 'string' then redis.call('DEL', KEYS[1]) end
local cur = redis.call('HGET', KEYS[1], 'v')
if cur == false or tonumber(ARGV[1]) >= tonumber(cur) then
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'd', ARGV[2])
  if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  return 1
end
return 0"#;

/// Our entry only: 10xGraph's string under the same key is a miss here (see `get_legacy_state`).
const STATE_GET: &str = r#"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return {false, false} end
return redis.call('HMGET', KEYS[1], 'v', 'd')"#;

/// 10xGraph's entry only (a JSON string); our hash under the same key is not one.
const LEGACY_STATE_GET: &str = r#"
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return false end
return redis.call('GET', KEYS[1])"#;

/// A Redis connection used as a cache beside Postgres: every call is bounded by a short timeout and
/// never fails the caller; a failure answers "not served" (None/false) so Postgres serves instead.
pub struct RedisCache {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<ConnectionManager>>,
    up: AtomicBool,
    last_failure: Mutex<Option<Instant>>,
    /// Expiry of state cache entries (`cache_ttl`; 24 h by default).
    pub state_ttl: Duration,
}

fn generic_key(ns: &str, key: &str) -> String {
    format!("generic_cache:{ns}:{key}")
}

/// Our state cache entry: 10xGraph's key for ids without `:` or `%`, escaped otherwise (see
/// `generic_state_cache::key`; the raw form let two users share an entry).
fn state_key(t: &ThreadRef) -> String {
    format!("state_cache:{}", crate::store::pair_key(&t.thread_id, &t.user_id))
}

/// The key 10xGraph 0.10 wrote its entry under (read only when resuming a run it left).
fn legacy_state_key(t: &ThreadRef) -> String {
    format!("state_cache:{}:{}", t.thread_id, t.user_id)
}

impl RedisCache {
    /// Opens the client; an unreachable server is not an error (runs go on from Postgres).
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let client = redis::Client::open(url).map_err(|e| {
            StoreError::InvalidInput(format!("invalid redis_url: {}", super::errors::redact(&e.to_string())))
        })?;
        let cache = RedisCache {
            client,
            conn: tokio::sync::Mutex::new(None),
            up: AtomicBool::new(true),
            last_failure: Mutex::new(None),
            state_ttl: Duration::from_secs(86400),
        };
        if cache.conn().await.is_none() {
            tracing::warn!("redis is not reachable; continuing on Postgres alone until it is");
        }
        Ok(cache)
    }

    /// False while Redis is marked down and the retry delay has not passed.
    pub fn is_up(&self) -> bool {
        if self.up.load(Ordering::Relaxed) {
            return true;
        }
        let last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        last.is_none_or(|t| t.elapsed() >= RETRY_AFTER)
    }

    fn mark_down(&self, e: &dyn std::fmt::Display) {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                event = "redis_down",
                "redis failed, falling back to Postgres: {}",
                super::errors::redact(&e.to_string())
            );
            crate::metrics::inc(&crate::metrics::metrics().redis_fallbacks);
        }
    }

    fn mark_up(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!(event = "redis_up", "redis is reachable again");
        }
    }

    async fn conn(&self) -> Option<ConnectionManager> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Some(c.clone());
        }
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(500)))
            .set_number_of_retries(1);
        match self.client.get_connection_manager_with_config(cfg).await {
            Ok(c) => {
                *slot = Some(c.clone());
                self.mark_up();
                Some(c)
            }
            Err(e) => {
                self.mark_down(&e);
                None
            }
        }
    }

    async fn run<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        let mut c = self.conn().await?;
        match cmd.query_async::<T>(&mut c).await {
            Ok(v) => {
                self.mark_up();
                Some(v)
            }
            Err(e) => {
                self.mark_down(&e);
                None
            }
        }
    }

    /// True when stored in Redis.
    pub async fn put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> bool {
        let mut cmd = redis::cmd("SET");
        cmd.arg(generic_key(ns, key)).arg(value.to_string());
        if let Some(ms) = px(ttl) {
            cmd.arg("PX").arg(ms);
        }
        self.run::<()>(&cmd).await.is_some()
    }

    /// `SET ... NX`: Some(true) when stored, Some(false) when an unexpired value was there, None
    /// when Redis failed.
    pub async fn put_absent(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> Option<bool> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(generic_key(ns, key)).arg(value.to_string()).arg("NX");
        if let Some(ms) = px(ttl) {
            cmd.arg("PX").arg(ms);
        }
        // Redis answers OK when set, nil when the key was there.
        self.run::<Option<String>>(&cmd).await.map(|r| r.is_some())
    }

    /// `Some(value)` when Redis answered with a value; None when absent or Redis failed (the
    /// caller then asks Postgres, which holds what was written while Redis was down).
    pub async fn get(&self, ns: &str, key: &str) -> Option<Option<Value>> {
        let raw: Option<String> = self.run(redis::cmd("GET").arg(generic_key(ns, key))).await?;
        let v = raw.and_then(|s| serde_json::from_str(&s).ok())?;
        Some(Some(v))
    }

    /// Deletes the generic cache entry; a Redis failure is logged once and ignored (the table is
    /// cleared by the caller either way).
    pub async fn clear(&self, ns: &str, key: &str) {
        let _ = self.run::<i64>(redis::cmd("DEL").arg(generic_key(ns, key))).await;
    }

    /// The generic cache keys of `ns` starting with `prefix`, by SCAN (never KEYS, which blocks
    /// the server); empty when Redis failed.
    pub async fn keys(&self, ns: &str, prefix: Option<&str>) -> Vec<String> {
        let pattern = format!("{}*", generic_key(ns, prefix.unwrap_or("")));
        let head = generic_key(ns, "");
        let mut out = vec![];
        let mut cursor: u64 = 0;
        loop {
            let r: Option<(u64, Vec<String>)> =
                self.run(redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(200)).await;
            let Some((next, keys)) = r else { break };
            out.extend(keys.into_iter().filter_map(|k| k.strip_prefix(&head).map(str::to_owned)));
            if next == 0 {
                break;
            }
            cursor = next;
        }
        out
    }

    /// Version-guarded state cache write: Some(false) when Redis held a newer version, None when
    /// Redis failed.
    pub async fn put_state(&self, t: &ThreadRef, version: i64, payload: &Value) -> Option<bool> {
        let mut c = self.conn().await?;
        let r = redis::Script::new(STATE_CAS)
            .key(state_key(t))
            .arg(version)
            .arg(payload.to_string())
            .arg(self.state_ttl.as_millis() as u64)
            .invoke_async::<i64>(&mut c)
            .await;
        match r {
            Ok(n) => {
                self.mark_up();
                Some(n == 1)
            }
            Err(e) => {
                self.mark_down(&e);
                None
            }
        }
    }

    /// Our state cache entry (version and state) for the thread; None when absent, unreadable,
    /// 10xGraph's entry, or Redis failed.
    pub async fn get_state(&self, t: &ThreadRef) -> Option<(i64, Value)> {
        let (v, d): (Option<i64>, Option<String>) =
            self.script(redis::Script::new(STATE_GET).key(state_key(t))).await?;
        Some((v?, serde_json::from_str(&d?).ok()?))
    }

    /// The state cache entry 10xGraph 0.10 wrote for the thread, decoded.
    pub async fn get_legacy_state(&self, t: &ThreadRef) -> LegacyCache {
        let raw: Option<Option<String>> =
            self.script(redis::Script::new(LEGACY_STATE_GET).key(legacy_state_key(t))).await;
        match raw.flatten() {
            None => LegacyCache::Absent,
            Some(text) => match serde_json::from_str::<Value>(&text) {
                Ok(v @ Value::Object(_)) => LegacyCache::Found(v),
                Ok(other) => {
                    LegacyCache::Unreadable(format!("a JSON {} where a state object was expected", json_kind(&other)))
                }
                Err(e) => LegacyCache::Unreadable(format!("not JSON ({e})")),
            },
        }
    }

    async fn script<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Option<T> {
        let mut c = self.conn().await?;
        match inv.invoke_async::<T>(&mut c).await {
            Ok(v) => {
                self.mark_up();
                Some(v)
            }
            Err(e) => {
                self.mark_down(&e);
                None
            }
        }
    }

    /// Deletes the thread's state cache entry (ours or 10xGraph's); a Redis failure is ignored.
    pub async fn clear_state_cache(&self, t: &ThreadRef) {
        let _ = self.run::<i64>(redis::cmd("DEL").arg(state_key(t))).await;
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A TTL in seconds as Redis' `PX` milliseconds: at least 1, at most `MAX_CACHE_TTL_SECONDS`. Redis refuses a `PX` whose deadline passes 2^63 ms ("invalid expire time" / "value is
/// not an integer or out of range"); that counted as a Redis failure, so one bad TTL marked Redis
/// down (a `redis_down` warning and a fallback to Postgres).
fn px(ttl: Option<f64>) -> Option<u64> {
    ttl.filter(|t| *t > 0.0).map(|t| ((t.min(crate::store::MAX_CACHE_TTL_SECONDS) * 1000.0) as u64).max(1))
}
