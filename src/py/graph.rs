//! `NativeGraph`: the compiled topology plus its store; `run` drives the Rust loop for one call.

use super::bridge::Locals;
use super::errors::engine_err;
use super::host::PyHost;
use super::options::RunOptions;
use super::store::NativeStore;
use crate::engine::{self, EdgeSpec, GraphSpec, RunInput};
use crate::store::Checkpointer;
use pyo3::prelude::*;
use serde_json::json;
use std::sync::Arc;

/// A compiled graph's spec bound to its store: `run` drives one call of the loop, with every
/// step committed before it is reported.
#[pyclass(module = "tenxgraph._core", frozen)]
pub struct NativeGraph {
    spec: Arc<GraphSpec>,
    store: Arc<dyn Checkpointer>,
}

type EdgeTuple = (String, String, Option<usize>, Option<String>);

#[pymethods]
impl NativeGraph {
    /// Validates the topology (GRAPH_002/003/004) and binds it to a store.
    #[allow(clippy::too_many_arguments)] // the Python constructor's keyword arguments
    #[new]
    #[pyo3(signature = (nodes, edges, entry, interrupt_before, interrupt_after, tool_nodes, store, starts_with_messages=false))]
    fn new(
        py: Python<'_>,
        nodes: Vec<String>,
        edges: Vec<EdgeTuple>,
        entry: Option<String>,
        interrupt_before: Vec<String>,
        interrupt_after: Vec<String>,
        tool_nodes: Vec<String>,
        store: PyRef<'_, NativeStore>,
        starts_with_messages: bool,
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
            starts_with_messages,
        };
        spec.validate().map_err(|e| engine_err(py, e))?;
        Ok(NativeGraph { spec: Arc::new(spec), store: store.inner.clone() })
    }

    /// Runs the loop for one call with `options` (a `RunOptions`, every setting already
    /// validated). Resolves to a JSON text `{exec, version, stopped, mark, nothing_to_resume}`.
    fn run<'py>(
        &self,
        py: Python<'py>,
        run: Py<PyAny>,
        event_loop: Py<PyAny>,
        context: Py<PyAny>,
        options: PyRef<'py, RunOptions>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let cfg = options.run_config();
        let input = options.input();
        let (has_messages, has_state_update, resume_only) =
            (input.has_messages, input.has_state_update, input.resume_only);
        let start_node = input.start_node.map(str::to_owned);
        let streaming = options.streaming();
        let known = options.known();
        let known_state = options.known_state();
        drop(options);
        let spec = self.spec.clone();
        let store = self.store.clone();
        let hooks = run.bind(py).getattr("has_lifecycle_hooks").and_then(|v| v.is_truthy()).unwrap_or(false);
        let host = PyHost {
            run,
            locals: Locals { event_loop, context },
            streaming,
            known,
            known_state,
            hooks,
            replayed: Default::default(),
        };
        let span = super::logging::run_span(&cfg.thread.thread_id, &cfg.run_id);
        let fut = async move {
            let input = RunInput { has_messages, has_state_update, start_node: start_node.as_deref(), resume_only };
            engine::run_shared(&spec, &store, &host, &cfg, input).await
        };
        let fut = tracing::Instrument::instrument(fut, span);
        let driver = super::driver::drive(py, fut, |py, r| match r {
            Ok(o) => {
                let text = json!({
                    "exec": o.exec, "version": o.version, "stopped": o.stopped, "mark": o.mark,
                    "nothing_to_resume": o.nothing_to_resume,
                })
                .to_string();
                let kept = o.state.map(|s| Py::new(py, super::kept_state::KeptState(s))).transpose()?;
                Ok((text, kept).into_pyobject(py)?.into_any().unbind())
            }
            Err(e) => Err(engine_err(py, e)),
        })?;
        Ok(driver.into_bound(py).into_any())
    }
}
