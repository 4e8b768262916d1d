//! `NativeStore`: the Rust checkpointers behind the Python `*Checkpointer` classes. JSON crosses as
//! text; every method returns an awaitable polled on the awaiting loop (src/py/driver.rs).
//!
//! pyo3 (without its `multiple-pymethods` feature, which needs `inventory` and costs start-up
//! time) takes one `#[pymethods]` block per class, so every method is here, each a thin
//! conversion to one `Checkpointer` call: opening and closing stores is in `store_open.rs`, the
//! conversions they share in `store_convert.rs`.

use super::errors::store_err;
use super::store_convert::{awaitable, cache_ttl, change_mark, json_in, messages_in, put_one, row_in, t, thread_out};
use super::store_open::{PgArgs, close_store, open_memory, open_postgres, open_python, open_sqlite};
use crate::engine::{STOP_NAMESPACE, StopSignals, stop_key};
use crate::store::{Checkpointer, StepWrite};
use pyo3::prelude::*;
use serde_json::Value;
use std::sync::Arc;

/// A Rust store (memory, SQLite, Postgres, or a Python checkpointer) as the Python checkpointers
/// call it.
#[pyclass(module = "tenxgraph._core", frozen)]
pub struct NativeStore {
    /// The store every call goes to.
    pub inner: Arc<dyn Checkpointer>,
}

#[pymethods]
impl NativeStore {
    #[staticmethod]
    fn memory(enforce_user_isolation: bool) -> Self {
        open_memory(enforce_user_isolation)
    }

    /// A SQLite store that opens the file (or ":memory:") and migrates it on first use, as
    /// 10xGraph's does: constructing one no longer starts the runtime, so a module-level
    /// checkpointer imported before a fork (gunicorn --preload) works in the forked workers.
    #[staticmethod]
    fn sqlite(path: String, enforce_user_isolation: bool, durable_sync: bool) -> Self {
        open_sqlite(path, enforce_user_isolation, durable_sync)
    }

    /// A Postgres store (with Redis when a URL is given) that connects and migrates on first use,
    /// not here: a module-level checkpointer must import while the database is down. The DSN,
    /// schema name and Redis URL are checked now (no I/O), so a typo still fails at once.
    #[staticmethod]
    #[pyo3(signature = (dsn, redis_url, schema, max_connections=10, acquire_timeout=10.0, state_history_limit=20, enforce_user_isolation=true, cache_ttl=86400.0, id_type="string", user_id_type="string", statement_timeout=30.0, lock_timeout=5.0))]
    #[allow(clippy::too_many_arguments)]
    fn postgres(
        dsn: String,
        redis_url: Option<String>,
        schema: String,
        max_connections: u32,
        acquire_timeout: f64,
        state_history_limit: i32,
        enforce_user_isolation: bool,
        cache_ttl: f64,
        id_type: &str,
        user_id_type: &str,
        statement_timeout: f64,
        lock_timeout: f64,
    ) -> PyResult<Self> {
        open_postgres(PgArgs {
            dsn,
            redis_url,
            schema,
            max_connections,
            acquire_timeout,
            state_history_limit,
            enforce_user_isolation,
            cache_ttl,
            id_type,
            user_id_type,
            statement_timeout,
            lock_timeout,
        })
    }

    /// The store of a checkpointer written in Python: `adapter` is a
    /// `tenxgraph.storage.checkpointer.python_store.PythonStore`, whose coroutines run on
    /// `event_loop` (its own thread) in `context`.
    #[staticmethod]
    #[pyo3(signature = (adapter, event_loop, context, call_timeout=30.0))]
    fn python(adapter: Py<PyAny>, event_loop: Py<PyAny>, context: Py<PyAny>, call_timeout: f64) -> PyResult<Self> {
        open_python(adapter, event_loop, context, call_timeout)
    }

    /// Version-guarded state cache: `(version, state_json)` or None.
    fn state_cache_get<'py>(&self, py: Python<'py>, thread_id: String, user_id: String) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(
            py,
            async move { Ok(s.state_cache_get(&t(thread_id, user_id)).await?.map(|(v, d)| (v, d.to_string()))) },
        )
    }

    fn state_cache_put<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        version: i64,
        state_json: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let v = json_in(&state_json)?;
        awaitable(py, async move { s.state_cache_put(&t(thread_id, user_id), version, &v).await })
    }

    fn state_cache_clear<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { s.state_cache_clear(&t(thread_id, user_id)).await.map(|_| true) })
    }

    /// `(version, state_json, [message_json])` or None.
    #[pyo3(signature = (thread_id, user_id, owner_scoped=false))]
    fn load<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            let cp = s.load(&t(thread_id, user_id).scoped(owner_scoped)).await?;
            Ok(cp.map(|c| {
                (c.version, c.state.to_string(), c.messages.iter().map(|m| m.get().to_owned()).collect::<Vec<_>>())
            }))
        })
    }

    /// One versioned step written outside a run (`aput_state` / `aput_checkpoint`).
    /// `expected_mark`: the write mark of the row the caller read ("" for none); the write is
    /// refused (StaleStateError) when the latest row carries another (`StepWrite::expected_mark`).
    #[pyo3(signature = (thread_id, user_id, expected_version, state_json, messages, replace_messages=false, owner_scoped=false, expected_mark=None))]
    #[allow(clippy::too_many_arguments)]
    fn put_step<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        expected_version: i64,
        state_json: String,
        messages: Vec<(String, String)>,
        replace_messages: bool,
        owner_scoped: bool,
        expected_mark: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let value = json_in(&state_json)?;
        let (state, mark) = crate::store::state_row(&value);
        let msgs = messages_in(messages)?;
        awaitable(py, async move {
            let w = StepWrite {
                expected_version,
                state: &state,
                mark: mark.as_deref(),
                new_messages: &msgs,
                replace_messages,
                fence: None,
                release_lease: false,
                in_tx: None,
                previous_mark: None,
                expected_mark: expected_mark.as_deref(),
            };
            s.put_step(&t(thread_id, user_id).scoped(owner_scoped), w).await
        })
    }

    #[pyo3(signature = (thread_id, user_id, owner_scoped=false))]
    fn clear_state<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { s.clear_state(&t(thread_id, user_id).scoped(owner_scoped)).await.map(|_| true) })
    }

    /// `after`: `(the mark the caller read, a new mark of its own)` (`ChangeMark`).
    #[pyo3(signature = (thread_id, user_id, messages, owner_scoped=false, after=None))]
    fn put_messages<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        messages: Vec<(String, String)>,
        owner_scoped: bool,
        after: Option<(String, String)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let msgs = messages_in(messages)?;
        let after = change_mark(after)?;
        awaitable(py, async move {
            s.put_messages(&t(thread_id, user_id).scoped(owner_scoped), &msgs, after.as_ref()).await.map(|_| msgs.len())
        })
    }

    #[pyo3(signature = (thread_id, user_id, message_id, owner_scoped=false))]
    fn get_message<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        message_id: String,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            Ok(s.get_message(&t(thread_id, user_id).scoped(owner_scoped), &message_id)
                .await?
                .map(|v| v.get().to_owned()))
        })
    }

    #[pyo3(signature = (thread_id, user_id, search=None, offset=None, limit=None, owner_scoped=false))]
    #[allow(clippy::too_many_arguments)]
    fn list_messages<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        search: Option<String>,
        offset: Option<i64>,
        limit: Option<i64>,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            let v =
                s.list_messages(&t(thread_id, user_id).scoped(owner_scoped), search.as_deref(), offset, limit).await?;
            Ok(v.iter().map(|m| m.get().to_owned()).collect::<Vec<_>>())
        })
    }

    /// `after`: as for `put_messages`.
    #[pyo3(signature = (thread_id, user_id, message_id, owner_scoped=false, after=None))]
    fn delete_message<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        message_id: String,
        owner_scoped: bool,
        after: Option<(String, String)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let after = change_mark(after)?;
        awaitable(py, async move {
            s.delete_message(&t(thread_id, user_id).scoped(owner_scoped), &message_id, after.as_ref()).await
        })
    }

    #[pyo3(signature = (thread_id, user_id, name, meta_json, owner_scoped=false))]
    fn put_thread<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        name: Option<String>,
        meta_json: String,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let meta = json_in(&meta_json)?;
        awaitable(
            py,
            async move { s.put_thread(&t(thread_id, user_id).scoped(owner_scoped), name.as_deref(), &meta).await },
        )
    }

    #[pyo3(signature = (thread_id, user_id, owner_scoped=false))]
    fn get_thread<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(
            py,
            async move { Ok(s.get_thread(&t(thread_id, user_id).scoped(owner_scoped)).await?.map(thread_out)) },
        )
    }

    #[pyo3(signature = (user_id=None, search=None, offset=None, limit=None))]
    fn list_threads<'py>(
        &self,
        py: Python<'py>,
        user_id: Option<String>,
        search: Option<String>,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            let rows = s.list_threads(user_id.as_deref(), search.as_deref(), offset, limit).await?;
            Ok(rows.into_iter().map(thread_out).collect::<Vec<_>>())
        })
    }

    #[pyo3(signature = (thread_id, user_id, owner_scoped=false))]
    fn clean_thread<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { s.clean_thread(&t(thread_id, user_id).scoped(owner_scoped)).await.map(|_| true) })
    }

    /// The thread's owner. With `user_id`, as that user may see it: under user isolation the
    /// owner's name only to the owner (None to anybody else, as for a thread that does not
    /// exist). Without, for operators (the CLI).
    /// `owner_scoped` (a `config["authz"]` owner scope) hides it as isolation does: the scope was
    /// checked in Python alone, before this read, and a thread created in between was named.
    #[pyo3(signature = (thread_id, user_id=None, owner_scoped=false))]
    fn thread_owner<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: Option<String>,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            let owner = s.thread_owner(&thread_id).await?;
            Ok(match user_id {
                Some(u) if (s.isolates_users() || owner_scoped) && owner.as_deref() != Some(u.as_str()) => None,
                _ => owner,
            })
        })
    }

    /// Whether the store keeps threads private to their owner.
    #[getter]
    fn isolates_users(&self) -> bool {
        self.inner.isolates_users()
    }

    #[pyo3(signature = (namespace, key, value_json, ttl_seconds=None))]
    fn cache_put<'py>(
        &self,
        py: Python<'py>,
        namespace: String,
        key: String,
        value_json: String,
        ttl_seconds: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let v = json_in(&value_json)?;
        let ttl = cache_ttl(ttl_seconds)?;
        awaitable(py, async move { s.cache_put(&namespace, &key, &v, ttl).await.map(|_| true) })
    }

    fn cache_get<'py>(&self, py: Python<'py>, namespace: String, key: String) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { Ok(s.cache_get(&namespace, &key).await?.map(|v| v.to_string())) })
    }

    fn cache_clear<'py>(&self, py: Python<'py>, namespace: String, key: String) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { s.cache_clear(&namespace, &key).await.map(|_| true) })
    }

    #[pyo3(signature = (namespace, prefix=None))]
    fn cache_keys<'py>(
        &self,
        py: Python<'py>,
        namespace: String,
        prefix: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { s.cache_keys(&namespace, prefix.as_deref()).await })
    }

    /// Refuses ids this store cannot hold (`Checkpointer::check_ids`): for the stop-request calls,
    /// whose keys reach no thread row.
    fn check_ids<'py>(&self, py: Python<'py>, thread_id: String, user_id: String) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { s.check_ids(&t(thread_id, user_id)).await })
    }

    /// Records a stop request and wakes a run of this process at once. With `token`, only the
    /// run holding that lease token obeys it (`stop()` names the run it saw).
    #[pyo3(signature = (thread_id, user_id, token=None))]
    fn request_stop<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        token: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            s.check_ids(&t(thread_id.clone(), user_id.clone())).await?;
            let key = stop_key(&thread_id, &user_id);
            let value = token.map_or(Value::Bool(true), |n| serde_json::json!({"stop": true, "token": n}));
            s.cache_put(STOP_NAMESPACE, &key, &value, Some(3600.0)).await?;
            StopSignals::global().signal(&key);
            Ok(true)
        })
    }

    /// `{key: result_json}` for the keys that have a record.
    #[pyo3(signature = (thread_id, user_id, keys, owner_scoped=false))]
    fn ledger_get<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        keys: Vec<String>,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            let m = s.ledger_get(&t(thread_id, user_id).scoped(owner_scoped), &keys).await?;
            Ok(m.into_iter().map(|(k, v)| (k, v.to_string())).collect::<std::collections::HashMap<_, _>>())
        })
    }

    /// Records one tool result; true when this call inserted it. `late`: a run's result recorded
    /// after the run stopped waiting for it: no lease token is checked (the side effect happened,
    /// whoever holds the thread now), but the thread must still exist (`THREAD_MUST_EXIST`), so a
    /// thread deleted meanwhile is not created again; the refusal is `LeaseLostError`.
    #[pyo3(signature = (thread_id, user_id, key, result_json, owner_scoped=false, late=false))]
    #[allow(clippy::too_many_arguments)]
    fn ledger_put<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        key: String,
        result_json: String,
        owner_scoped: bool,
        late: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let row = row_in(key, result_json)?;
        awaitable(py, async move { put_one(&*s, &t(thread_id, user_id).scoped(owner_scoped), row, late).await })
    }

    /// One page of recovery's candidates (`engine::recovery_candidates`): threads whose latest
    /// state is running, by thread id after `after`, as `[(thread_id, owner, live_holder_json |
    /// None, refused | None)]`; a None holder means no live run holds the thread (its run died);
    /// `refused` is why the store refuses the thread's id (it cannot be resumed here).
    #[pyo3(signature = (after=None, limit=100))]
    fn recovery_candidates<'py>(
        &self,
        py: Python<'py>,
        after: Option<String>,
        limit: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            let page = crate::engine::recovery_candidates(&*s, after.as_deref(), limit).await?;
            Ok(page
                .into_iter()
                .map(|c| {
                    let holder = c.holder.map(|h| serde_json::to_string(&h).unwrap_or_default());
                    (c.thread.thread_id, c.thread.user_id, holder, c.refused)
                })
                .collect::<Vec<_>>())
        })
    }

    /// Why the last `recovery_candidates` page could not list every unfinished run (10xGraph's
    /// Redis entries did not answer); None when it saw everything.
    fn recovery_unlisted(&self) -> Option<String> {
        self.inner.running_threads_unlisted()
    }

    /// `ledger_put(late=True)` for a worker thread with no event loop: a sync tool's result that
    /// arrived after its run gave up on it (deadline, stop). Blocks the calling thread (detached)
    /// for at most `timeout` seconds; never call it on an event loop's thread. No token checked on
    /// purpose: the side effect happened whoever holds the thread now, and the first result
    /// recorded wins; a thread deleted meanwhile stays deleted. True when this call inserted it.
    #[pyo3(signature = (thread_id, user_id, key, result_json, timeout=30.0))]
    fn ledger_put_blocking(
        &self,
        py: Python<'_>,
        thread_id: String,
        user_id: String,
        key: String,
        result_json: String,
        timeout: f64,
    ) -> PyResult<bool> {
        super::runtime::check_not_forked(py)?;
        let s = self.inner.clone();
        let row = row_in(key, result_json)?;
        let limit =
            std::time::Duration::from_secs_f64(if timeout.is_finite() && timeout > 0.0 { timeout } else { 30.0 });
        let r = py.detach(|| {
            pyo3_async_runtimes::tokio::get_runtime()
                .block_on(async { tokio::time::timeout(limit, put_one(&*s, &t(thread_id, user_id), row, true)).await })
        });
        match r {
            Ok(Ok(inserted)) => Ok(inserted),
            Ok(Err(e)) => Err(store_err(py, e)),
            Err(_) => {
                Err(pyo3::exceptions::PyTimeoutError::new_err(format!("ledger write did not finish within {limit:?}")))
            }
        }
    }

    /// The thread's lease as JSON (`LeaseInfo`), or None when it never had one. With `user_id`,
    /// None also when that user may not see it (`Checkpointer::is_owner`); without, for operators.
    #[pyo3(signature = (thread_id, user_id=None, owner_scoped=false))]
    fn lease_get<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: Option<String>,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            // A thread that does not exist yet is nobody's: one created after this check is
            // not read either.
            if let Some(u) = user_id
                && !s.is_owner(&t(thread_id.clone(), u).scoped(owner_scoped)).await?
            {
                return Ok(None);
            }
            let info = s.lease_get(&thread_id).await?;
            Ok(info.map(|i| serde_json::to_string(&i).unwrap_or_default()))
        })
    }

    /// Retention (`PruneRules`); resolves to the `PruneReport` as JSON.
    #[pyo3(signature = (keep_versions=None, finished_older_than=None, ledger_ttl=None, dry_run=false))]
    fn prune<'py>(
        &self,
        py: Python<'py>,
        keep_versions: Option<i64>,
        finished_older_than: Option<f64>,
        ledger_ttl: Option<f64>,
        dry_run: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let rules = crate::store::PruneRules { keep_versions, finished_older_than, ledger_ttl, dry_run };
        awaitable(py, async move {
            // Its transactions hold row locks: run to their end even if the caller's loop stops
            // for good (`store::task`), and give their connection back.
            let report = crate::store::task::to_the_end("prune", async move { s.prune(&rules).await }).await?;
            Ok(serde_json::to_string(&report).unwrap_or_default())
        })
    }

    /// Opens a lazily opened store (connect, migrate) and runs its migrations; resolves to True.
    fn setup<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        // Migrations hold the schema's lock that every other process's setup waits for.
        awaitable(py, async move {
            crate::store::task::to_the_end("setup", async move { s.setup().await }).await.map(|_| true)
        })
    }

    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { close_store(&*s).await.map(|_| true) })
    }

    /// Every ledger row of the thread, oldest first: `[(key, result_json | None, created_at | None)]`.
    #[pyo3(signature = (thread_id, user_id, owner_scoped=false))]
    fn ledger_list<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            let rows = s.ledger_list(&t(thread_id, user_id).scoped(owner_scoped)).await?;
            Ok(rows.into_iter().map(|r| (r.key, r.result.map(|v| v.to_string()), r.created_at)).collect::<Vec<_>>())
        })
    }

    /// Stored state versions, newest first: `[(version, created_at | None, state_json)]`.
    #[pyo3(signature = (thread_id, user_id, owner_scoped=false))]
    fn state_versions<'py>(
        &self,
        py: Python<'py>,
        thread_id: String,
        user_id: String,
        owner_scoped: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move {
            let rows = s.state_versions(&t(thread_id, user_id).scoped(owner_scoped)).await?;
            Ok(rows.into_iter().map(|r| (r.version, r.created_at, r.state.to_string())).collect::<Vec<_>>())
        })
    }

    /// The applied schema version (None for the in-memory store).
    fn schema_version<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        awaitable(py, async move { s.schema_version().await })
    }
}
