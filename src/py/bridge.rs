//! Awaiting a Python coroutine from Rust with cancel-on-drop.
//!
//! pyo3-async-runtimes' `into_future` leaves the asyncio task running when the Rust future is
//! dropped; timeouts and stop depend on the opposite. Here the coroutine is started as a task on the
//! caller's loop, in the caller's contextvars (`tenxgraph._bridge.Submission`), its outcome comes
//! back through a oneshot, and dropping `PyTask` before it finished cancels the task.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyAny;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use tokio::sync::oneshot;

type Outcome = PyResult<Py<PyAny>>;

/// The done-callback handed to the submission; called once on the loop thread.
#[pyclass(module = "tenxgraph._core")]
pub struct Completion {
    tx: Mutex<Option<oneshot::Sender<Outcome>>>,
}

#[pymethods]
impl Completion {
    fn __call__(&self, ok: bool, value: Bound<'_, PyAny>) {
        let outcome = if ok { Ok(value.unbind()) } else { Err(PyErr::from_value(value)) };
        if let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(outcome); // the receiver is gone when the run was dropped: nothing to do
        }
    }
}

/// The event loop and contextvars of the Python call that started a run.
pub struct Locals {
    /// The asyncio loop node and tool coroutines are submitted to.
    pub event_loop: Py<PyAny>,
    /// The `contextvars.Context` they run in.
    pub context: Py<PyAny>,
}

/// A Python coroutine running as an asyncio task, awaited from Rust: its outcome arrives through a
/// oneshot, and dropping this before it finished cancels the task (timeouts and stop rely on it).
pub struct PyTask {
    rx: oneshot::Receiver<Outcome>,
    submission: Option<Py<PyAny>>,
}

fn submit_fn(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static SUBMIT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    SUBMIT.import(py, "tenxgraph._bridge", "Submission")
}

impl PyTask {
    /// Schedules `coro` on the loop of `locals`. Call while attached; await after detaching.
    pub fn start(py: Python<'_>, locals: &Locals, coro: Bound<'_, PyAny>) -> PyResult<Self> {
        let (tx, rx) = oneshot::channel();
        let done = Py::new(py, Completion { tx: Mutex::new(Some(tx)) })?;
        let sub = submit_fn(py)?.call1((locals.event_loop.bind(py), locals.context.bind(py), coro, done))?;
        Ok(PyTask { rx, submission: Some(sub.unbind()) })
    }
}

impl Future for PyTask {
    type Output = Outcome;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(r) => {
                self.submission = None; // finished: nothing to cancel on drop
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
        if let Some(sub) = self.submission.take() {
            // try_attach: during interpreter shutdown there is nothing left to cancel.
            let _ = Python::try_attach(|py| {
                if let Err(e) = sub.bind(py).call_method0("cancel") {
                    tracing::debug!("cancelling a Python task failed: {e}");
                }
            });
        }
    }
}
