//! In-process backend: the same versioning and ledger rules as SQLite/Postgres, kept in maps.
//! Values are stored as JSON copies, never live Python objects (10xGraph kept references, which
//! made snapshots backend-dependent).
//!
//! Every `Checkpointer` method takes the one `Mutex<Inner>` and does all its checks before its
//! first change, which is what makes each call atomic here. The leases (`leases.rs`), the cache
//! (`cache.rs`) and retention (`prune.rs`) are methods of `Inner` (or take it) for that reason:
//! they run under a lock their caller holds, and never take it themselves.

use super::UnrecordedResults;
use super::id_text;
use super::{
    ChangeMark, Checkpoint, Checkpointer, KnownHead, LeaseAttempt, LeaseInfo, LeaseRequest, LedgerRow, PruneReport,
    PruneRules, RawJson, SharedJson, StepWrite, StoreError, StoreResult, StoredMessage, ThreadRef, ThreadRow,
    is_intent, is_intent_text, is_running_state, message_matches, now_secs, page, shared_json, thread_matches,
};
use async_trait::async_trait;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;

mod cache;
mod leases;
mod messages;
mod prune;
use leases::LeaseRow;
use messages::Messages;

const STATE_HISTORY: usize = 20;

#[derive(Default)]
struct ThreadData {
    row: Option<ThreadRow>,
    states: Vec<(i64, StateRow)>,
    messages: Messages,
    /// key -> (row, recorded at); a row is kept as the text it came in (see `SharedJson`).
    ledger: HashMap<String, (SharedJson, f64)>,
}

/// A state row: the text its commit wrote, shared with the run that made it (a step costs no
/// copy), and the write mark inside it, so a commit checks the chain without decoding the text.
/// Reads decode it; they are the rare path (a start without a kept state, inspection).
struct StateRow {
    text: SharedJson,
    mark: Option<String>,
}

impl StateRow {
    fn value(&self) -> Value {
        serde_json::from_str(self.text.get()).unwrap_or_default()
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

/// The in-process store: the same contract as the durable backends (conformance suite), nothing
/// survives the process.
pub struct MemoryStore {
    inner: Mutex<Inner>,
    enforce_user_isolation: bool,
    unrecorded: UnrecordedResults,
}

impl MemoryStore {
    /// An empty store; `enforce_user_isolation` as in `PgOptions`.
    pub fn new(enforce_user_isolation: bool) -> Self {
        Self { inner: Mutex::new(Inner::default()), enforce_user_isolation, unrecorded: UnrecordedResults::default() }
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
fn record_rows(d: &mut ThreadData, entries: &[LedgerRow]) -> usize {
    let now = now_secs();
    let mut written = 0;
    for (key, result) in entries {
        let replaces_intent = d.ledger.get(key).is_some_and(|(v, _)| is_intent_text(v) && !is_intent_text(result));
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
fn unmark_latest(d: &mut ThreadData, after: Option<&super::ChangeMark>) {
    if let Some((_, s)) = d.states.last_mut() {
        let mark = super::changed_mark(after, s.mark.as_deref());
        // Rows are checked to decode when written (`marked_state`); one that did not would be
        // kept as it is rather than replaced by a null.
        if let Ok(mut v) = serde_json::from_str::<Value>(s.text.get()) {
            super::set_write_mark(&mut v, &mark);
            s.text = super::shared_json(&v);
        }
        s.mark = Some(mark);
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
        let latest_mark =
            inner.threads.get(&t.thread_id).and_then(|d| d.states.last()).and_then(|(_, s)| s.mark.as_deref());
        super::check_head(&w, t, current, latest_mark)?;
        let d = inner.threads.entry(t.thread_id.clone()).or_default();
        ensure_row(d, t);
        let new_version = current + 1;
        let (text, mark) = super::chained_state(&w, d.states.last().and_then(|(_, s)| s.mark.as_deref()));
        d.states.push((new_version, StateRow { text, mark: mark.map(str::to_owned) }));
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
}

#[async_trait]
impl Checkpointer for MemoryStore {
    fn isolates_users(&self) -> bool {
        self.enforce_user_isolation
    }

    fn unrecorded(&self) -> Option<&UnrecordedResults> {
        Some(&self.unrecorded)
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
            let messages_known = known.is_some_and(|k| k.matches_mark(*v, s.mark.as_deref()));
            Checkpoint {
                version: *v,
                state: s.value(),
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

    async fn put_step_with_ledger(&self, t: &ThreadRef, w: StepWrite<'_>, rows: &[LedgerRow]) -> StoreResult<i64> {
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
        self.unrecorded.forget_thread(&t.thread_id);
        Ok(())
    }

    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage], after: Option<&ChangeMark>) -> StoreResult<()> {
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
            unmark_latest(d, after);
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
        let needle = search.map(str::to_lowercase);
        let it = d
            .messages
            .iter()
            .filter(|m| needle.as_deref().is_none_or(|s| message_matches(&m.text, s)))
            .map(|m| m.text.clone());
        Ok(page(it, offset, limit))
    }

    async fn delete_message(&self, t: &ThreadRef, message_id: &str, after: Option<&ChangeMark>) -> StoreResult<bool> {
        id_text::check_ref(t)?;
        id_text::check_text_id("message_id", message_id)?;
        let mut inner = self.lock();
        let Some(d) = inner.threads.get_mut(&t.thread_id) else { return Ok(false) };
        self.check_owner(d, t)?;
        let deleted = d.messages.remove(message_id);
        if deleted {
            unmark_latest(d, after);
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
        let needle = search.map(str::to_lowercase);
        let inner = self.lock();
        let mut rows: Vec<ThreadRow> = inner
            .threads
            .values()
            .filter_map(|d| d.row.clone())
            .filter(|r| user_id.is_none_or(|u| r.user_id == u))
            .filter(|r| needle.as_deref().is_none_or(|s| thread_matches(r, s)))
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
        self.unrecorded.forget_thread(&t.thread_id);
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
                after.is_none_or(|a| id.as_str() > a)
                    && d.states.last().is_some_and(|(_, s)| is_running_state(&s.value()))
            })
            .filter_map(|(id, d)| d.row.as_ref().map(|r| ThreadRef::new(id.clone(), r.user_id.clone())))
            .collect();
        out.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
        out.truncate(limit.max(0) as usize);
        Ok(out)
    }

    async fn cache_put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()> {
        self.lock().cache_put(ns, key, value, ttl);
        Ok(())
    }

    async fn cache_put_absent(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<bool> {
        Ok(self.lock().cache_put_absent(ns, key, value, ttl))
    }

    async fn cache_get(&self, ns: &str, key: &str) -> StoreResult<Option<Value>> {
        Ok(self.lock().cache_get(ns, key))
    }

    async fn cache_clear(&self, ns: &str, key: &str) -> StoreResult<()> {
        self.lock().cache.remove(&(ns.to_owned(), key.to_owned()));
        Ok(())
    }

    async fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
        Ok(self.lock().cache_keys(ns, prefix))
    }

    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        id_text::check_ref(t)?;
        let inner = self.lock();
        let Some(d) = self.readable(&inner, t) else { return Ok(HashMap::new()) };
        Ok(keys.iter().filter_map(|k| d.ledger.get(k).map(|(v, _)| (k.clone(), super::decode_raw(v)))).collect())
    }

    async fn ledger_put_many(&self, t: &ThreadRef, entries: &[LedgerRow], fence: Option<i64>) -> StoreResult<usize> {
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
            if let Some(row) = d.ledger.get_mut(key).filter(|(v, _)| is_intent_text(v) && is_intent(mark)) {
                *row = (shared_json(mark), now);
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
        Ok(self.lock().renew_lease(thread_id, token, ttl))
    }

    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        id_text::check_text_id("thread_id", thread_id)?;
        self.lock().release_lease(thread_id, token);
        Ok(())
    }

    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        id_text::check_text_id("thread_id", thread_id)?;
        Ok(self.lock().leases.get(thread_id).map(LeaseRow::view))
    }

    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport> {
        Ok(self.lock().prune(rules))
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
            .map(|(k, (v, at))| super::LedgerEntry {
                key: k.clone(),
                result: Some(super::decode_raw(v)),
                created_at: Some(*at),
            })
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
            .map(|(v, s)| super::StateVersion { version: *v, created_at: None, state: s.value() })
            .collect())
    }
}
