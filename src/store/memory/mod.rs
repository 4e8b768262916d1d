//! In-process backend: the same versioning and ledger rules as SQLite/Postgres, kept in maps.
//! Values are stored as JSON copies, never live Python objects (10xGraph kept references, which
//! made snapshots backend-dependent).
//!
//! One file (~570 lines) on purpose: every method takes the one `Mutex<Inner>` and does all its
//! checks before its first change, which is what makes each call atomic here; split by concept,
//! that discipline would have to be re-read in every file. The concepts are sections below.

use super::id_text;
use super::{
    Checkpoint, Checkpointer, KnownHead, LeaseAttempt, LeaseInfo, LeaseRequest, PruneReport, PruneRules, RawJson,
    StepWrite, StoreError, StoreResult, StoredMessage, ThreadRef, ThreadRow, fence_ok, is_completed_state, is_intent,
    is_running_state, may_take, message_matches, now_secs,
};
use async_trait::async_trait;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;

mod messages;
use messages::Messages;

const STATE_HISTORY: usize = 20;

#[derive(Default)]
struct ThreadData {
    row: Option<ThreadRow>,
    states: Vec<(i64, Value)>,
    messages: Messages,
    /// key -> (row, recorded at)
    ledger: HashMap<String, (Value, f64)>,
}

/// A lease with its absolute expiry (`LeaseInfo::expires_in` is relative to the reader's now).
struct LeaseRow {
    info: LeaseInfo,
    expires_at: f64,
}

impl LeaseRow {
    fn view(&self) -> LeaseInfo {
        LeaseInfo { expires_in: self.expires_at - now_secs(), ..self.info.clone() }
    }
}

#[derive(Default)]
struct Inner {
    threads: HashMap<String, ThreadData>,
    cache: HashMap<(String, String), (Value, Option<f64>)>,
    /// The cache's size after its last sweep of expired entries (see `sweep_cache`).
    cache_swept_at: usize,
    leases: HashMap<String, LeaseRow>,
    /// The last fencing token handed out, by any thread: a token is this plus one, so a thread's
    /// free lease row can go with the thread and a reused thread id still never gets back a token
    /// a stalled run of its earlier life may hold.
    last_token: i64,
}

impl Inner {
    /// Drops expired cache entries once the cache has doubled since the last sweep: amortised
    /// O(1) per write. Before, an expired entry went only when its own key was read again, so a
    /// cache written with TTLs (sessions, rate limits, the stop requests' hour) only grew.
    fn sweep_cache(&mut self) {
        if self.cache.len() < 2 * self.cache_swept_at.max(512) {
            return;
        }
        self.drop_expired_cache(now_secs());
    }

    /// Drops the cache entries expired at `now`; returns how many went.
    fn drop_expired_cache(&mut self, now: f64) -> usize {
        let before = self.cache.len();
        self.cache.retain(|_, (_, exp)| exp.is_none_or(|e| e > now));
        self.cache_swept_at = self.cache.len();
        before - self.cache.len()
    }

    /// Drops the thread's lease row unless somebody holds it (a live lease stays, so its run is
    /// still fenced, not silently freed).
    fn forget_free_lease(&mut self, thread_id: &str) {
        if self.leases.get(thread_id).is_some_and(|l| !l.view().is_live()) {
            self.leases.remove(thread_id);
        }
    }
}

impl Inner {
    /// A run's ledger write (`fence` set) needs its thread: the run's input commit made it, so a
    /// missing one was deleted under the run, and writing would bring it back with that row and
    /// no state. Refused like a superseded lease, with no current token.
    fn thread_of_run(&self, thread_id: &str, fence: Option<i64>) -> StoreResult<()> {
        match fence {
            Some(token) if !self.threads.contains_key(thread_id) => {
                Err(StoreError::Fenced { thread_id: thread_id.to_owned(), token, current: None })
            }
            _ => Ok(()),
        }
    }

    fn fence(&self, thread_id: &str, fence: Option<i64>) -> StoreResult<()> {
        let current = self.leases.get(thread_id).map(|l| l.info.token);
        if fence_ok(current, fence) {
            Ok(())
        } else {
            Err(StoreError::Fenced { thread_id: thread_id.to_owned(), token: fence.unwrap_or_default(), current })
        }
    }
}

/// The in-process store: the same contract as the durable backends (conformance suite), nothing
/// survives the process.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    enforce_user_isolation: bool,
}

impl MemoryStore {
    /// An empty store; `enforce_user_isolation` as in `PgOptions`.
    pub fn new(enforce_user_isolation: bool) -> Self {
        Self { inner: Mutex::new(Inner::default()), enforce_user_isolation }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-operation; the maps stay usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_owner(&self, d: &ThreadData, t: &ThreadRef) -> StoreResult<()> {
        match &d.row {
            Some(r) if t.isolated(self.enforce_user_isolation) && r.user_id != t.user_id => {
                Err(StoreError::Forbidden { thread_id: t.thread_id.clone() })
            }
            _ => Ok(()),
        }
    }

    fn readable<'a>(&self, inner: &'a Inner, t: &ThreadRef) -> Option<&'a ThreadData> {
        let d = inner.threads.get(&t.thread_id)?;
        self.check_owner(d, t).ok().map(|_| d)
    }
}

/// Ledger rows into a thread's ledger: the first result wins, and a result replaces an intent.
/// Returns how many were written.
fn record_rows(d: &mut ThreadData, entries: &[(String, Value)]) -> usize {
    let now = now_secs();
    let mut written = 0;
    for (key, result) in entries {
        let replaces_intent = d.ledger.get(key).is_some_and(|(v, _)| is_intent(v) && !is_intent(result));
        if replaces_intent || !d.ledger.contains_key(key) {
            d.ledger.insert(key.clone(), (result.clone(), now));
            written += 1;
        }
    }
    written
}

fn ensure_row(d: &mut ThreadData, t: &ThreadRef) {
    if d.row.is_none() {
        let now = now_secs();
        d.row = Some(ThreadRow {
            thread_id: t.thread_id.clone(),
            user_id: t.user_id.clone(),
            // 10xGraph's name for a thread its first write creates, on every backend.
            thread_name: Some(id_text::default_thread_name(&t.thread_id)),
            meta: Value::Object(Default::default()),
            created_at: now,
            updated_at: now,
        });
    }
}

/// Messages changed outside a step: the latest state row no longer describes them (see
/// `clear_write_mark`).
fn unmark_latest(d: &mut ThreadData) {
    if let Some((_, s)) = d.states.last_mut() {
        super::mark_messages_changed(s);
    }
}

fn page<T: Clone>(items: impl Iterator<Item = T>, offset: Option<i64>, limit: Option<i64>) -> Vec<T> {
    let it = items.skip(offset.unwrap_or(0).max(0) as usize);
    match limit {
        Some(l) => it.take(l.max(0) as usize).collect(),
        None => it.collect(),
    }
}

impl MemoryStore {
    /// The step write under the store's lock (see `put_step`).
    fn step_locked(&self, inner: &mut Inner, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        inner.fence(&t.thread_id, w.fence)?;
        // Checked before the entry is made: a refused write to a deleted thread (a run that held
        // its lease through aclean_thread) must not leave an empty thread behind.
        let current = match inner.threads.get(&t.thread_id) {
            Some(d) => {
                self.check_owner(d, t)?;
                d.states.last().map(|(v, _)| *v).unwrap_or(0)
            }
            None => 0,
        };
        if current != w.expected_version {
            return Err(StoreError::Stale { thread_id: t.thread_id.clone(), expected: w.expected_version, current });
        }
        let d = inner.threads.entry(t.thread_id.clone()).or_default();
        ensure_row(d, t);
        let new_version = current + 1;
        let state = super::chained_state(&w, d.states.last().and_then(|(_, s)| super::write_mark(s))).into_owned();
        d.states.push((new_version, state));
        if d.states.len() > STATE_HISTORY {
            let drop = d.states.len() - STATE_HISTORY;
            d.states.drain(..drop);
        }
        if w.replace_messages {
            d.messages.clear();
        }
        for m in w.new_messages {
            d.messages.upsert(m);
        }
        if let Some(r) = d.row.as_mut() {
            r.updated_at = now_secs();
        }
        if let (true, Some(token)) = (w.release_lease, w.fence)
            && let Some(l) = inner.leases.get_mut(&t.thread_id).filter(|l| l.info.token == token)
        {
            l.info.released = true;
            l.expires_at = now_secs();
        }
        Ok(new_version)
    }

    /// The lease take under the store's lock (see `lease_acquire`).
    fn take_locked(&self, inner: &mut Inner, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        if let (Some(user), Some(d)) = (&req.user_id, inner.threads.get(thread_id)) {
            self.check_owner(d, &ThreadRef::new(thread_id, user.as_str()).scoped(req.owner_scoped))?;
        }
        let cur = inner.leases.get(thread_id).map(LeaseRow::view);
        if !may_take(cur.as_ref(), req) {
            return Ok(LeaseAttempt::Held(cur.expect("may_take is true without a row")));
        }
        let token = cur.map_or(0, |c| c.token).max(inner.last_token) + 1;
        inner.last_token = token;
        let info = LeaseInfo {
            token,
            holder: req.holder.clone(),
            host: req.host.clone(),
            pid: req.pid,
            pid_start: req.pid_start,
            expires_in: req.ttl.as_secs_f64(),
            released: false,
        };
        inner.leases.insert(thread_id.to_owned(), LeaseRow { info, expires_at: now_secs() + req.ttl.as_secs_f64() });
        Ok(LeaseAttempt::Acquired { token })
    }
}

#[async_trait]
impl Checkpointer for MemoryStore {
    fn isolates_users(&self) -> bool {
        self.enforce_user_isolation
    }

    async fn setup(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn load_with(&self, t: &ThreadRef, known: Option<KnownHead<'_>>) -> StoreResult<Option<Checkpoint>> {
        id_text::check_ref(t)?;
        let inner = self.lock();
        // A non-owner reads nothing (writes are what raise).
        let Some(d) = self.readable(&inner, t) else { return Ok(None) };
        Ok(d.states.last().map(|(v, s)| {
            let messages_known = known.is_some_and(|k| k.matches(*v, s));
            Checkpoint {
                version: *v,
                state: s.clone(),
                messages: if messages_known { Vec::new() } else { d.messages.iter().map(|m| m.text.clone()).collect() },
                rewrite_messages: false,
                messages_known,
            }
        }))
    }

    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        self.put_step_with_ledger(t, w, &[]).await
    }

    fn joins_ledger_to_step(&self) -> bool {
        true
    }

    async fn put_step_with_ledger(
        &self,
        t: &ThreadRef,
        w: StepWrite<'_>,
        rows: &[(String, Value)],
    ) -> StoreResult<i64> {
        id_text::check_ref(t)?;
        id_text::check_messages(w.new_messages)?;
        // No transaction to be inside of: the hook runs before anything changes, which is what a
        // crash inside a transaction leaves behind.
        if let Some(h) = w.in_tx {
            h.in_transaction().await.map_err(StoreError::Failpoint)?;
        }
        // One lock: the step's checks (fence, owner, version) come before any change, and the
        // rows go in only once the step is in.
        let mut inner = self.lock();
        let version = self.step_locked(&mut inner, t, w)?;
        if let Some(d) = inner.threads.get_mut(&t.thread_id) {
            record_rows(d, rows);
        }
        Ok(version)
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
        if let Some(h) = w.in_tx {
            h.in_transaction().await.map_err(StoreError::Failpoint)?;
        }
        // One lock: every check comes before the first change, so a refusal changes nothing.
        let mut inner = self.lock();
        let current = inner.threads.get(&t.thread_id).and_then(|d| d.states.last()).map_or(0, |(v, _)| *v);
        if current != w.expected_version {
            return Err(StoreError::Stale { thread_id: t.thread_id.clone(), expected: w.expected_version, current });
        }
        if let Some(d) = inner.threads.get(&t.thread_id) {
            self.check_owner(d, t)?;
        }
        let token = match self.take_locked(&mut inner, &t.thread_id, req)? {
            LeaseAttempt::Acquired { token } => token,
            LeaseAttempt::Held(info) => return Ok(super::LeasedInput::Held(info)),
        };
        let version = self.step_locked(&mut inner, t, StepWrite { fence: Some(token), release_lease: false, ..w })?;
        if let Some(k) = stop {
            inner.cache.remove(&(k.namespace.to_owned(), k.key.to_owned()));
        }
        Ok(super::LeasedInput::Committed { token, version })
    }

    async fn clear_state(&self, t: &ThreadRef) -> StoreResult<()> {
        id_text::check_ref(t)?;
        let mut inner = self.lock();
        if let Some(d) = inner.threads.get_mut(&t.thread_id) {
            self.check_owner(d, t)?;
            d.states.clear();
            d.messages.clear();
        }
        Ok(())
    }

    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage]) -> StoreResult<()> {
        id_text::check_ref(t)?;
        id_text::check_messages(msgs)?;
        let mut inner = self.lock();
        let d = inner.threads.entry(t.thread_id.clone()).or_default();
        self.check_owner(d, t)?;
        ensure_row(d, t);
        for m in msgs {
            d.messages.upsert(m);
        }
        if !msgs.is_empty() {
            unmark_latest(d);
        }
        Ok(())
    }

    async fn get_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<Option<RawJson>> {
        id_text::check_ref(t)?;
        id_text::check_text_id("message_id", message_id)?;
        let inner = self.lock();
        Ok(self.readable(&inner, t).and_then(|d| d.messages.get(message_id).map(|m| m.text.clone())))
    }

    async fn list_messages(
        &self,
        t: &ThreadRef,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<RawJson>> {
        id_text::check_ref(t)?;
        let inner = self.lock();
        let Some(d) = self.readable(&inner, t) else { return Ok(vec![]) };
        let it =
            d.messages.iter().filter(|m| search.is_none_or(|s| message_matches(&m.text, s))).map(|m| m.text.clone());
        Ok(page(it, offset, limit))
    }

    async fn delete_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<bool> {
        id_text::check_ref(t)?;
        id_text::check_text_id("message_id", message_id)?;
        let mut inner = self.lock();
        let Some(d) = inner.threads.get_mut(&t.thread_id) else { return Ok(false) };
        self.check_owner(d, t)?;
        let deleted = d.messages.remove(message_id);
        if deleted {
            unmark_latest(d);
        }
        Ok(deleted)
    }

    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
        id_text::check_ref(t)?;
        id_text::check_thread_name(name)?;
        let mut inner = self.lock();
        let d = inner.threads.entry(t.thread_id.clone()).or_default();
        self.check_owner(d, t)?;
        let inserted = d.row.is_none();
        ensure_row(d, t);
        let r = d.row.as_mut().expect("row ensured above");
        if name.is_some() {
            r.thread_name = name.map(str::to_owned);
        }
        r.meta = meta.clone();
        r.updated_at = now_secs();
        Ok(inserted)
    }

    async fn get_thread(&self, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
        id_text::check_ref(t)?;
        let inner = self.lock();
        Ok(self.readable(&inner, t).and_then(|d| d.row.clone()))
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
        let inner = self.lock();
        let mut rows: Vec<ThreadRow> = inner
            .threads
            .values()
            .filter_map(|d| d.row.clone())
            .filter(|r| user_id.is_none_or(|u| r.user_id == u))
            .filter(|r| {
                search.is_none_or(|s| {
                    let s = s.to_lowercase();
                    r.thread_name.as_deref().unwrap_or("").to_lowercase().contains(&s)
                        || r.thread_id.to_lowercase().contains(&s)
                })
            })
            .collect();
        rows.sort_by(|a, b| b.updated_at.total_cmp(&a.updated_at));
        Ok(page(rows.into_iter(), offset, limit))
    }

    async fn clean_thread(&self, t: &ThreadRef) -> StoreResult<()> {
        id_text::check_ref(t)?;
        let mut inner = self.lock();
        if let Some(d) = inner.threads.get(&t.thread_id) {
            self.check_owner(d, t)?;
            inner.threads.remove(&t.thread_id);
        }
        inner.forget_free_lease(&t.thread_id);
        Ok(())
    }

    async fn thread_owner(&self, thread_id: &str) -> StoreResult<Option<String>> {
        id_text::check_text_id("thread_id", thread_id)?;
        let inner = self.lock();
        Ok(inner.threads.get(thread_id).and_then(|d| d.row.as_ref().map(|r| r.user_id.clone())))
    }

    async fn running_threads(&self, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
        if let Some(a) = after {
            id_text::check_text_id("thread_id", a)?;
        }
        let inner = self.lock();
        let mut out: Vec<ThreadRef> = inner
            .threads
            .iter()
            .filter(|(id, d)| {
                after.is_none_or(|a| id.as_str() > a) && d.states.last().is_some_and(|(_, s)| is_running_state(s))
            })
            .filter_map(|(id, d)| d.row.as_ref().map(|r| ThreadRef::new(id.clone(), r.user_id.clone())))
            .collect();
        out.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
        out.truncate(limit.max(0) as usize);
        Ok(out)
    }

    async fn cache_put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()> {
        let expires = ttl.filter(|t| *t > 0.0).map(|t| now_secs() + t);
        let mut inner = self.lock();
        inner.cache.insert((ns.into(), key.into()), (value.clone(), expires));
        inner.sweep_cache();
        Ok(())
    }

    async fn cache_put_absent(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<bool> {
        let mut inner = self.lock();
        let k = (ns.to_owned(), key.to_owned());
        let now = now_secs();
        if inner.cache.get(&k).is_some_and(|(_, exp)| exp.is_none_or(|e| e > now)) {
            return Ok(false);
        }
        inner.cache.insert(k, (value.clone(), ttl.filter(|t| *t > 0.0).map(|t| now + t)));
        inner.sweep_cache();
        Ok(true)
    }

    async fn cache_get(&self, ns: &str, key: &str) -> StoreResult<Option<Value>> {
        let mut inner = self.lock();
        let k = (ns.to_owned(), key.to_owned());
        match inner.cache.get(&k) {
            Some((_, Some(exp))) if *exp <= now_secs() => {
                inner.cache.remove(&k);
                Ok(None)
            }
            Some((v, _)) => Ok(Some(v.clone())),
            None => Ok(None),
        }
    }

    async fn cache_clear(&self, ns: &str, key: &str) -> StoreResult<()> {
        self.lock().cache.remove(&(ns.to_owned(), key.to_owned()));
        Ok(())
    }

    async fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
        let now = now_secs();
        let inner = self.lock();
        let mut keys: Vec<String> = inner
            .cache
            .iter()
            .filter(|((n, k), (_, exp))| {
                n == ns && prefix.is_none_or(|p| k.starts_with(p)) && exp.is_none_or(|e| e > now)
            })
            .map(|((_, k), _)| k.clone())
            .collect();
        keys.sort();
        Ok(keys)
    }

    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        id_text::check_ref(t)?;
        let inner = self.lock();
        let Some(d) = self.readable(&inner, t) else { return Ok(HashMap::new()) };
        Ok(keys.iter().filter_map(|k| d.ledger.get(k).map(|(v, _)| (k.clone(), v.clone()))).collect())
    }

    async fn ledger_put_many(
        &self,
        t: &ThreadRef,
        entries: &[(String, Value)],
        fence: Option<i64>,
    ) -> StoreResult<usize> {
        id_text::check_ref(t)?;
        let mut inner = self.lock();
        inner.fence(&t.thread_id, fence)?;
        inner.thread_of_run(&t.thread_id, fence)?;
        let d = inner.threads.entry(t.thread_id.clone()).or_default();
        self.check_owner(d, t)?;
        ensure_row(d, t);
        Ok(record_rows(d, entries))
    }

    async fn ledger_mark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        id_text::check_ref(t)?;
        let mut inner = self.lock();
        inner.fence(&t.thread_id, fence)?;
        inner.thread_of_run(&t.thread_id, fence)?;
        let Some(d) = inner.threads.get_mut(&t.thread_id) else { return Ok(0) };
        self.check_owner(d, t)?;
        let now = now_secs();
        let mut written = 0;
        for (key, mark) in marks {
            if let Some(row) = d.ledger.get_mut(key).filter(|(v, _)| is_intent(v) && is_intent(mark)) {
                *row = (mark.clone(), now);
                written += 1;
            }
        }
        Ok(written)
    }

    async fn lease_acquire(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        id_text::check_text_id("thread_id", thread_id)?;
        if let Some(u) = &req.user_id {
            id_text::check_text_id("user_id", u)?;
        }
        let mut inner = self.lock();
        self.take_locked(&mut inner, thread_id, req)
    }

    async fn lease_renew(&self, thread_id: &str, token: i64, ttl: std::time::Duration) -> StoreResult<bool> {
        id_text::check_text_id("thread_id", thread_id)?;
        let mut inner = self.lock();
        match inner.leases.get_mut(thread_id) {
            Some(l) if l.info.token == token && !l.info.released => {
                l.expires_at = now_secs() + ttl.as_secs_f64();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        id_text::check_text_id("thread_id", thread_id)?;
        let mut inner = self.lock();
        let gone = !inner.threads.contains_key(thread_id);
        if let Some(l) = inner.leases.get_mut(thread_id).filter(|l| l.info.token == token) {
            l.info.released = true;
            l.expires_at = now_secs();
            if gone {
                // Deleted while this run held it: nothing else would ever drop the row.
                inner.leases.remove(thread_id);
            }
        }
        Ok(())
    }

    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        id_text::check_text_id("thread_id", thread_id)?;
        Ok(self.lock().leases.get(thread_id).map(LeaseRow::view))
    }

    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport> {
        let now = now_secs();
        let mut inner = self.lock();
        let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
        let held: std::collections::HashSet<String> =
            inner.leases.iter().filter(|(_, l)| l.view().is_live()).map(|(k, _)| k.clone()).collect();
        let mut doomed = Vec::new();
        for (id, d) in inner.threads.iter_mut() {
            if let Some(keep) = rules.keep_versions {
                let excess = d.states.len().saturating_sub(keep.max(1) as usize);
                report.state_versions += excess as u64;
                if !rules.dry_run {
                    d.states.drain(..excess);
                }
            }
            let finished = d.states.last().is_some_and(|(_, s)| is_completed_state(s)) && !held.contains(id);
            if !finished {
                continue;
            }
            let updated = d.row.as_ref().map(|r| r.updated_at).unwrap_or(now);
            if rules.finished_older_than.is_some_and(|age| now - updated > age) {
                report.threads += 1;
                report.ledger_rows += d.ledger.len() as u64;
                doomed.push(id.clone());
                continue;
            }
            if let Some(ttl) = rules.ledger_ttl {
                let expired = d.ledger.values().filter(|(_, at)| now - at > ttl).count();
                report.ledger_rows += expired as u64;
                if !rules.dry_run {
                    d.ledger.retain(|_, (_, at)| now - *at <= ttl);
                }
            }
        }
        if !rules.dry_run {
            for id in doomed {
                inner.threads.remove(&id);
                inner.forget_free_lease(&id);
            }
        }
        report.cache_entries = if rules.dry_run {
            inner.cache.values().filter(|(_, exp)| exp.is_some_and(|e| e <= now)).count()
        } else {
            inner.drop_expired_cache(now)
        } as u64;
        Ok(report)
    }

    async fn release(&self) -> StoreResult<()> {
        let mut inner = self.lock();
        inner.threads.clear();
        inner.cache.clear();
        inner.leases.clear();
        Ok(())
    }

    async fn ledger_list(&self, t: &ThreadRef) -> StoreResult<Vec<super::LedgerEntry>> {
        id_text::check_ref(t)?;
        let inner = self.lock();
        let Some(d) = self.readable(&inner, t) else { return Ok(vec![]) };
        // In recording order (then key, for rows recorded in the same instant).
        let mut rows: Vec<super::LedgerEntry> = d
            .ledger
            .iter()
            .map(|(k, (v, at))| super::LedgerEntry { key: k.clone(), result: Some(v.clone()), created_at: Some(*at) })
            .collect();
        rows.sort_by(|a, b| {
            a.created_at.unwrap_or(0.0).total_cmp(&b.created_at.unwrap_or(0.0)).then_with(|| a.key.cmp(&b.key))
        });
        Ok(rows)
    }

    async fn state_versions(&self, t: &ThreadRef) -> StoreResult<Vec<super::StateVersion>> {
        id_text::check_ref(t)?;
        let inner = self.lock();
        let Some(d) = self.readable(&inner, t) else { return Ok(vec![]) };
        Ok(d.states
            .iter()
            .rev()
            .map(|(v, s)| super::StateVersion { version: *v, created_at: None, state: s.clone() })
            .collect())
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::{Inner, Messages, now_secs};
    use crate::store::StoredMessage;
    use serde_json::json;

    fn msg(id: &str, n: i64) -> StoredMessage {
        StoredMessage::new(id, &json!({ "message_id": id, "n": n }))
    }

    fn ids(m: &Messages) -> Vec<String> {
        m.iter().map(|k| k.id.clone()).collect()
    }

    #[test]
    fn the_message_index_follows_upserts_and_removals() {
        let mut m = Messages::default();
        for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
            m.upsert(&msg(id, i as i64));
        }
        m.upsert(&msg("b", 9)); // replaced where it stands
        assert_eq!(ids(&m), ["a", "b", "c", "d"]);
        assert!(m.get("b").unwrap().text.get().contains("9"));
        assert!(m.remove("b"));
        assert!(!m.remove("b"));
        assert_eq!(ids(&m), ["a", "c", "d"]);
        // Every id after the removed one still finds its own message.
        for id in ["a", "c", "d"] {
            assert_eq!(m.get(id).unwrap().id, id);
        }
        m.upsert(&msg("b", 1)); // a removed id comes back at the end
        m.upsert(&msg("d", 7));
        assert_eq!(ids(&m), ["a", "c", "d", "b"]);
        assert!(m.get("d").unwrap().text.get().contains("7"));
        m.clear();
        assert!(m.get("a").is_none() && ids(&m).is_empty());
    }

    #[test]
    fn expired_cache_entries_are_swept_as_the_cache_grows() {
        let mut inner = Inner::default();
        let past = Some(now_secs() - 1.0);
        for i in 0..5000 {
            inner.cache.insert(("ns".into(), format!("k{i}")), (json!(i), past));
            inner.sweep_cache();
        }
        inner.cache.insert(("ns".into(), "kept".into()), (json!(1), None));
        inner.cache.insert(("ns".into(), "later".into()), (json!(1), Some(now_secs() + 3600.0)));
        for i in 0..2000 {
            inner.cache.insert(("ns".into(), format!("j{i}")), (json!(i), past));
            inner.sweep_cache();
        }
        // Never more than twice the live entries (or the floor of 512) between two sweeps.
        assert!(inner.cache.len() <= 1024, "{} entries", inner.cache.len());
        assert!(inner.cache.contains_key(&("ns".into(), "kept".into())));
        assert!(inner.cache.contains_key(&("ns".into(), "later".into())));
    }
}
