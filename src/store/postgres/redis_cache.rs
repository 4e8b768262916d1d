//! Redis as the state cache beside Postgres, never the source of truth. Every operation has a
//! bounded timeout; a failure marks Redis down (warning logged once) and the caller falls back to
//! Postgres; Redis is tried again a few seconds later, so a restarted Redis is picked up again.
//! Its entries carry their version, and a read checks it against the database's. The generic
//! cache (stop requests, `aput_cache_value`) has no version to check, so it is not kept here
//! (see `cache.rs`).

use crate::store::{LegacyCache, StoreError, StoreResult, ThreadRef};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde_json::Value;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Writes only when the incoming version is not older than the cached one: a slow writer can
/// never move the cached state backwards. A string under the key (not ours: 10xGraph's kind of
/// entry) is replaced; on a hash-only command it would fail every write with WRONGTYPE and mark
/// Redis down for all threads.
const STATE_CAS: &str = r#"
if redis.call('TYPE', KEYS[1]).ok == 'string' then redis.call('DEL', KEYS[1]) end
local cur = redis.call('HGET', KEYS[1], 'v')
if cur == false or tonumber(ARGV[1]) >= tonumber(cur) then
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'd', ARGV[2])
  if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  return 1
end
return 0"#;

/// Our entry only: any other kind of value under the key is a miss.
const STATE_GET: &str = r#"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return {false, false} end
return redis.call('HMGET', KEYS[1], 'v', 'd')"#;

/// Deletes 10xGraph's entry (KEYS[1]) only where it is the thread's: its key is not escaped, so
/// thread `T:b` of user `c` and thread `T` of user `b:c` share one, and clearing one thread's cache
/// deleted the other's unfinished run (see `engine::legacy_resume::cache_entry_is_this_threads`,
/// the same rule). ARGV[1]: the thread id; ARGV[2]: '1' when either id has a ':'.
const LEGACY_STATE_DEL: &str = r#"
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return 0 end
local ok, entry = pcall(cjson.decode, redis.call('GET', KEYS[1]))
local named = nil
if ok and type(entry) == 'table' and type(entry.execution_meta) == 'table' then
  local id = entry.execution_meta.thread_id
  if type(id) == 'string' or type(id) == 'number' then named = tostring(id) end
end
if named ~= nil then
  if named ~= ARGV[1] then return 0 end
elseif ARGV[2] == '1' then
  return 0
end
return redis.call('DEL', KEYS[1])"#;

/// Of 10xGraph's entries among KEYS, those of a run under way: {key, the thread its
/// `execution_meta.thread_id` names (or ''), '1' when it names one, its `__checkpoint_version__`
/// (or '')}. The entry holds the whole context: decoded here, only these fields cross. Reading an
/// entry costs about 4 ms a MB and decoding as much again, so only an entry with the text
/// `"status": "running"` is decoded (10xGraph writes it with `json.dumps`; the compact form is
/// looked for too), and a call stops before the entry that would take it past ARGV[1] bytes
/// read: it answers {how many of KEYS it read, rows}, and the caller asks again for the rest.
/// Before, any `"running"` made an entry a candidate (a tool's result or a state field of that
/// value), and 100 of 1 MB in one call ran past the answer timeout, blocked Redis for its length,
/// and recovery and prune then saw no entry at all (red-team, session 44, F4). An entry that says
/// so but does not decode (a lone surrogate cjson refuses) is answered as a run with no thread
/// named: kept by prune. One that decodes once its surrogate escapes are read as U+FFFD (a lone
/// surrogate `json.dumps` wrote) is answered with the key's thread (red-team, session 45).
const LEGACY_RUNNING: &str = r#"
local budget, spent, out = tonumber(ARGV[1]), 0, {}
for i, key in ipairs(KEYS) do
  local size = redis.call('TYPE', key).ok == 'string' and redis.call('STRLEN', key)
  if size then
    if spent > 0 and spent + size > budget then return {i - 1, out} end
    spent = spent + size
    local text = redis.call('GET', key)
    if string.find(text, '"status": "running"', 1, true) or string.find(text, '"status":"running"', 1, true) then
      local ok, entry = pcall(cjson.decode, text)
      local lenient = not ok
      if lenient then
        -- Surrogate escapes, pairs too, as text cjson reads: the thread it names may change, so
        -- the key names it instead (see `store::lone_surrogates_replaced`).
        ok, entry = pcall(cjson.decode, (string.gsub(text, '\\u[dD][89a-fA-F]%x%x', '\\ufffd')))
      end
      if not ok then
        out[#out + 1] = {key, '', '0', ''}
      elseif type(entry) == 'table' and type(entry.execution_meta) == 'table'
          and entry.execution_meta.status == 'running' then
        local id, named = entry.execution_meta.thread_id, '0'
        if lenient then id = nil end
        if type(id) == 'string' or type(id) == 'number' then id, named = tostring(id), '1' else id = '' end
        local v = entry['__checkpoint_version__']
        if type(v) == 'number' then v = string.format('%d', v) elseif type(v) ~= 'string' then v = '' end
        out[#out + 1] = {key, id, named, v}
      end
    end
  end
end
return {#KEYS, out}"#;

/// The bytes of entries `LEGACY_RUNNING` reads per call (~8-16 ms of Redis' time), beside the one
/// entry it always reads.
const RUNNING_READ_BUDGET: usize = 2 << 20;

/// A Redis connection used as a cache beside Postgres: every call is bounded by a short timeout and
/// never fails the caller; a failure answers "not served" (None/false) so Postgres serves instead.
pub struct RedisCache {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<ConnectionManager>>,
    up: AtomicBool,
    last_failure: Mutex<Option<Instant>>,
    /// Expiry of state cache entries (`cache_ttl`; 24 h by default).
    pub state_ttl: Duration,
    /// `tenxgraph:<store id>:`, the id of the database and schema (`tenx_store`): two stores
    /// that share one Redis (two services with the same thread ids, on two databases or
    /// schemas) never share an entry. 10xGraph's keys had no such part.
    prefix: String,
}

/// Our state cache entry: under the store's own prefix (`RedisCache::prefix`), then 10xGraph's
/// key for ids without `:` or `%`, escaped otherwise (see `generic_state_cache::key`; the raw
/// form let two users share an entry).
fn state_key(prefix: &str, t: &ThreadRef) -> String {
    format!("{prefix}state_cache:{}", crate::store::pair_key(&t.thread_id, &t.user_id))
}

/// The key 10xGraph 0.10 wrote its entry under (read only when resuming a run it left).
fn legacy_state_key(t: &ThreadRef) -> String {
    format!("state_cache:{}:{}", t.thread_id, t.user_id)
}

/// Whether the thread's 10xGraph key could be another thread's too (see `LEGACY_STATE_DEL`).
fn ambiguous(t: &ThreadRef) -> bool {
    t.thread_id.contains(':') || t.user_id.contains(':')
}

/// One row of `LEGACY_RUNNING` as the thread it is of and the version it was cached at.
fn running_entry(row: &[String]) -> Option<(ThreadRef, Option<i64>)> {
    let [key, id, named, version] = row else { return None };
    let rest = key.strip_prefix("state_cache:")?;
    let (thread, user) = if named == "1" {
        (id.as_str(), rest.strip_prefix(id.as_str())?.strip_prefix(':')?)
    } else {
        let (thread, user) = rest.split_once(':')?;
        if user.contains(':') {
            return None;
        }
        (thread, user)
    };
    let version = if version.is_empty() { None } else { Some(version.trim().parse().ok()?) };
    Some((ThreadRef::new(thread, user), version))
}

impl RedisCache {
    /// Opens the client; an unreachable server is not an error (runs go on from Postgres).
    /// `store_id` names the database and schema the entries belong to.
    pub async fn connect(url: &str, store_id: &str) -> StoreResult<Self> {
        let client = redis::Client::open(url).map_err(|e| {
            StoreError::InvalidInput(format!("invalid redis_url: {}", super::errors::redact(&e.to_string())))
        })?;
        let cache = RedisCache {
            client,
            conn: tokio::sync::Mutex::new(None),
            up: AtomicBool::new(true),
            last_failure: Mutex::new(None),
            state_ttl: Duration::from_secs(86400),
            prefix: format!("tenxgraph:{store_id}:"),
        };
        if cache.conn().await.is_none() {
            tracing::warn!("redis is not reachable; continuing on Postgres alone until it is");
        }
        Ok(cache)
    }

    /// Err (why Redis is not asked) while `is_up` is false: it failed within `RETRY_AFTER`.
    fn not_down(&self) -> Result<(), String> {
        if self.is_up() {
            return Ok(());
        }
        Err(format!("Redis failed less than {} s ago; not asked again yet", RETRY_AFTER.as_secs()))
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
        self.try_conn().await.ok()
    }

    /// The connection, or the reason Redis could not be reached (redacted, for an error a caller
    /// sees where a missing answer is not the same as an empty one).
    async fn try_conn(&self) -> Result<ConnectionManager, String> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        // Failed while this call waited for the lock (the connect it waited on): each waiter made
        // its own full connect attempt in turn, and on a Redis that never answers calls queued
        // for tens of seconds (red-team, session 42: p99 24 s at 20 new threads a second).
        self.not_down()?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(500)))
            .set_number_of_retries(1);
        let c = self.settled(self.client.get_connection_manager_with_config(cfg).await)?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Version-guarded state cache write: Some(false) when Redis held a newer version, None when
    /// Redis failed.
    pub async fn put_state(&self, t: &ThreadRef, version: i64, payload: &Value) -> Option<bool> {
        let script = redis::Script::new(STATE_CAS);
        let mut cas = script.key(state_key(&self.prefix, t));
        cas.arg(version).arg(payload.to_string()).arg(self.state_ttl.as_millis() as u64);
        self.script::<i64>(cas).await.map(|n| n == 1)
    }

    /// Our state cache entry (version and state) for the thread; None when absent, unreadable,
    /// 10xGraph's entry, or Redis failed.
    pub async fn get_state(&self, t: &ThreadRef) -> Option<(i64, Value)> {
        let (v, d): (Option<i64>, Option<String>) =
            self.script(redis::Script::new(STATE_GET).key(state_key(&self.prefix, t))).await?;
        Some((v?, serde_json::from_str(&d?).ok()?))
    }

    /// The state cache entry 10xGraph 0.10 wrote for the thread, decoded; Err when Redis could
    /// not answer, which is not "no entry": the entry may hold a run 10xGraph's rows do not show.
    /// Not asked while Redis is marked down (a failure in the last `RETRY_AFTER`): every run
    /// waited its own connect timeout, in line behind the connection's lock (red-team, session
    /// 42: 8 new threads at once on a Redis that never answered took 9 s). Plain commands, not a
    /// script: a Redis that refuses scripts (ACLs, some managed offerings) refused every thread.
    pub async fn get_legacy_state(&self, t: &ThreadRef) -> StoreResult<LegacyCache> {
        let failed = |message: String| StoreError::Transient { op: "reading 10xGraph's Redis state cache", message };
        self.not_down().map_err(failed)?;
        let key = legacy_state_key(t);
        let kind: String = self.cmd_checked(redis::cmd("TYPE").arg(&key)).await.map_err(failed)?;
        // Only a string is 10xGraph's; another kind under its key is nobody's entry of a run.
        let raw: Option<String> =
            if kind == "string" { self.cmd_checked(redis::cmd("GET").arg(&key)).await.map_err(failed)? } else { None };
        Ok(match raw {
            None => LegacyCache::Absent,
            Some(text) => match serde_json::from_str::<Value>(&text)
                .or_else(|e| crate::store::lone_surrogates_replaced(&text).map_or(Err(e), |t| serde_json::from_str(&t)))
            {
                Ok(v @ Value::Object(_)) => LegacyCache::Found(v),
                Ok(other) => {
                    LegacyCache::Unreadable(format!("a JSON {} where a state object was expected", json_kind(&other)))
                }
                Err(e) => LegacyCache::Unreadable(format!("not JSON ({e})")),
            },
        })
    }

    /// The threads 10xGraph's Redis entries show a run under way in (`state_cache:<thread>:<user>`
    /// of status `running`), for recovery: such a run may be in no row (a run with
    /// `durable_checkpoint_every_step=False`, or killed in its first node). Each with the version
    /// its entry was cached at. An entry whose key cannot be split into its thread and user (no
    /// `execution_meta.thread_id`, and a ':' in the rest) is left out, as a resume would not use it.
    pub async fn legacy_running_threads(&self) -> StoreResult<Vec<(ThreadRef, Option<i64>)>> {
        let failed = |message: String| StoreError::Transient { op: "scanning 10xGraph's Redis state cache", message };
        // Each answer marks Redis up or down (`settled`): a scan that timed out left it up, and
        // the calls after it (a prune's entry deletes) each waited their own timeout.
        let mut c = self.try_conn().await.map_err(failed)?;
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            // Keys as bytes: one that is not UTF-8 (no thread's) failed the whole pass.
            let raw: redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg("state_cache:*")
                // A round trip per 1,000 keys of the keyspace, most of them no entry of
                // 10xGraph's (ours, one per thread): at 100, 20,000 keys behind a 50 ms link took
                // 10.8 s (red-team, session 43).
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await;
            let (next, raw) = self.settled(raw).map_err(failed)?;
            let keys: Vec<String> = raw.into_iter().filter_map(|k| String::from_utf8(k).ok()).collect();
            let rows = self.running_rows(&mut c, &keys).await.map_err(failed)?;
            out.extend(rows.iter().filter_map(|r| running_entry(r)));
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// Which of `threads` have a 10xGraph entry that shows a run under way, one flag per thread,
    /// read by key (prune, per batch, for the threads it is about to delete whose latest row
    /// 10xGraph wrote: a scan at its start missed a turn a live 10xGraph worker began later;
    /// red-team, session 43). An entry under the thread's key counts whichever thread it names
    /// (two threads can share one key, see `LEGACY_STATE_DEL`): such a thread is kept, not
    /// deleted. Err at once while Redis is marked down.
    pub async fn legacy_runs_among(&self, threads: &[ThreadRef]) -> StoreResult<Vec<bool>> {
        let failed = |message: String| StoreError::Transient { op: "reading 10xGraph's Redis state cache", message };
        self.not_down().map_err(failed)?;
        let mut c = self.try_conn().await.map_err(failed)?;
        let keys: Vec<String> = threads.iter().map(legacy_state_key).collect();
        let rows = self.running_rows(&mut c, &keys).await.map_err(failed)?;
        let running: std::collections::HashSet<&str> =
            rows.iter().filter_map(|r| r.first()).map(String::as_str).collect();
        Ok(keys.iter().map(|k| running.contains(k.as_str())).collect())
    }

    /// `LEGACY_RUNNING` over `keys`: the rows of the entries that show a run under way. At most 100
    /// keys per script call (large entries ran a call past Redis' answer timeout and blocked Redis
    /// meanwhile, session 42), fewer where their entries are large (see `LEGACY_RUNNING`).
    async fn running_rows(&self, c: &mut ConnectionManager, keys: &[String]) -> Result<Vec<Vec<String>>, String> {
        let script = redis::Script::new(LEGACY_RUNNING);
        let mut out = Vec::new();
        let mut rest = keys;
        while !rest.is_empty() {
            let chunk = &rest[..rest.len().min(100)];
            let mut inv = script.prepare_invoke();
            for k in chunk {
                inv.key(k);
            }
            inv.arg(RUNNING_READ_BUDGET);
            let (read, rows): (usize, Vec<Vec<String>>) = self.settled(inv.invoke_async(&mut *c).await)?;
            // The script always reads its first key; an answer that says otherwise would leave
            // keys unread, and an entry unread is a run prune cannot see.
            if read == 0 || read > chunk.len() {
                return Err(format!("the entry check read {read} of {} keys", chunk.len()));
            }
            out.extend(rows);
            rest = &rest[read..];
        }
        Ok(out)
    }

    async fn script<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Option<T> {
        self.script_checked(inv).await.ok()
    }

    async fn cmd_checked<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        let mut c = self.try_conn().await?;
        self.settled(cmd.query_async::<T>(&mut c).await)
    }

    async fn script_checked<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Result<T, String> {
        let mut c = self.try_conn().await?;
        self.settled(inv.invoke_async::<T>(&mut c).await)
    }

    /// A call's answer, Redis marked up or down by it; the error redacted.
    fn settled<T>(&self, r: redis::RedisResult<T>) -> Result<T, String> {
        r.inspect(|_| self.mark_up()).map_err(|e| {
            self.mark_down(&e);
            super::errors::redact(&e.to_string())
        })
    }

    /// Deletes 10xGraph's entry of the thread (where it is the thread's, as `clear_state_cache`);
    /// Err when Redis does not answer (also while it is marked down).
    pub async fn forget_legacy_state(&self, t: &ThreadRef) -> StoreResult<()> {
        let failed = |message: String| StoreError::Transient {
            op: "deleting 10xGraph's Redis state cache entry (nothing was deleted)",
            message,
        };
        self.not_down().map_err(failed)?;
        let key = legacy_state_key(t);
        // A Redis that holds no such string needs no script (one that refuses scripts has none:
        // 10xGraph writes its entry with one).
        let kind: String = self.cmd_checked(redis::cmd("TYPE").arg(&key)).await.map_err(failed)?;
        if kind != "string" {
            return Ok(());
        }
        let legacy = redis::Script::new(LEGACY_STATE_DEL);
        let mut del = legacy.key(&key);
        del.arg(&t.thread_id).arg(if ambiguous(t) { "1" } else { "0" });
        self.script_checked::<i64>(del).await.map(|_| ()).map_err(failed)
    }

    /// Deletes the threads' state cache entries (ours and 10xGraph's, where it is the thread's: see
    /// `LEGACY_STATE_DEL`), one round trip per 20 threads (prune's deleted threads, after
    /// each batch: one call per thread made a prune of 301 threads behind a 10 ms link take 6.5 s,
    /// and kept a deleted thread's finished entry readable that long; red-team, session 44). Each
    /// 10xGraph entry is decoded to check its thread (see `LEGACY_STATE_DEL`), so a round trip
    /// carries few of them. Stops at the first failure, which is otherwise ignored.
    pub async fn clear_state_caches(&self, threads: &[ThreadRef]) {
        let legacy = redis::Script::new(LEGACY_STATE_DEL);
        for chunk in threads.chunks(20) {
            let calls: Vec<redis::ScriptInvocation<'_>> = chunk
                .iter()
                .map(|t| {
                    let mut inv = legacy.prepare_invoke();
                    inv.key(legacy_state_key(t)).arg(&t.thread_id).arg(if ambiguous(t) { "1" } else { "0" });
                    inv
                })
                .collect();
            let mut pipe = redis::pipe();
            pipe.load_script(&legacy).ignore();
            for (t, call) in chunk.iter().zip(&calls) {
                pipe.cmd("DEL").arg(state_key(&self.prefix, t)).ignore();
                pipe.invoke_script(call).ignore();
            }
            let Ok(mut c) = self.try_conn().await else { return };
            if self.settled(pipe.query_async::<()>(&mut c).await).is_err() {
                return;
            }
        }
    }

    /// Deletes the thread's state cache entries (ours and 10xGraph's); a Redis failure is ignored.
    pub async fn clear_state_cache(&self, t: &ThreadRef) {
        self.clear_state_caches(std::slice::from_ref(t)).await
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

#[cfg(test)]
mod tests {
    use super::running_entry;

    use crate::store::ThreadRef;

    fn row(key: &str, id: &str, named: bool, version: &str) -> Vec<String> {
        vec![key.into(), id.into(), if named { "1" } else { "0" }.into(), version.into()]
    }

    #[test]
    fn an_entrys_key_is_split_by_the_thread_it_names() {
        let t = |th: &str, u: &str| ThreadRef::new(th, u);
        assert_eq!(running_entry(&row("state_cache:T:b:u1", "T:b", true, "3")), Some((t("T:b", "u1"), Some(3))));
        assert_eq!(running_entry(&row("state_cache:T:b:u1", "T", true, "")), Some((t("T", "b:u1"), None)));
        assert_eq!(running_entry(&row("state_cache:T:u1", "", false, "2")), Some((t("T", "u1"), Some(2))));
        // Ambiguous without a name, a name the key does not start with, a version that is no number.
        assert_eq!(running_entry(&row("state_cache:T:b:u1", "", false, "")), None);
        assert_eq!(running_entry(&row("state_cache:T:u1", "X", true, "")), None);
        assert_eq!(running_entry(&row("state_cache:T:u1", "T", true, "v2")), None);
    }
}
