//! The state row of a run's last commit, handed to Python with the run's outcome and back with
//! the thread's next run. Python keeps it next to the live state (tenxgraph._live_states), so
//! one cache decides what is kept and for how long; the row never crosses as text or a dict,
//! because Python never reads it: only the engine does, to start a run without reading the thread.

use crate::store::SharedJson;
use pyo3::prelude::*;
use serde_json::Value;

/// Opaque to Python: a committed state row's text (shared, never copied on its way through Python).
#[pyclass(module = "tenxgraph._core", frozen)]
pub struct KeptState(pub SharedJson);

#[pymethods]
impl KeptState {
    fn __repr__(&self) -> String {
        let state: Value = serde_json::from_str(self.0.get()).unwrap_or_default();
        let status = state.pointer("/execution_meta/status").and_then(Value::as_str).unwrap_or("?");
        format!("KeptState(status={status:?})")
    }
}
