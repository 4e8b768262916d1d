//! Awaiting a Python coroutine from Rust with cancel-on-drop.
//!
//! pyo3-async-runtimes' `into_future` leaves the asyncio task running when the Rust future is
//! dropped; timeouts and stop depend on the opposite. Here the coroutine becomes an asyncio task in
//! the caller's contextvars, its outcome comes back through a oneshot, and dropping `PyTask`
//! before it finished cancels the task.
//!
//! The run's future is polled on its event loop's thread (src/py/driver.rs), so node, tool and
//! lifecycle coroutines are created as tasks right there and their done-callback wakes the next
//! poll with `call_soon`: no thread hop. Only a checkpointer written in Python runs its
//! coroutines on a loop of its own, on another thread; those go through
//! `tenxgraph._bridge.Submission` (`call_soon_threadsafe`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyAny;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use tokio::sync::oneshot;

type Outcome = PyResult<Py<PyAny>>;

/// The done-callback of the task running a coroutine Rust awaits; only the first call counts.
#[pyclass(module = "tenxgraph._core")]
pub struct Completion {
    tx: Mutex<Option<oneshot::Sender<Outcome>>>,
}

#[pymethods]
impl Completion {
    fn __call__(&self, task: Bound<'_, PyAny>) -> PyResult<()> {
        let outcome = if task.call_method0("cancelled")?.is_truthy()? {
            Err(pyo3::exceptions::asyncio::CancelledError::new_err(()))
        } else {
            let exc = task.call_method0("exception")?;
            if exc.is_none() { Ok(task.call_method0("result")?.unbind()) } else { Err(PyErr::from_value(exc)) }
        };
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(outcome); // the receiver is gone when the run was dropped: nothing to do
        }
        Ok(())
    }
}

/// The event loop and contextvars coroutines are started on.
pub struct Locals {
    /// The asyncio loop node and tool coroutines run on.
    pub event_loop: Py<PyAny>,
    /// The `contextvars.Context` they run in.
    pub context: Py<PyAny>,
}

/// A Python coroutine running as an asyncio task, awaited from Rust: its outcome arrives through a
/// oneshot, and dropping this before it finished cancels the task (timeouts and stop rely on it).
pub struct PyTask {
    rx: oneshot::Receiver<Outcome>,
    /// The asyncio task, or the `Submission` for another thread's loop: both have `cancel()`.
    task: Option<Py<PyAny>>,
}

fn submit_fn(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static SUBMIT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    SUBMIT.import(py, "tenxgraph._bridge", "Submission")
}

fn running_loop(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static GET: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    GET.import(py, "asyncio", "_get_running_loop")
}

impl PyTask {
    /// Starts `coro` on the loop of `locals`: as a task right away when that loop runs this
    /// thread (a run's own loop, the usual case), else handed over thread-safely.
    pub fn start(py: Python<'_>, locals: &Locals, coro: Bound<'_, PyAny>) -> PyResult<Self> {
        let (tx, rx) = oneshot::channel();
        let done = Py::new(py, Completion { tx: Mutex::new(Some(tx)) })?;
        let event_loop = locals.event_loop.bind(py);
        let task = if running_loop(py)?.call0()?.is(event_loop) {
            // Created inside the caller's context: the task runs on a copy of the contextvars
            // that were set when the user called ainvoke().
            let task = locals.context.bind(py).call_method1("run", (event_loop.getattr("create_task")?, coro))?;
            task.call_method1("add_done_callback", (done,))?;
            task
        } else {
            submit_fn(py)?.call1((event_loop, locals.context.bind(py), coro, done))?
        };
        Ok(PyTask { rx, task: Some(task.unbind()) })
    }
}

impl Future for PyTask {
    type Output = Outcome;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(r) => {
                self.task = None; // finished: nothing to cancel on drop
                Poll::Ready(r.unwrap_or_else(|_| {
                    Err(pyo3::exceptions::PyRuntimeError::new_err("the Python task vanished without a result"))
                }))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for PyTask {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            // try_attach: during interpreter shutdown there is nothing left to cancel.
            let _ = Python::try_attach(|py| {
                if let Err(e) = task.bind(py).call_method0("cancel") {
                    tracing::debug!("cancelling a Python task failed: {e}");
                }
            });
        }
    }
}
