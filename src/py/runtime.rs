//! The tokio runtime the bindings run on, configured before its first use.

/// Every runtime thread gets a Python thread state of its own for life. Without one, each
/// `Python::attach` on a worker created a thread state and destroyed it again on detach, and
/// CPython mapped, faulted in and unmapped a fresh frame-stack chunk every time: about 15% of the
/// process's CPU in a turn (docs/benchmark-profile.md, section 2). With one kept, an attach only
/// takes the GIL. The states are never freed: worker threads live as long as the process, and the
/// blocking pool (DNS lookups at connect) starts a handful of threads at most.
fn keep_python_thread_state() {
    // SAFETY: the interpreter is initialised (this module is loaded by it) and this thread holds
    // no thread state yet. PyGILState_Ensure creates one and takes the GIL; PyEval_SaveThread
    // releases the GIL but leaves the state registered for this thread, with its use count at 1,
    // so later PyGILState_Ensure/Release pairs (pyo3's attach) reuse it instead of freeing it.
    unsafe {
        if pyo3::ffi::Py_IsInitialized() == 0 {
            return;
        }
        pyo3::ffi::PyGILState_Ensure();
        pyo3::ffi::PyEval_SaveThread();
    }
}

/// Installs the runtime configuration; effective only before the runtime's first use.
pub fn configure() {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("tenxgraph-rt").on_thread_start(keep_python_thread_state);
    pyo3_async_runtimes::tokio::init(builder);
}
