//! The typed objects that cross between the loop and the Python side of a run, per node call:
//! `ExecView` (the loop's execution metadata, read as attributes) one way and `NodeResult` the
//! other. No JSON text is written or parsed for either.

use crate::engine::{ExecMeta, ExecStatus};
use pyo3::prelude::*;

/// The loop's execution metadata at one point of a run (step, node, status, interrupt, stop,
/// error). The engine owns it; the Python side mirrors it into the live state's
/// `execution_meta` before user code or a snapshot sees it. Read-only.
#[pyclass(module = "tenxgraph._core", frozen)]
pub struct ExecView {
    /// The node the loop is at (or will run next).
    #[pyo3(get)]
    current_node: String,
    #[pyo3(get)]
    step: i64,
    /// An `ExecutionStatus` value: "running", "interrupted_before", "interrupted_after",
    /// "completed" or "error".
    #[pyo3(get)]
    status: &'static str,
    #[pyo3(get)]
    interrupted_node: Option<String>,
    #[pyo3(get)]
    interrupt_reason: Option<String>,
    /// JSON-shaped data (dicts, lists, numbers, strings), or None.
    #[pyo3(get)]
    interrupt_data: Py<PyAny>,
    #[pyo3(get)]
    thread_id: Option<String>,
    /// A `StopRequestStatus` value.
    #[pyo3(get)]
    stop_current_execution: String,
    /// The failure message, set with status "error".
    #[pyo3(get)]
    error: Option<String>,
}

/// The `ExecutionStatus` string of 10xGraph for `s` (the same values `ExecStatus` serialises to).
pub fn status_str(s: ExecStatus) -> &'static str {
    match s {
        ExecStatus::Running => "running",
        ExecStatus::InterruptedBefore => "interrupted_before",
        ExecStatus::InterruptedAfter => "interrupted_after",
        ExecStatus::Completed => "completed",
        ExecStatus::Error => "error",
    }
}

impl ExecView {
    /// A read-only copy of the engine's execution metadata for one node call (the interrupt
    /// data converted to Python once).
    pub fn new(py: Python<'_>, exec: &ExecMeta) -> PyResult<Py<ExecView>> {
        let interrupt_data = match &exec.interrupt_data {
            None | Some(serde_json::Value::Null) => py.None(),
            Some(v) => pythonize::pythonize(py, v)
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?
                .unbind(),
        };
        Py::new(
            py,
            ExecView {
                current_node: exec.current_node.clone(),
                step: exec.step,
                status: status_str(exec.status),
                interrupted_node: exec.interrupted_node.clone(),
                interrupt_reason: exec.interrupt_reason.clone(),
                interrupt_data,
                thread_id: exec.thread_id.clone(),
                stop_current_execution: exec.stop_current_execution.clone(),
                error: exec.error.clone(),
            },
        )
    }
}

#[pymethods]
impl ExecView {
    fn __repr__(&self) -> String {
        format!("ExecView(current_node={:?}, step={}, status={:?})", self.current_node, self.step, self.status)
    }
}

/// What a node call hands back to the loop when it is more than a goto: the next node (None:
/// follow the edges) and a pause reason (the run pauses after this node's step is committed,
/// e.g. "remote_tool_call"). A plain str or None return means a goto and no pause.
#[pyclass(module = "tenxgraph._core", frozen)]
pub struct NodeResult {
    /// The next node; None follows the graph's edges.
    #[pyo3(get)]
    pub goto: Option<String>,
    /// Why the run pauses after this node's step commits (None: it goes on).
    #[pyo3(get)]
    pub pause: Option<String>,
}

#[pymethods]
impl NodeResult {
    /// `goto`: the next node or None; `pause`: a pause reason or None.
    #[new]
    #[pyo3(signature = (goto=None, pause=None))]
    fn new(goto: Option<String>, pause: Option<String>) -> Self {
        NodeResult { goto, pause }
    }

    fn __repr__(&self) -> String {
        format!("NodeResult(goto={:?}, pause={:?})", self.goto, self.pause)
    }
}
