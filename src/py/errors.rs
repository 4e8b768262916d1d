//! Rust errors to Python exceptions, in one place. Classes come from
//! `tenxgraph.core.exceptions`, each with the error code 10xGraph uses.

use crate::engine::EngineError;
use crate::store::StoreError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;

/// `class` of `tenxgraph.core.exceptions` built with its code and context (or the error building it).
pub(super) fn raise(py: Python<'_>, class: &str, message: String, code: &str, context: &Value) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let module = py.import("tenxgraph.core.exceptions")?;
        let ctx = pythonize::pythonize(py, context).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("error_code", code)?;
        kwargs.set_item("context", ctx)?;
        let exc = module.getattr(class)?.call((message,), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| e)
}

fn with_cause(py: Python<'_>, err: PyErr, cause: Option<Box<dyn std::error::Error + Send + Sync>>) -> PyErr {
    if let Some(c) = cause
        && let Ok(pyerr) = c.downcast::<PyErr>()
    {
        err.set_cause(py, Some(*pyerr));
    }
    err
}

/// A store failure as the Python exception and error code `engine_err` gives it.
pub fn store_err(py: Python<'_>, e: StoreError) -> PyErr {
    engine_err(py, EngineError::Store(e))
}

/// An engine failure as its typed Python exception (`tenxgraph.core.exceptions`), with the error
/// code and context the docs list for it.
pub fn engine_err(py: Python<'_>, e: EngineError) -> PyErr {
    let context = e.context();
    let message = e.to_string();
    let code = e.code().unwrap_or_default();
    match e {
        EngineError::Graph { cause, .. } => with_cause(py, raise(py, "GraphError", message, code, &context), cause),
        EngineError::Node { cause, .. } => with_cause(py, raise(py, "NodeError", message, code, &context), cause),
        EngineError::Recursion { .. } => raise(py, "GraphRecursionError", message, code, &context),
        EngineError::NodeTimeout { .. } => raise(py, "NodeTimeoutError", message, code, &context),
        EngineError::InvalidInput(m) => PyValueError::new_err(m),
        EngineError::Busy { .. } | EngineError::LeaseBusy { .. } | EngineError::Settling { .. } => {
            raise(py, "ThreadBusyError", message, code, &context)
        }
        EngineError::Failpoint(_) => raise(py, "FailpointError", message, code, &context),
        EngineError::Host(b) => match b.downcast::<PyErr>() {
            Ok(pyerr) => *pyerr,
            Err(other) => match other.downcast::<crate::failpoints::Fired>() {
                Ok(f) => raise(py, "FailpointError", f.to_string(), "FAILPOINT_001", &context),
                Err(other) => PyRuntimeError::new_err(other.to_string()),
            },
        },
        EngineError::Store(s) => {
            let (class, code) = match &s {
                StoreError::Stale { .. } | StoreError::StaleMessages { .. } => {
                    ("StaleStateError", "STORAGE_CONFLICT_001")
                }
                StoreError::Forbidden { .. } => ("StorageError", "STORAGE_FORBIDDEN_001"),
                StoreError::MessageInOtherThread { .. } => ("StorageError", "STORAGE_FORBIDDEN_002"),
                StoreError::InvalidInput(m) => return PyValueError::new_err(m.clone()),
                StoreError::BadId { .. } | StoreError::BadTextId { .. } => ("InvalidConfigError", "STORAGE_CONFIG_002"),
                StoreError::Backend { .. } | StoreError::Refused { .. } => ("StorageError", "STORAGE_001"),
                StoreError::Transient { .. } | StoreError::LockWait { .. } => {
                    ("TransientStorageError", "STORAGE_TRANSIENT_001")
                }
                StoreError::Schema(_) => ("SchemaVersionError", "STORAGE_SCHEMA_001"),
                StoreError::Failpoint(_) => ("FailpointError", "FAILPOINT_001"),
                StoreError::Fenced { .. } => ("LeaseLostError", "STORAGE_FENCED_001"),
            };
            raise(py, class, message, code, &context)
        }
    }
}
