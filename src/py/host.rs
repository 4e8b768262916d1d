//! `NodeHost` over a Python `tenxgraph._runtime.Run` object: the live pydantic state stays in
//! Python; what crosses is the node name, the loop's `ExecMeta` and JSON text for persistence.

use super::boundary::{ExecView, NodeResult};
use super::bridge::{Locals, PyTask};
use crate::engine::{
    BoxError, EngineError, ExecMeta, HostFailure, Lifecycle, MsgCursor, NodeHost, NodeOutput, RouteValue, SideEffects,
    Snapshot, Stored, ToolBatch, ToolCall, ToolOutcome, ToolRun, UnknownAnswer,
};
use crate::store::{KnownHead, RawJson, STATE_META_KEY, StoredMessage, shared_json_from_text};
use async_trait::async_trait;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyString;
use serde_json::Value;
use serde_json::value::RawValue;

/// The engine's `NodeHost` for a Python run: node, tool and lifecycle calls go to the Python
/// `Run` object on its event loop.
pub struct PyHost {
    /// The Python `Run` (tenxgraph._runtime) the calls go to.
    pub run: Py<PyAny>,
    /// Its event loop and contextvars.
    pub locals: Locals,
    /// Only a streaming run wants to hear about commits.
    pub streaming: bool,
    /// The commit (version, write mark) whose live state the Python side kept from the thread's
    /// previous run in this process.
    pub known: Option<(i64, String)>,
    /// That commit's state row, when the Python side kept it (`KeptState`).
    pub known_state: Option<crate::store::SharedJson>,
    /// The graph has lifecycle hooks: without any, no lifecycle point crosses into Python.
    pub hooks: bool,
    /// `prepare` found the input to be a stored turn sent again (see `replays_stored_turn`).
    pub replayed: std::sync::atomic::AtomicBool,
}

fn host_err(e: PyErr) -> EngineError {
    EngineError::Host(Box::new(e))
}

fn exec_view(py: Python<'_>, exec: &ExecMeta) -> PyResult<Py<ExecView>> {
    ExecView::new(py, exec)
}

/// Ordinary exceptions are wrapped as NodeError by the loop; BaseExceptions (cancellation,
/// KeyboardInterrupt, control flow such as GraphInterrupt) go through unchanged.
fn classify(e: PyErr) -> HostFailure {
    Python::attach(|py| {
        if let Some(payload) = interrupt_payload(py, &e) {
            return HostFailure::Interrupt { payload };
        }
        if e.is_instance_of::<PyException>(py) {
            let error_type = e.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "Exception".into());
            let message = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
            HostFailure::Raised { error_type, message, cause: Box::new(e) }
        } else {
            HostFailure::Passthrough(Box::new(e))
        }
    })
}

/// `classify`, except that the run's refusal to start a call past its lease (`_LeaseRanOut`,
/// tenxgraph/_run_tools.py) is `ToolNotStarted`, which the tool handler answers.
fn not_started_or_classify(e: PyErr) -> HostFailure {
    let refused = Python::attach(|py| e.get_type(py).name().is_ok_and(|n| n == "_LeaseRanOut"));
    if refused { HostFailure::Passthrough(Box::new(crate::engine::ToolNotStarted)) } else { classify(e) }
}

/// The `Interrupt` of a `GraphInterrupt`, as JSON; None for any other error.
fn interrupt_payload(py: Python<'_>, e: &PyErr) -> Option<Value> {
    static CLS: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
    let cls = CLS.import(py, "tenxgraph.utils.interrupt", "GraphInterrupt").ok()?;
    let value = e.value(py);
    if !value.is_instance(cls).ok()? {
        return None;
    }
    let text: String = value.getattr("interrupt").ok()?.call_method0("model_dump_json").ok()?.extract().ok()?;
    serde_json::from_str(&text).ok()
}

/// The stored state with its messages as `context`, as one JSON document for one
/// `model_validate_json` call (parsing per message in Python was most of a long thread's load),
/// and the state class it was written by. Our bookkeeping keys are left out: a user's state model
/// may forbid extra fields.
fn state_document(state: &Value, messages: &[RawJson]) -> (String, Option<String>) {
    let mut state = state.clone();
    let mut class = None;
    if let Some(obj) = state.as_object_mut() {
        class = obj.remove(STATE_META_KEY).and_then(|m| m.get("class").and_then(Value::as_str).map(str::to_owned));
        obj.remove(LEGACY_CLASS_PATH_KEY);
        obj.remove("context");
    }
    let mut text = state.to_string();
    // The stored texts are spliced in as they are (see `RawJson`).
    text.reserve(messages.iter().map(|m| m.get().len() + 1).sum::<usize>() + 16);
    if text.ends_with('}') {
        text.pop();
        text.push_str(if text.len() > 1 { ",\"context\":[" } else { "\"context\":[" });
        for (i, m) in messages.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(m.get());
        }
        text.push_str("]}");
    }
    (text, class)
}

const LEGACY_CLASS_PATH_KEY: &str = "__class_path__";

#[async_trait]
impl NodeHost for PyHost {
    fn known_head(&self) -> Option<KnownHead<'_>> {
        self.known.as_ref().map(|(version, mark)| KnownHead { version: *version, mark })
    }

    fn known_state(&self) -> Option<&crate::store::SharedJson> {
        self.known_state.as_ref()
    }

    async fn prepare(&self, stored: Stored<'_>, exec: &ExecMeta) -> Result<MsgCursor, EngineError> {
        let (state, stored_class) = match stored {
            Stored::Loaded { state, messages } => {
                let (text, class) = state_document(state, messages);
                (Some(text), class)
            }
            Stored::Fresh | Stored::Known => (None, None),
        };
        let known = matches!(stored, Stored::Known);
        Python::attach(|py| {
            // As bytes: pydantic parses UTF-8 bytes directly, a str of a long thread would be
            // built first and read back.
            let state = state.map(|t| pyo3::types::PyBytes::new(py, t.as_bytes()));
            let r = self.run.bind(py).call_method1("prepare", (state, stored_class, exec_view(py, exec)?, known))?;
            let (len, last_id, replayed): (usize, Option<String>, bool) = r.extract()?;
            self.replayed.store(replayed, std::sync::atomic::Ordering::Relaxed);
            Ok(MsgCursor { len, last_id })
        })
        .map_err(host_err)
    }

    fn replays_stored_turn(&self) -> bool {
        self.replayed.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn run_node(&self, node: &str, exec: &ExecMeta) -> Result<NodeOutput, HostFailure> {
        super::logging::enter_node(node);
        let task = Python::attach(|py| {
            let coro = self.run.bind(py).call_method1("run_node", (node, exec_view(py, exec)?))?;
            PyTask::start(py, &self.locals, coro)
        })
        .map_err(classify)?;
        let out = task.await.map_err(classify)?;
        Python::attach(|py| node_output(out.bind(py))).map_err(classify)
    }

    fn eval_condition(&self, index: usize) -> Result<RouteValue, BoxError> {
        Python::attach(|py| -> PyResult<RouteValue> {
            let r = self.run.bind(py).call_method1("eval_condition", (index,))?;
            Ok(match r.cast::<PyString>() {
                Ok(s) => RouteValue::Str(s.to_string()),
                Err(_) => RouteValue::Truthy(r.is_truthy()?),
            })
        })
        .map_err(|e| Box::new(e) as BoxError)
    }

    fn snapshot(&self, exec: &ExecMeta, cursor: &MsgCursor) -> Result<Snapshot, EngineError> {
        // Copy the text out while attached, parse after: JSON parsing needs no interpreter.
        let (state, msgs, replace, len, last_id) = Python::attach(|py| {
            let r = self
                .run
                .bind(py)
                .call_method1("snapshot", (exec_view(py, exec)?, cursor.len, cursor.last_id.clone()))?;
            r.extract::<(String, Vec<(String, String)>, bool, usize, Option<String>)>()
        })
        .map_err(host_err)?;
        let new_messages = msgs
            .into_iter()
            .map(|(id, data)| {
                StoredMessage::from_text(id, data)
                    .map_err(|e| EngineError::InvalidInput(format!("message is not valid JSON: {e}")))
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        Ok(Snapshot { state, new_messages, replace_messages: replace, cursor: MsgCursor { len, last_id } })
    }

    fn streaming(&self) -> bool {
        self.streaming
    }

    async fn lifecycle(&self, point: Lifecycle<'_>, exec: &ExecMeta) -> Option<String> {
        if !self.hooks {
            return None;
        }
        let (name, node, kind) = point.parts();
        let task = Python::attach(|py| {
            let coro = self.run.bind(py).call_method1("lifecycle", (name, node, kind, exec_view(py, exec)?))?;
            PyTask::start(py, &self.locals, coro)
        });
        // The Python side logs and absorbs a failing hook (10xGraph's rule); what reaches here is
        // a bug of ours or a cancellation, and a hook must not decide the run's outcome either way.
        let out = match task {
            Ok(t) => t.await,
            Err(e) => Err(e),
        };
        match out {
            Ok(v) => Python::attach(|py| v.bind(py).extract::<Option<String>>().ok().flatten()),
            Err(e) => {
                tracing::warn!("lifecycle hook at {name} failed: {e}");
                None
            }
        }
    }

    fn committed(&self, version: i64) {
        if self.streaming {
            Python::attach(|py| {
                if let Err(e) = self.run.bind(py).call_method1("committed", (version,)) {
                    tracing::warn!("stream flush after commit failed: {e}");
                }
            });
        }
    }

    fn tool_settled(&self, node: &str, index: usize) {
        if self.streaming {
            Python::attach(|py| {
                if let Err(e) = self.run.bind(py).call_method1("tool_settled", (node, index)) {
                    tracing::warn!("streaming a tool result failed: {e}");
                }
            });
        }
    }

    fn begin_tools(&self, node: &str, exec: &ExecMeta) -> Result<ToolBatch, HostFailure> {
        super::logging::enter_node(node);
        Python::attach(|py| -> PyResult<ToolBatch> {
            let r = self.run.bind(py).call_method1("begin_tools", (node, exec_view(py, exec)?))?;
            let (origin, calls, fresh): PyBatch<'_> = r.extract()?;
            let mut out = Vec::with_capacity(calls.len());
            for (call_id, name, fx) in calls {
                // The decorator validates the class; anything else is treated as the default.
                out.push(ToolCall {
                    call_id: ledger_id(&call_id)?,
                    name,
                    effects: SideEffects::parse(&fx).unwrap_or_default(),
                });
            }
            Ok(ToolBatch { origin_message_id: ledger_id(&origin)?, calls: out, fresh })
        })
        // NODE_002/NODE_003 are raised as NodeError already: they must keep their codes.
        .map_err(|e: PyErr| HostFailure::Passthrough(Box::new(e)))
    }

    fn unknown_outcome(
        &self,
        node: &str,
        index: usize,
        idempotency_key: Option<String>,
        retries_spent: u64,
    ) -> Result<UnknownAnswer, HostFailure> {
        let answer = Python::attach(|py| {
            let args = (node, index, idempotency_key, retries_spent);
            self.run.bind(py).call_method1("unknown_outcome", args)?.extract::<Option<(String, bool, bool)>>()
        })
        .map_err(classify)?;
        let Some((envelope, record, is_error)) = answer else {
            return Ok(UnknownAnswer::Retry);
        };
        let envelope = shared_json_from_text(envelope).map_err(|e| HostFailure::Raised {
            error_type: "SerializationError".into(),
            message: e.to_string(),
            cause: Box::new(e),
        })?;
        Ok(UnknownAnswer::Answer(ToolRun { envelope, record, is_error }))
    }

    fn tools_cut(&self, node: &str) {
        Python::attach(|py| {
            if let Err(e) = self.run.bind(py).call_method1("tools_cut", (node,)) {
                tracing::error!(node = %node, "could not tell the run its tool node was cut off: {e}");
            }
        });
    }

    fn returned_when_cut(&self, node: &str, index: usize) -> Option<ToolRun> {
        let answer = Python::attach(|py| {
            self.run
                .bind(py)
                .call_method1("returned_when_cut", (node, index))?
                .extract::<Option<(String, bool, bool)>>()
        });
        match answer {
            Ok(Some((envelope, record, is_error))) => match shared_json_from_text(envelope) {
                Ok(envelope) => Some(ToolRun { envelope, record, is_error }),
                Err(e) => {
                    tracing::error!(node = %node, "a returned tool call's result could not be read back: {e}");
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::error!(node = %node, "could not ask whether a timed-out tool call had returned: {e}");
                None
            }
        }
    }

    fn accept_replay(&self, node: &str, index: usize, envelope: &RawValue) -> bool {
        let text = envelope.get();
        Python::attach(|py| {
            self.run
                .bind(py)
                .call_method1("accept_replay", (node, index, text))
                .and_then(|r| r.is_truthy())
                .unwrap_or(false)
        })
    }

    async fn run_tool(
        &self,
        node: &str,
        index: usize,
        ledger_key: Option<&str>,
        idempotency_key: Option<String>,
        lease_left: Option<std::time::Duration>,
    ) -> Result<ToolRun, HostFailure> {
        let task = Python::attach(|py| {
            let left = lease_left.map(|d| d.as_secs_f64());
            let coro = self.run.bind(py).call_method1("run_tool", (node, index, idempotency_key, ledger_key, left))?;
            PyTask::start(py, &self.locals, coro)
        })
        .map_err(classify)?;
        let out = task.await.map_err(not_started_or_classify)?;
        let (envelope, record, is_error) =
            Python::attach(|py| out.bind(py).extract::<(String, bool, bool)>()).map_err(classify)?;
        let envelope = shared_json_from_text(envelope).map_err(|e| {
            // The Python side keeps results within what this parser takes; reaching here is a bug,
            // and the tool did run: say so loudly.
            tracing::error!(
                node = %node,
                ledger_key = ledger_key.unwrap_or(""),
                event = "tool_result_unreadable",
                "tool call COMPLETED but its result could not be read back ({e}); it is reported as failed and not recorded"
            );
            HostFailure::Raised { error_type: "SerializationError".into(), message: e.to_string(), cause: Box::new(e) }
        })?;
        Ok(ToolRun { envelope, record, is_error })
    }

    fn quiet_after_tools(&self) -> bool {
        // Events for a publisher are only queued here (its code runs later, on the loop).
        !self.hooks
    }

    fn finish_tools(&self, node: &str, outcomes: Vec<ToolOutcome>) -> Result<NodeOutput, HostFailure> {
        // Envelopes are not written out again: the Python side holds each call's message, made
        // when the tool returned (`ToolStep.texts`, the text the envelope was parsed from) or
        // when it accepted the replay (`accept_replay`).
        let items: Vec<(&str, Option<String>)> = outcomes
            .iter()
            .map(|o| match o {
                ToolOutcome::Replayed(_) => ("replayed", None),
                ToolOutcome::Ran(_) => ("ran", None),
                ToolOutcome::TimedOut { secs } => ("timeout", Some(secs.to_string())),
                ToolOutcome::Failed { message } => ("failed", Some(message.clone())),
            })
            .collect();
        Python::attach(|py| {
            let r = self.run.bind(py).call_method1("finish_tools", (node, items))?;
            node_output(&r)
        })
        .map_err(classify)
    }
}

/// `begin_tools`' answer: the origin message id, `(call id, name, side effects)` per call, and
/// whether the origin message is fresh (`ToolBatch::fresh`).
type PyBatch<'py> = (Bound<'py, PyAny>, Vec<(Bound<'py, PyAny>, String, String)>, bool);

/// A node's Python result: None, a goto name, or a `NodeResult`.
fn node_output(r: &Bound<'_, PyAny>) -> PyResult<NodeOutput> {
    if let Ok(res) = r.cast::<NodeResult>() {
        let res = res.get();
        return Ok(NodeOutput { goto: res.goto.clone(), pause: res.pause.clone() });
    }
    Ok(NodeOutput { goto: r.extract()?, pause: None })
}

/// A message or call id as the ledger keys it: its type is kept (123 and "123" are different
/// keys), None stays None, anything else (the Python side has already narrowed ids to str, int or
/// None) becomes its str.
fn ledger_id(v: &Bound<'_, PyAny>) -> PyResult<Option<Value>> {
    if v.is_none() {
        return Ok(None);
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Some(Value::String(s.to_str()?.to_owned())));
    }
    if v.is_instance_of::<pyo3::types::PyInt>() && !v.is_instance_of::<pyo3::types::PyBool>() {
        if let Ok(n) = v.extract::<i64>() {
            return Ok(Some(Value::from(n)));
        }
        if let Ok(n) = v.extract::<u64>() {
            return Ok(Some(Value::from(n)));
        }
    }
    Ok(Some(Value::String(v.str()?.to_string())))
}
