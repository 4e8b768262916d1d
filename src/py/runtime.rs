//! The tokio runtime the bindings run on, configured before its first use.

use pyo3::{PyResult, Python};
use std::sync::atomic::{AtomicU32, Ordering};

/// The process the runtime's threads were started in (0: not started yet).
static STARTED_IN: AtomicU32 = AtomicU32::new(0);

/// Refuses to use the runtime in a process forked after it started: its threads (workers, I/O
/// driver, timers) did not survive `fork()`, so every await there waited for ever (a forked
/// worker's first run hung, and so did its exit, closing the stores).
pub fn check_not_forked(py: Python<'_>) -> PyResult<()> {
    if forked() {
        let started_in = STARTED_IN.load(Ordering::Relaxed);
        let message = format!(
            "tenxgraph's runtime was started in process {started_in} and this process was forked from it \
             afterwards: its threads do not survive fork(), so nothing of tenxgraph can run in this process. Start \
             it only after the fork: run graphs and use checkpointers only in each worker (constructing a \
             checkpointer or compiling a graph does not start it; the first run or checkpointer call does), or use \
             the spawn start method; see docs/production.md"
        );
        let context = serde_json::json!({"started_in_pid": started_in, "pid": super::pid::current()});
        return Err(super::errors::raise(py, "ForkedProcessError", message, "RUNTIME_FORKED_001", &context));
    }
    Ok(())
}

/// This process was forked from one whose runtime had started.
pub fn forked() -> bool {
    let started = STARTED_IN.load(Ordering::Relaxed);
    started != 0 && started != super::pid::current()
}

fn on_thread_start() {
    let _ = STARTED_IN.compare_exchange(0, super::pid::current(), Ordering::Relaxed, Ordering::Relaxed);
    keep_python_thread_state();
}

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
    builder.enable_all().thread_name("tenxgraph-rt").on_thread_start(on_thread_start);
    pyo3_async_runtimes::tokio::init(builder);
}
