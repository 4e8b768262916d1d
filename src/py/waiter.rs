//! Rust futures awaited from asyncio without a Rust thread ever calling into Python.
//!
//! pyo3-async-runtimes hands a finished result to the event loop from a tokio thread with
//! `call_soon_threadsafe`, which releases and re-takes the interpreter lock around the wake-up
//! write. When the program ends right after the result arrives, that thread re-takes the lock
//! during finalization and the process aborts. Here the tokio task only stores the result and
//! writes one byte to a socket (no interpreter involved); the loop watches the other end with
//! `add_reader`, and the result is converted to Python on the loop thread.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::future::Future;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

type Convert = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// A Rust future's result waiting for the event loop (see the module comment): set from tokio
/// without the interpreter, read on the loop thread.
#[pyclass(module = "tenxgraph._core", frozen)]
pub struct Waiter {
    reader: UnixStream,
    result: std::sync::Arc<Mutex<Option<Convert>>>,
    task: tokio::task::AbortHandle,
}

/// Runs `fut` on the tokio runtime; the returned object is awaitable from asyncio.
pub fn spawn<F, T, C>(py: Python<'_>, fut: F, convert: C) -> PyResult<Py<Waiter>>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    let (reader, writer) = UnixStream::pair().map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
    reader.set_nonblocking(true).map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
    let result: std::sync::Arc<Mutex<Option<Convert>>> = Default::default();
    let slot = result.clone();
    let handle = pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
        // Writes its byte when dropped: after the result is stored, or when the task is aborted
        // (a cancelled await waits for that, so the run has really ended when it returns).
        let _wake = Wake(writer);
        let out = fut.await;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(move |py| convert(py, out)));
    });
    Py::new(py, Waiter { reader, result, task: handle.abort_handle() })
}

struct Wake(UnixStream);

impl Drop for Wake {
    fn drop(&mut self) {
        let _ = self.0.write_all(&[1]); // the reader may be gone: nothing to wake
    }
}

fn await_helper(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static HELPER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    HELPER.import(py, "tenxgraph._bridge", "await_native")
}

#[pymethods]
impl Waiter {
    fn fileno(&self) -> i32 {
        self.reader.as_raw_fd()
    }

    /// The result (or the exception) once the reader is ready.
    fn take(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let convert = self.result.lock().unwrap_or_else(|p| p.into_inner()).take();
        match convert {
            Some(c) => c(py),
            None => Err(pyo3::exceptions::PyRuntimeError::new_err("the result is not ready or was already taken")),
        }
    }

    /// Drops the Rust future (and with it any Python work it awaits).
    fn cancel(&self) {
        self.task.abort();
    }

    fn __await__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        await_helper(py)?.call1((slf,))?.call_method0("__await__")
    }
}
