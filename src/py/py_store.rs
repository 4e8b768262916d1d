//! `PyStore`: the Rust loop driving a checkpointer written in Python (a `BaseCheckpointer`
//! subclass), through `tenxgraph.storage.checkpointer.python_store.PythonStore`.
//!
//! The Python checkpointer is the source of truth; an in-process `MemoryStore` is the working copy
//! the loop's versioning, leases, intents and marks run on. A thread is read from Python the first
//! time this process touches it; every committed step and every recorded tool result is written
//! through to Python before the call returns, so a crash loses at most what the Python store
//! itself loses. When a write-through fails the thread is dropped from the working copy (the next
//! use reads it from Python again) and the error is the step's.

use super::bridge::{Locals, PyTask};
use crate::store::{
    ChangeMark, Checkpoint, Checkpointer, KnownHead, LeaseAttempt, LeaseInfo, LeaseRequest, LedgerEntry, MemoryStore,
    PruneReport, PruneRules, RawJson, StateVersion, StepWrite, StoreError, StoreResult, StoredMessage, ThreadRef,
    ThreadRow, is_intent, is_intent_text,
};
use async_trait::async_trait;
use pyo3::prelude::*;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

/// A `Checkpointer` over a checkpointer written in Python (see the module comment): a working
/// copy in memory, written through to Python on every commit.
pub struct PyStore {
    mem: MemoryStore,
    adapter: Py<PyAny>,
    locals: Locals,
    hydrated: Mutex<HashSet<(String, String)>>,
    /// How long one call into the Python checkpointer may take (its `call_timeout`).
    call_timeout: Duration,
}

impl PyStore {
    /// A store over the Python adapter `adapter`, called on `locals`' event loop.
    pub fn new(adapter: Py<PyAny>, locals: Locals, call_timeout: Duration) -> Self {
        PyStore { mem: MemoryStore::new(false), adapter, locals, hydrated: Mutex::new(HashSet::new()), call_timeout }
    }

    /// Awaits the coroutine `make` gets from the adapter (it runs on the adapter's own loop).
    async fn call<F>(&self, op: &'static str, make: F) -> StoreResult<Py<PyAny>>
    where
        F: for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
    {
        let task = Python::attach(|py| -> PyResult<PyTask> {
            let coro = make(self.adapter.bind(py))?;
            PyTask::start(py, &self.locals, coro)
        })
        .map_err(|e| StoreError::backend(op, e))?;
        // A method that never returns (a hung client, a lock) held the run for ever: the caller's
        // own wait_for was the only way out. A late answer is dropped; the next use of the thread
        // reads it from Python again.
        match tokio::time::timeout(self.call_timeout, task).await {
            Ok(r) => r.map_err(|e| from_python(op, e)),
            Err(_) => Err(StoreError::Transient {
                op,
                message: format!(
                    "the Python checkpointer did not answer within {:?} (its call_timeout)",
                    self.call_timeout
                ),
            }),
        }
    }

    fn key(t: &ThreadRef) -> (String, String) {
        (t.thread_id.clone(), t.user_id.clone())
    }

    fn forget(&self, t: &ThreadRef) {
        self.hydrated.lock().unwrap_or_else(|p| p.into_inner()).remove(&Self::key(t));
    }

    /// Reads the thread from Python into the working copy, once per process.
    async fn hydrate(&self, t: &ThreadRef) -> StoreResult<()> {
        if self.hydrated.lock().unwrap_or_else(|p| p.into_inner()).contains(&Self::key(t)) {
            return Ok(());
        }
        let (tid, uid) = Self::key(t);
        let got = self.call("load", move |a| a.call_method1("load", (tid, uid))).await?;
        let row: Option<(String, Vec<String>)> =
            Python::attach(|py| got.bind(py).extract()).map_err(|e: PyErr| StoreError::backend("load", e))?;
        // Each run start reads Python again (see load_with): the copy is replaced, not merged.
        self.mem.clear_state(t).await?;
        if let Some((state_json, messages)) = row {
            let state: Value = serde_json::from_str(&state_json).map_err(|e| StoreError::backend("load", e))?;
            let msgs = messages
                .iter()
                .map(|m| {
                    let data: Value = serde_json::from_str(m)?;
                    let id =
                        data.get("message_id").map(|v| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string()));
                    Ok(StoredMessage::new(id.unwrap_or_default(), &data))
                })
                .collect::<Result<Vec<_>, serde_json::Error>>()
                .map_err(|e| StoreError::backend("load", e))?;
            let (state, mark) = crate::store::state_row(&state);
            let w = StepWrite {
                expected_version: 0,
                state: &state,
                mark: mark.as_deref(),
                new_messages: &msgs,
                replace_messages: true,
                fence: None,
                release_lease: false,
                in_tx: None,
                previous_mark: None,
                expected_mark: None,
            };
            self.mem.put_step(t, w).await?;
        }
        self.hydrated.lock().unwrap_or_else(|p| p.into_inner()).insert(Self::key(t));
        Ok(())
    }

    /// Writes the thread's committed state (with its whole context) and the step's new messages.
    async fn save(&self, t: &ThreadRef, new_messages: &[StoredMessage]) -> StoreResult<()> {
        let Some(cp) = self.mem.load(t).await? else { return Ok(()) };
        let messages: Vec<String> = cp.messages.iter().map(|m| m.get().to_owned()).collect();
        let new: Vec<String> = new_messages.iter().map(|m| m.data.get().to_owned()).collect();
        let (tid, uid, state) = (t.thread_id.clone(), t.user_id.clone(), cp.state.to_string());
        self.call("save", move |a| a.call_method1("save", (tid, uid, state, messages, new))).await?;
        Ok(())
    }

    /// Recorded results the Python ledger holds for `keys`.
    async fn python_ledger(&self, t: &ThreadRef, keys: Vec<String>) -> StoreResult<HashMap<String, Value>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let (tid, uid) = Self::key(t);
        let got = self.call("ledger_get", move |a| a.call_method1("ledger_get", (tid, uid, keys))).await?;
        let rows: HashMap<String, String> =
            Python::attach(|py| got.bind(py).extract()).map_err(|e: PyErr| StoreError::backend("ledger_get", e))?;
        rows.into_iter()
            .map(|(k, v)| Ok((k, serde_json::from_str(&v).map_err(|e| StoreError::backend("ledger_get", e))?)))
            .collect()
    }
}

#[async_trait]
impl Checkpointer for PyStore {
    async fn setup(&self) -> StoreResult<()> {
        Ok(())
    }
    fn unrecorded(&self) -> Option<&crate::store::UnrecordedResults> {
        self.mem.unrecorded()
    }
    async fn load_with(&self, t: &ThreadRef, known: Option<KnownHead<'_>>) -> StoreResult<Option<Checkpoint>> {
        // A run starts here: read the thread from Python again, so writes made through the
        // checkpointer's own methods since the last run are what this run sees. Not while a run
        // of this process holds the thread: the working copy is ahead of nothing then, and
        // reading it again reset its version under that run (a second turn that was refused as
        // busy made the running one fail with STORAGE_CONFLICT_001 at its next commit).
        let held = matches!(self.mem.lease_get(&t.thread_id).await, Ok(Some(info)) if info.is_live());
        if !held {
            self.forget(t);
        }
        self.hydrate(t).await?;
        self.mem.load_with(t, known).await
    }
    async fn put_step(&self, t: &ThreadRef, w: StepWrite<'_>) -> StoreResult<i64> {
        self.hydrate(t).await?;
        let version = self.mem.put_step(t, w).await?;
        if let Err(e) = self.save(t, w.new_messages).await {
            // Python did not take the step: the working copy must not claim it did.
            let _ = self.mem.clear_state(t).await;
            self.forget(t);
            return Err(e);
        }
        Ok(version)
    }
    async fn put_input_leased(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<crate::store::StopKey<'_>>,
    ) -> StoreResult<crate::store::LeasedInput> {
        // Leases live in the working copy, so the take and the step are one change of it; the
        // Python checkpointer then gets the step as from `put_step`.
        self.hydrate(t).await?;
        let done = self.mem.put_input_leased(t, req, w, stop).await?;
        if let crate::store::LeasedInput::Committed { token, .. } = done
            && let Err(e) = self.save(t, w.new_messages).await
        {
            let _ = self.mem.clear_state(t).await;
            self.forget(t);
            let _ = self.mem.lease_release(&t.thread_id, token).await;
            return Err(e);
        }
        Ok(done)
    }
    async fn clear_state(&self, t: &ThreadRef) -> StoreResult<()> {
        self.forget(t);
        self.mem.clear_state(t).await
    }
    async fn put_messages(&self, t: &ThreadRef, msgs: &[StoredMessage], after: Option<&ChangeMark>) -> StoreResult<()> {
        self.hydrate(t).await?;
        self.mem.put_messages(t, msgs, after).await?;
        self.save(t, msgs).await
    }
    async fn get_message(&self, t: &ThreadRef, message_id: &str) -> StoreResult<Option<RawJson>> {
        self.hydrate(t).await?;
        self.mem.get_message(t, message_id).await
    }
    async fn list_messages(
        &self,
        t: &ThreadRef,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<RawJson>> {
        self.hydrate(t).await?;
        self.mem.list_messages(t, search, offset, limit).await
    }
    async fn delete_message(&self, t: &ThreadRef, message_id: &str, after: Option<&ChangeMark>) -> StoreResult<bool> {
        self.mem.delete_message(t, message_id, after).await
    }
    async fn put_thread(&self, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
        self.mem.put_thread(t, name, meta).await
    }
    async fn get_thread(&self, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
        self.mem.get_thread(t).await
    }
    async fn list_threads(
        &self,
        user_id: Option<&str>,
        search: Option<&str>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<ThreadRow>> {
        self.mem.list_threads(user_id, search, offset, limit).await
    }
    async fn clean_thread(&self, t: &ThreadRef) -> StoreResult<()> {
        self.forget(t);
        self.mem.clean_thread(t).await
    }
    async fn thread_owner(&self, thread_id: &str) -> StoreResult<Option<String>> {
        self.mem.thread_owner(thread_id).await
    }
    async fn running_threads(&self, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
        // The checkpointer's own threads: the working copy holds only what this process touched,
        // nothing after a restart, when a recovery pass is wanted.
        let after_arg = after.map(str::to_owned);
        let got = self.call("running_threads", move |a| a.call_method1("running_threads", (after_arg, limit))).await?;
        let pairs: Vec<(String, String)> = Python::attach(|py| got.bind(py).extract())
            .map_err(|e: PyErr| StoreError::backend("running_threads", e))?;
        Ok(pairs.into_iter().map(|(thread, user)| ThreadRef::new(thread, user)).collect())
    }
    async fn cache_put_absent(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<bool> {
        self.mem.cache_put_absent(ns, key, value, ttl).await
    }
    async fn cache_put(&self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> StoreResult<()> {
        self.mem.cache_put(ns, key, value, ttl).await
    }
    async fn cache_get(&self, ns: &str, key: &str) -> StoreResult<Option<Value>> {
        self.mem.cache_get(ns, key).await
    }
    async fn cache_clear(&self, ns: &str, key: &str) -> StoreResult<()> {
        self.mem.cache_clear(ns, key).await
    }
    async fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> StoreResult<Vec<String>> {
        self.mem.cache_keys(ns, prefix).await
    }
    async fn ledger_get(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        let mut found = self.mem.ledger_get(t, keys).await?;
        // Results this process has not seen (an earlier process recorded them) are in Python.
        let ask: Vec<String> = keys.iter().filter(|k| found.get(*k).is_none_or(is_intent)).cloned().collect();
        for (k, v) in self.python_ledger(t, ask).await? {
            found.insert(k, v);
        }
        Ok(found)
    }
    async fn ledger_put_many(
        &self,
        t: &ThreadRef,
        entries: &[crate::store::LedgerRow],
        fence: Option<i64>,
    ) -> StoreResult<usize> {
        let written = self.mem.ledger_put_many(t, entries, fence).await?;
        // Intent records stay in process: the Python ledger holds results only.
        let results: Vec<(String, String)> =
            entries.iter().filter(|(_, v)| !is_intent_text(v)).map(|(k, v)| (k.clone(), v.get().to_owned())).collect();
        if !results.is_empty() {
            let (tid, uid) = Self::key(t);
            self.call("ledger_put", move |a| a.call_method1("ledger_put", (tid, uid, results))).await?;
        }
        Ok(written)
    }
    async fn ledger_mark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        self.mem.ledger_mark(t, marks, fence).await
    }
    async fn lease_acquire(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        self.mem.lease_acquire(thread_id, req).await
    }
    async fn lease_renew(&self, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
        self.mem.lease_renew(thread_id, token, ttl).await
    }
    async fn lease_release(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        self.mem.lease_release(thread_id, token).await
    }
    async fn lease_get(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        self.mem.lease_get(thread_id).await
    }
    async fn prune(&self, rules: &PruneRules) -> StoreResult<PruneReport> {
        self.mem.prune(rules).await
    }
    async fn release(&self) -> StoreResult<()> {
        self.mem.release().await
    }
    async fn ledger_list(&self, t: &ThreadRef) -> StoreResult<Vec<LedgerEntry>> {
        self.mem.ledger_list(t).await
    }
    async fn state_versions(&self, t: &ThreadRef) -> StoreResult<Vec<StateVersion>> {
        self.mem.state_versions(t).await
    }
}

/// A Python checkpointer's failure as a store error: its `TransientStorageError` is transient
/// (a write the engine may try again), anything else a backend failure carrying the exception.
fn from_python(op: &'static str, e: PyErr) -> StoreError {
    let transient = Python::attach(|py| {
        let class = py.import("tenxgraph.core.exceptions").and_then(|m| m.getattr("TransientStorageError"));
        class.is_ok_and(|c| e.is_instance(py, &c)).then(|| e.value(py).to_string())
    });
    match transient {
        Some(message) => StoreError::Transient { op, message },
        None => StoreError::backend(op, e),
    }
}
