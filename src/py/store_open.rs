//! Opening and closing the Rust stores behind `NativeStore`: the constructors' checks and
//! openers (a store connects and migrates on first use, not when it is made), and the registry
//! of open stores that interpreter exit closes.

use super::store::NativeStore;
use crate::store::{Checkpointer, LazyStore, MemoryStore, Opener, PgOptions, PgStore, SqliteStore, StoreError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Arc;

/// Every store opened in this process, so `shutdown()` can close their connections before the
/// interpreter finalizes: worker threads still running during process exit crashed it (SIGBUS).
static OPEN: std::sync::Mutex<Vec<std::sync::Weak<dyn Checkpointer>>> = std::sync::Mutex::new(Vec::new());

impl NativeStore {
    pub(super) fn register(inner: Arc<dyn Checkpointer>) -> Self {
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&inner));
        NativeStore { inner }
    }
}

pub(super) fn open_memory(enforce_user_isolation: bool) -> NativeStore {
    NativeStore::register(Arc::new(MemoryStore::new(enforce_user_isolation)))
}

pub(super) fn open_sqlite(path: String, enforce_user_isolation: bool, durable_sync: bool) -> NativeStore {
    let open: Opener = Box::new(move || {
        let path = path.clone();
        Box::pin(async move {
            let s = SqliteStore::open(&path, enforce_user_isolation, durable_sync).await?;
            s.setup().await?;
            Ok(Arc::new(s) as Arc<dyn Checkpointer>)
        })
    });
    NativeStore::register(Arc::new(LazyStore::new(enforce_user_isolation, open)))
}

/// `NativeStore.postgres`'s arguments, as Python passed them.
pub(super) struct PgArgs<'a> {
    pub(super) dsn: String,
    pub(super) redis_url: Option<String>,
    pub(super) schema: String,
    pub(super) max_connections: u32,
    pub(super) acquire_timeout: f64,
    pub(super) state_history_limit: i32,
    pub(super) enforce_user_isolation: bool,
    pub(super) cache_ttl: f64,
    pub(super) id_type: &'a str,
    pub(super) user_id_type: &'a str,
    pub(super) statement_timeout: f64,
    pub(super) lock_timeout: f64,
}

// `!(x > 0.0)` on purpose: it refuses NaN too, which `x <= 0.0` lets through.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub(super) fn open_postgres(args: PgArgs<'_>) -> PyResult<NativeStore> {
    let PgArgs {
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
    } = args;
    use crate::store::postgres::IdType;
    let id_type_of = |key: &str, v: &str| {
        IdType::parse(v)
            .ok_or_else(|| PyValueError::new_err(format!("{key} must be 'string', 'int' or 'bigint', not {v:?}")))
    };
    let (id_type, user_id_type) = (id_type_of("id_type", id_type)?, id_type_of("user_id_type", user_id_type)?);
    if max_connections == 0
        || !(acquire_timeout > 0.0)
        || !(cache_ttl > 0.0)
        || !(statement_timeout > 0.0)
        || !(lock_timeout > 0.0)
    {
        return Err(PyValueError::new_err(
            "max_connections, acquire_timeout, cache_ttl, statement_timeout and lock_timeout must be positive",
        ));
    }
    crate::store::postgres::validate_schema(&schema).map_err(|e| PyValueError::new_err(e.to_string()))?;
    <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(&dsn).map_err(|e| {
        PyValueError::new_err(format!("invalid postgres_dsn: {}", crate::store::postgres::redact(&e.to_string())))
    })?;
    if let Some(url) = redis_url.as_deref() {
        redis::Client::open(url).map_err(|e| {
            PyValueError::new_err(format!("invalid redis_url: {}", crate::store::postgres::redact(&e.to_string())))
        })?;
    }
    let opts = PgOptions {
        schema,
        max_connections,
        // Clamped as the other timeouts are: `inf` (or 1e300) panicked here, from the CLI's
        // --connect-timeout and from pool_config={"timeout": ...} alike.
        acquire_timeout: std::time::Duration::from_secs_f64(
            acquire_timeout.min(crate::engine::config::MAX_TIMEOUT_SECONDS),
        ),
        state_history_limit,
        enforce_user_isolation,
        id_type,
        user_id_type,
        statement_deadline: std::time::Duration::from_secs_f64(
            statement_timeout.min(crate::engine::config::MAX_TIMEOUT_SECONDS),
        ),
        lock_wait: std::time::Duration::from_secs_f64(lock_timeout.min(crate::engine::config::MAX_TIMEOUT_SECONDS)),
        ..PgOptions::default()
    };
    let ttl = std::time::Duration::from_secs_f64(cache_ttl.min(crate::engine::config::MAX_TIMEOUT_SECONDS));
    let open: Opener = Box::new(move || {
        let (dsn, redis_url, opts) = (dsn.clone(), redis_url.clone(), opts.clone());
        Box::pin(async move {
            let mut store = PgStore::connect(&dsn, redis_url.as_deref(), opts).await?;
            store.set_cache_ttl(ttl);
            Ok(Arc::new(store) as Arc<dyn Checkpointer>)
        })
    });
    Ok(NativeStore::register(Arc::new(LazyStore::new(enforce_user_isolation, open))))
}

pub(super) fn open_python(
    adapter: Py<PyAny>,
    event_loop: Py<PyAny>,
    context: Py<PyAny>,
    call_timeout: f64,
) -> PyResult<NativeStore> {
    // NaN too (the Python side refuses it first, with a typed error).
    if call_timeout.is_nan() || call_timeout <= 0.0 {
        return Err(PyValueError::new_err("call_timeout must be a positive number of seconds"));
    }
    let limit = std::time::Duration::from_secs_f64(call_timeout.min(crate::engine::config::MAX_TIMEOUT_SECONDS));
    let locals = super::bridge::Locals { event_loop, context };
    Ok(NativeStore::register(Arc::new(super::py_store::PyStore::new(adapter, locals, limit))))
}

/// Closes every open store (bounded: 2 s each). Called at interpreter exit.
pub fn close_all(py: Python<'_>) {
    let stores: Vec<Arc<dyn Checkpointer>> = {
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.drain(..).filter_map(|w| w.upgrade()).collect()
    };
    if stores.is_empty() || super::runtime::forked() {
        return; // a forked child's copies of its parent's stores have no runtime to close them on
    }
    py.detach(|| {
        pyo3_async_runtimes::tokio::get_runtime().block_on(async {
            for s in stores {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(3), close_store(&*s)).await;
            }
        })
    });
}

/// How long closing a store may spend recording the tool results it kept in memory.
const KEPT_RECORD_SECONDS: u64 = 2;

/// Records the kept tool results (`engine::record_kept`), then closes the store: the results die
/// with the process otherwise, and a resume elsewhere runs their calls again.
pub(super) async fn close_store(s: &dyn Checkpointer) -> Result<(), StoreError> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(KEPT_RECORD_SECONDS);
    if let Some(kept) = s.unrecorded() {
        kept.closing.store(true, std::sync::atomic::Ordering::Release);
    }
    crate::engine::record_kept(s, deadline, true).await;
    s.release().await
}
