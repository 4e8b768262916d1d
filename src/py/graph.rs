//! `NativeGraph`: the compiled topology plus its store; `run` drives the Rust loop for one call.

use super::bridge::Locals;
use super::errors::engine_err;
use super::host::PyHost;
use super::store::NativeStore;
use crate::engine::{self, EdgeSpec, GraphSpec, RunConfig, RunInput};
use crate::store::{Checkpointer, ThreadRef};
use pyo3::prelude::*;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn positive_secs(key: &str, v: f64) -> PyResult<Duration> {
    if v.is_finite() && v > 0.0 && v <= 86400.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(pyo3::exceptions::PyValueError::new_err(format!("{key} must be a number of seconds in (0, 86400], got {v}")))
    }
}

#[pyclass(module = "tenxgraph._core", frozen)]
pub struct NativeGraph {
    spec: Arc<GraphSpec>,
    store: Arc<dyn Checkpointer>,
}

type EdgeTuple = (String, String, Option<usize>, Option<String>);

#[pymethods]
impl NativeGraph {
    /// Validates the topology (GRAPH_002/003/004) and binds it to a store.
    #[new]
    fn new(
        py: Python<'_>,
        nodes: Vec<String>,
        edges: Vec<EdgeTuple>,
        entry: Option<String>,
        interrupt_before: Vec<String>,
        interrupt_after: Vec<String>,
        tool_nodes: Vec<String>,
        store: PyRef<'_, NativeStore>,
    ) -> PyResult<Self> {
        let spec = GraphSpec {
            nodes,
            edges: edges
                .into_iter()
                .map(|(from, to, condition, condition_result)| EdgeSpec { from, to, condition, condition_result })
                .collect(),
            entry,
            interrupt_before,
            interrupt_after,
            tool_nodes,
        };
        spec.validate().map_err(|e| engine_err(py, e))?;
        Ok(NativeGraph { spec: Arc::new(spec), store: store.inner.clone() })
    }

    /// Runs the loop for one call. Resolves to a JSON text `{exec, version, stopped, mark,
    /// nothing_to_resume}`; `resume_only` is recovery's resume (`RunInput::resume_only`).
    #[pyo3(signature = (run, event_loop, context, thread_id, user_id, run_id, recursion_limit, node_timeout, tool_timeout, durable, has_messages, has_state_update, start_node=None, streaming=false, failpoints=None, on_busy=None, busy_timeout=30.0, lease_ttl=5.0, known_version=None, known_mark=None, resume_only=false))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        run: Py<PyAny>,
        event_loop: Py<PyAny>,
        context: Py<PyAny>,
        thread_id: String,
        user_id: String,
        run_id: String,
        recursion_limit: i64,
        node_timeout: Option<f64>,
        tool_timeout: Option<f64>,
        durable: bool,
        has_messages: bool,
        has_state_update: bool,
        start_node: Option<String>,
        streaming: bool,
        failpoints: Option<String>,
        on_busy: Option<String>,
        busy_timeout: f64,
        lease_ttl: f64,
        known_version: Option<i64>,
        known_mark: Option<String>,
        resume_only: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut cfg = RunConfig::new(ThreadRef::new(thread_id, user_id));
        cfg.run_id = run_id;
        cfg.recursion_limit = recursion_limit;
        cfg.node_timeout = node_timeout.map(Duration::from_secs_f64);
        cfg.tool_timeout = tool_timeout.map(Duration::from_secs_f64);
        cfg.durable_every_step = durable;
        cfg.lease = engine::LeasePolicy {
            ttl: positive_secs("lease_ttl", lease_ttl)?,
            on_busy: engine::OnBusy::parse(on_busy.as_deref().unwrap_or("reject"))
                .ok_or_else(|| pyo3::exceptions::PyValueError::new_err(format!("on_busy must be 'reject', 'wait' or 'interrupt', got {on_busy:?}")))?,
            busy_timeout: positive_secs("busy_timeout", busy_timeout)?,
        };
        if let Some(spec) = failpoints.filter(|s| !s.trim().is_empty()) {
            let run_points = crate::failpoints::Failpoints::parse(&spec).map_err(pyo3::exceptions::PyValueError::new_err)?;
            cfg.failpoints = crate::failpoints::Armed::new(crate::failpoints::Failpoints::from_env(), Some(std::sync::Arc::new(run_points)));
        }
        let spec = self.spec.clone();
        let store = self.store.clone();
        let known = known_version.zip(known_mark);
        let hooks = run.bind(py).getattr("has_lifecycle_hooks").and_then(|v| v.is_truthy()).unwrap_or(false);
        let host = PyHost { run, locals: Locals { event_loop, context }, streaming, known, hooks };
        let span = super::logging::run_span(&cfg.thread.thread_id, &cfg.run_id);
        let fut = async move {
            let input = RunInput { has_messages, has_state_update, start_node: start_node.as_deref(), resume_only };
            engine::run(&spec, &*store, &host, &cfg, input).await
        };
        let fut = tracing::Instrument::instrument(fut, span);
        let waiter = super::waiter::spawn(py, fut, |py, r| match r {
            Ok(o) => {
                let text = json!({
                    "exec": o.exec, "version": o.version, "stopped": o.stopped, "mark": o.mark,
                    "nothing_to_resume": o.nothing_to_resume,
                })
                .to_string();
                Ok(text.into_pyobject(py)?.into_any().unbind())
            }
            Err(e) => Err(engine_err(py, e)),
        })?;
        Ok(waiter.into_bound(py).into_any())
    }
}
