//! PyO3 bindings: the `tenxgraph._core` extension module.

mod boundary;
mod bridge;
mod driver;
mod dump_walk;
mod errors;
mod graph;
mod host;
mod kept_state;
mod logging;
mod options;
mod pid;
mod py_store;
mod runtime;
mod store;
mod store_convert;
mod store_open;

use pyo3::prelude::*;

/// The extension module `tenxgraph._core`: the graph, the stores, run options and the shared rules.
#[pymodule]
pub mod _core {
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::boundary::{ExecView, NodeResult};
    #[pymodule_export]
    use super::bridge::Completion;
    #[pymodule_export]
    use super::driver::Driver;
    #[pymodule_export]
    use super::graph::NativeGraph;
    #[pymodule_export]
    use super::kept_state::KeptState;
    #[pymodule_export]
    use super::options::RunOptions;
    #[pymodule_export]
    use super::store::NativeStore;

    /// The host's word that the cancelled run `run_id` on `thread_id` has written its late
    /// results (the tools that returned before the cancel): its lease, parked when the run's
    /// future was dropped, is released now (see src/engine/run_loop/abandoned.rs). `entered`:
    /// the ledger keys of the calls whose tools it started (the others never ran).
    #[pyfunction]
    #[pyo3(signature = (thread_id, run_id, entered=None))]
    fn release_abandoned(
        py: Python<'_>,
        thread_id: &str,
        run_id: &str,
        entered: Option<std::collections::HashSet<String>>,
    ) {
        let _enter = pyo3_async_runtimes::tokio::get_runtime().enter();
        py.detach(|| crate::engine::release_abandoned(thread_id, run_id, entered));
    }

    /// The socket the event loops of this thread watch (`add_reader`, once per loop) for
    /// native awaitables woken from another thread (see src/py/driver.rs).
    #[pyfunction]
    fn wake_hub_fileno() -> PyResult<i32> {
        super::driver::hub_fileno()
    }

    /// The reader callback of `wake_hub_fileno()`'s socket `fd`: polls every native awaitable of
    /// this thread woken from another thread since the last call. When `fd` is no longer this
    /// thread's socket (the loop awaited on a thread that has ended), the running loop stops
    /// watching it instead.
    #[pyfunction]
    fn wake_hub_run(py: Python<'_>, fd: i32) -> PyResult<()> {
        super::driver::hub_run(py, fd)
    }

    /// `(nonfinite, reshaped)` for `value` (dicts, lists, tuples, sets, pydantic models,
    /// dataclasses; `skip` names a top-level field left out): the path and text of the first NaN
    /// or infinite float, or None, which `tenxgraph._state_codec` refuses before a dump could
    /// write it as `null`; and whether a load of its JSON would give back something else (a
    /// tuple, an int key, a datetime where the model declares `Any`), which keeps a run's state
    /// out of the live states.
    ///
    /// `exact_ints`: an int past 64 bits is a find too, with the text `"an integer past 64 bits"`
    /// (a state: the engine would store it as a float).
    #[pyfunction]
    #[pyo3(signature = (value, skip=None, exact_ints=false))]
    fn dump_walk(
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        skip: Option<&str>,
        exact_ints: bool,
    ) -> PyResult<(Option<(String, String)>, bool)> {
        let found = super::dump_walk::walk(py, value, skip, exact_ints)?;
        Ok((found.nonfinite, found.reshaped))
    }

    /// Process-wide counters: `{metric name: value}`.
    #[pyfunction]
    fn metrics_snapshot() -> std::collections::HashMap<&'static str, f64> {
        crate::metrics::metrics().snapshot().into_iter().collect()
    }

    /// The stored ledger keys a user's key may name, most literal first (see
    /// `engine::ledger::lookup_keys`): 10xGraph's `"<message id>:<call id>"` form finds rows
    /// recorded under today's keys.
    #[pyfunction]
    fn ledger_lookup_keys(key: &str) -> Vec<String> {
        crate::engine::ledger::lookup_keys(key)
    }

    /// 10xGraph's timeout rule, the one the loop applies (`engine::resolve_timeout`): missing ->
    /// `default`; None or <= 0 -> no deadline; a bool, a non-number or NaN -> a warning and
    /// `default`.
    #[pyfunction]
    #[pyo3(signature = (config, key, default))]
    fn resolve_timeout(
        config: &Bound<'_, pyo3::types::PyDict>,
        key: &str,
        default: Option<f64>,
    ) -> PyResult<Option<f64>> {
        super::options::timeout_from(config, key, default)
    }

    /// The cache key of a thread's stop request, under `STOP_NAMESPACE`; ids the stores refuse
    /// (`store::id_text`) are refused here too, the same way.
    #[pyfunction]
    fn stop_key(py: Python<'_>, thread_id: &Bound<'_, PyAny>, user_id: &Bound<'_, PyAny>) -> PyResult<String> {
        let (thread_id, user_id) = (text_id("thread_id", thread_id)?, text_id("user_id", user_id)?);
        crate::store::id_text::check_ref(&crate::store::ThreadRef::new(thread_id.as_str(), user_id.as_str()))
            .map_err(|e| super::errors::store_err(py, e))?;
        Ok(crate::engine::stop_key(&thread_id, &user_id))
    }

    /// `str(value)` as the id `field` (`thread_id`, `user_id`, `message_id`) is stored: the
    /// text a run's config gives, refused with `InvalidConfigError` `STORAGE_CONFIG_002` where a
    /// store would refuse it (length, NUL) or when it is not valid Unicode (a lone surrogate), as
    /// every entry point refuses it.
    #[pyfunction]
    fn text_id(field: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
        let field = match field {
            "thread_id" => "thread_id",
            "user_id" => "user_id",
            "message_id" => "message_id",
            _ => "id",
        };
        super::options::id_text(field, value)
    }

    /// Called at interpreter exit: Rust threads must not call into a finalizing interpreter, so
    /// Rust logs stop reaching Python from here on.
    #[pyfunction]
    fn shutdown(py: Python<'_>) {
        log::set_max_level(log::LevelFilter::Off);
        super::store_open::close_all(py);
    }

    /// Forgets the cached Python loggers and their levels, so Rust records follow a logging
    /// configuration changed after the first Rust record of a logger.
    #[pyfunction]
    fn reset_log_cache() {
        if let Some(handle) = LOG_RESET.get() {
            handle.reset();
        }
    }

    static LOG_RESET: std::sync::OnceLock<pyo3_log::ResetHandle> = std::sync::OnceLock::new();

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        // Rust `tracing`/`log` records become Python `logging` records under "tenxgraph.*", with
        // their structured fields as LogRecord attributes (see logging.rs).
        if let Ok(handle) = pyo3_log::Logger::new(m.py(), pyo3_log::Caching::LoggersAndLevels)?.install() {
            let _ = LOG_RESET.set(handle);
        }
        super::logging::install();
        super::runtime::configure();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("PG_SCHEMA_VERSION", crate::store::postgres::CURRENT_VERSION)?;
        // Rules the engine or the store own; the Python side reads them here.
        use crate::engine::config as c;
        m.add("DEFAULT_NODE_TIMEOUT_SECONDS", c::DEFAULT_NODE_TIMEOUT_SECONDS)?;
        m.add("DEFAULT_TOOL_TIMEOUT_SECONDS", c::DEFAULT_TOOL_TIMEOUT_SECONDS)?;
        m.add("DEFAULT_BUSY_TIMEOUT_SECONDS", c::DEFAULT_BUSY_TIMEOUT_SECONDS)?;
        m.add("DEFAULT_LEASE_TTL_SECONDS", c::DEFAULT_LEASE_TTL_SECONDS)?;
        m.add("DEFAULT_RECURSION_LIMIT", c::DEFAULT_RECURSION_LIMIT)?;
        m.add("STATE_META_KEY", crate::store::STATE_META_KEY)?;
        m.add("INTENT_KIND", crate::store::INTENT_KIND)?;
        m.add("STOP_NAMESPACE", crate::engine::STOP_NAMESPACE)?;
        Ok(())
    }
}
