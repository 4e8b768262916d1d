//! `RunOptions`: one run's settings, resolved from the caller's config dict once, in Rust (the
//! layer that applies them), and handed to `NativeGraph.run` as one typed object.

use crate::engine::{self, RunConfig, config as defaults};
use crate::failpoints::{Armed, Failpoints};
use crate::store::ThreadRef;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};
use std::sync::Arc;
use std::time::Duration;

/// The lease settings' bounds: `(low, 86400]` seconds. Ours, not 10xGraph's: a wrong value is
/// refused rather than replaced, since another policy than the one asked for could let two workers
/// act on one thread.
const MAX_SECONDS: f64 = 86400.0;
const MIN_BUSY_TIMEOUT: f64 = 0.0;
const MIN_LEASE_TTL: f64 = 0.1;

/// One run's settings. Built from the run's config dict (`RunOptions(config)`), which validates
/// every setting the loop applies; `for_run` adds the facts of one call (its input, streaming,
/// the live state it holds). Immutable.
#[pyclass(module = "tenxgraph._core", frozen)]
#[derive(Clone)]
pub struct RunOptions {
    #[pyo3(get)]
    thread_id: String,
    #[pyo3(get)]
    user_id: String,
    #[pyo3(get)]
    run_id: String,
    #[pyo3(get)]
    recursion_limit: i64,
    /// Seconds; None: no deadline.
    #[pyo3(get)]
    node_timeout: Option<f64>,
    /// Seconds per tool call; None: no deadline.
    #[pyo3(get)]
    tool_timeout: Option<f64>,
    #[pyo3(get)]
    durable: bool,
    #[pyo3(get)]
    on_busy: &'static str,
    #[pyo3(get)]
    busy_timeout: f64,
    #[pyo3(get)]
    lease_ttl: f64,
    #[pyo3(get)]
    failpoints: Option<String>,
    #[pyo3(get)]
    has_messages: bool,
    #[pyo3(get)]
    has_state_update: bool,
    #[pyo3(get)]
    start_node: Option<String>,
    #[pyo3(get)]
    streaming: bool,
    #[pyo3(get)]
    known_version: Option<i64>,
    #[pyo3(get)]
    known_mark: Option<String>,
    /// That commit's state row (`KeptState`), when the Python side kept it too.
    known_state: Option<crate::store::SharedJson>,
    #[pyo3(get)]
    resume_only: bool,
    /// The run only closes a failed tool node (`RunConfig::closing_failed_tools`).
    #[pyo3(get)]
    close_failed_tools: bool,
    /// The call carries a `config["authz"]` owner scope (`ThreadRef::owner_scoped`).
    #[pyo3(get)]
    owner_scoped: bool,
    idempotent_turns: bool,
    parsed_failpoints: Option<Arc<Failpoints>>,
}

fn item<'py>(config: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    config.get_item(key)
}

/// A required text of the config, read by `read` (`id_text` for `thread_id` and `user_id`,
/// `unbounded_text` for `run_id`).
fn required(
    config: &Bound<'_, PyDict>,
    key: &'static str,
    read: fn(&'static str, &Bound<'_, PyAny>) -> PyResult<String>,
) -> PyResult<String> {
    match item(config, key)? {
        Some(v) if !v.is_none() => read(key, &v),
        _ => Err(PyValueError::new_err(format!("config['{key}'] is required"))),
    }
}

/// `str(value)` as the text of the id `field`, refused (`STORAGE_CONFIG_002`) where a store would
/// refuse it (`store::id_text`: too long, a NUL), and when it is not valid Unicode: a lone
/// surrogate. Converted lossily it became U+FFFD, so the run stored the thread under another id
/// than the caller's, and ids that differ only there (two users' ids, under isolation) named one
/// thread.
pub fn id_text(field: &'static str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    // An id is a str, an int (10xGraph's ids are `str | int`) or a uuid.UUID. Anything else was
    // stored as its `str()`: a list, a dict, bytes, a float, and an object whose text holds its
    // address (a new thread at every run) were all taken without a word (red-team, session 31).
    let is_uuid = || {
        let t = value.get_type();
        t.name().is_ok_and(|n| n == "UUID") && t.module().is_ok_and(|m| m == "uuid")
    };
    if !(value.is_instance_of::<pyo3::types::PyString>() || value.is_instance_of::<pyo3::types::PyInt>() || is_uuid()) {
        let kind = value.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        return Err(super::errors::store_err(
            value.py(),
            crate::store::StoreError::BadTextId {
                field,
                value: kind.clone(),
                reason: "must be a str or an int".into(),
            },
        ));
    }
    checked_text(field, value, crate::store::id_text::check_text_id)
}

/// `str(value)` as a text the stores keep without a length limit (`run_id`, the lease's holder):
/// refused (`STORAGE_CONFIG_002`) with a NUL, which PostgreSQL alone refused (a generic
/// `STORAGE_001` at the input commit), or a lone surrogate, which became U+FFFD.
fn unbounded_text(field: &'static str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    checked_text(field, value, crate::store::id_text::check_no_nul)
}

fn checked_text(
    field: &'static str,
    value: &Bound<'_, PyAny>,
    check: fn(&'static str, &str) -> crate::store::StoreResult<()>,
) -> PyResult<String> {
    let text = value.str()?;
    match text.to_str() {
        Ok(s) => check(field, s).map(|()| s.to_owned()).map_err(|e| super::errors::store_err(value.py(), e)),
        Err(_) => Err(super::errors::store_err(
            value.py(),
            crate::store::StoreError::BadTextId {
                field,
                value: text.to_string_lossy().chars().take(80).collect(),
                reason: "must be valid Unicode text (it holds a lone surrogate, which no backend can store)".into(),
            },
        )),
    }
}

/// 10xGraph's lenient timeout rule (`engine::resolve_timeout`), from a Python value: missing ->
/// `default`; None or <= 0 -> no deadline; a bool, a non-number or NaN -> a warning and `default`.
pub fn timeout_from(config: &Bound<'_, PyDict>, key: &str, default: Option<f64>) -> PyResult<Option<f64>> {
    let raw = match item(config, key)? {
        None => return Ok(default),
        Some(v) => v,
    };
    if raw.is_none() {
        return Ok(None);
    }
    let number = if raw.is_instance_of::<PyBool>() {
        None
    } else if raw.is_instance_of::<PyInt>() || raw.is_instance_of::<PyFloat>() {
        raw.extract::<f64>().ok()
    } else if raw.is_instance_of::<PyString>() {
        // Python's float(): surrounding whitespace and digit underscores are accepted.
        let text = raw.extract::<String>()?;
        text.trim().replace('_', "").parse::<f64>().ok()
    } else {
        None
    };
    let Some(default) = default else {
        return Ok(match number {
            Some(v) if v.is_nan() || v <= 0.0 => None,
            Some(v) => Some(v.min(defaults::MAX_TIMEOUT_SECONDS)),
            None => None,
        });
    };
    match number {
        None => {
            tracing::warn!("invalid {key} {}; using the default of {default:?}s", raw.repr()?);
            Ok(Some(default))
        }
        Some(v) => Ok(engine::resolve_timeout(Some(Some(v)), key, default).map(|d| d.as_secs_f64())),
    }
}

/// A run setting of `config` refused: `InvalidConfigError` (a `ValueError` and a `TypeError`, as
/// the plain `ValueError` it was) with `STORAGE_CONFIG_003`, so a caller can tell it by its code.
fn bad_setting(py: Python<'_>, message: String) -> PyErr {
    super::errors::raise(py, "InvalidConfigError", message, "STORAGE_CONFIG_003", &serde_json::json!({}))
}

fn seconds_setting(config: &Bound<'_, PyDict>, key: &str, low: f64, default: f64) -> PyResult<f64> {
    let Some(v) = item(config, key)? else { return Ok(default) };
    let value = if v.is_instance_of::<PyBool>() || !(v.is_instance_of::<PyInt>() || v.is_instance_of::<PyFloat>()) {
        None
    } else {
        v.extract::<f64>().ok()
    };
    match value {
        Some(x) if low < x && x <= MAX_SECONDS => Ok(x),
        _ => {
            Err(bad_setting(v.py(), format!("{key} must be a number of seconds in ({low}, 86400], got {}", v.repr()?)))
        }
    }
}

#[pymethods]
impl RunOptions {
    /// Resolves and validates the settings of a run from its config dict (`thread_id`,
    /// `user_id`, `run_id`, `recursion_limit`, `node_timeout`, `tool_timeout`,
    /// `durable_checkpoint_every_step`, `on_busy`, `busy_timeout`, `lease_ttl`, `failpoints`).
    /// Timeouts follow 10xGraph's lenient rule (a bad value warns and gives the default); any other
    /// bad value raises ValueError and nothing runs.
    #[new]
    fn new(config: &Bound<'_, PyDict>) -> PyResult<Self> {
        let limit = match item(config, "recursion_limit")? {
            None => defaults::DEFAULT_RECURSION_LIMIT,
            Some(v) => match (v.is_instance_of::<PyBool>(), v.extract::<i64>()) {
                (false, Ok(n)) if n >= 1 && v.is_instance_of::<PyInt>() => n,
                // Past i64 (`10**30`, "no limit" as 10xGraph takes it): as good as none.
                (false, Err(_)) if v.is_instance_of::<PyInt>() && v.gt(0)? => i64::MAX,
                _ => {
                    return Err(bad_setting(
                        config.py(),
                        format!("recursion_limit must be a positive int, got {}", v.repr()?),
                    ));
                }
            },
        };
        let on_busy = match item(config, "on_busy")? {
            None => "reject",
            Some(v) => match v.extract::<String>().ok().and_then(|s| engine::OnBusy::parse(&s)) {
                Some(engine::OnBusy::Reject) => "reject",
                Some(engine::OnBusy::Wait) => "wait",
                Some(engine::OnBusy::Interrupt) => "interrupt",
                None => {
                    return Err(bad_setting(
                        config.py(),
                        format!("on_busy must be one of 'reject', 'wait', 'interrupt', got {}", v.repr()?),
                    ));
                }
            },
        };
        let failpoints = match item(config, "failpoints")? {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => match v.extract::<String>() {
                Ok(s) => Some(s),
                Err(_) => {
                    return Err(bad_setting(
                        config.py(),
                        "config['failpoints'] must be a string like 'after_tool:charge_card=kill'".into(),
                    ));
                }
            },
        };
        let parsed_failpoints = match failpoints.as_deref().filter(|s| !s.trim().is_empty()) {
            Some(spec) => Some(Arc::new(Failpoints::parse(spec).map_err(|e| bad_setting(config.py(), e))?)),
            None => None,
        };
        let idempotent_turns = match item(config, "idempotent_turns")? {
            None => false,
            Some(v) if v.is_instance_of::<pyo3::types::PyBool>() => v.is_truthy()?,
            Some(v) => {
                return Err(bad_setting(
                    config.py(),
                    format!("idempotent_turns must be True or False, got {}", v.repr()?),
                ));
            }
        };
        let durable = match item(config, "durable_checkpoint_every_step")? {
            None => true,
            Some(v) => v.is_truthy()?,
        };
        let (thread_id, user_id, run_id) = (
            required(config, "thread_id", id_text)?,
            required(config, "user_id", id_text)?,
            required(config, "run_id", unbounded_text)?,
        );
        // A bad timeout's warning is a line of this run: it carries the run's log fields.
        let span = super::logging::run_span(&thread_id, &run_id);
        let (node_timeout, tool_timeout) = span.in_scope(|| -> PyResult<_> {
            Ok((
                timeout_from(config, "node_timeout", Some(defaults::DEFAULT_NODE_TIMEOUT_SECONDS))?,
                timeout_from(config, "tool_timeout", Some(defaults::DEFAULT_TOOL_TIMEOUT_SECONDS))?,
            ))
        })?;
        Ok(RunOptions {
            thread_id,
            user_id,
            run_id,
            recursion_limit: limit,
            node_timeout,
            tool_timeout,
            durable,
            on_busy,
            busy_timeout: seconds_setting(
                config,
                "busy_timeout",
                MIN_BUSY_TIMEOUT,
                defaults::DEFAULT_BUSY_TIMEOUT_SECONDS,
            )?,
            lease_ttl: seconds_setting(config, "lease_ttl", MIN_LEASE_TTL, defaults::DEFAULT_LEASE_TTL_SECONDS)?,
            failpoints,
            has_messages: false,
            has_state_update: false,
            start_node: None,
            streaming: false,
            known_version: None,
            known_mark: None,
            known_state: None,
            resume_only: false,
            close_failed_tools: false,
            owner_scoped: false,
            idempotent_turns,
            parsed_failpoints,
        })
    }

    /// These settings with the facts of one call: whether it brings messages or a state update
    /// (or a resume answer), where it starts, whether it is streamed, the commit (version, write
    /// mark) of the live state it holds with that commit's state row, and whether it is
    /// recovery's resume-only pass.
    #[pyo3(signature = (*, has_messages, has_state_update, start_node=None, streaming=false, known_version=None, known_mark=None, known_state=None, resume_only=false, owner_scoped=false, close_failed_tools=false))]
    #[allow(clippy::too_many_arguments)]
    fn for_run(
        &self,
        has_messages: bool,
        has_state_update: bool,
        start_node: Option<String>,
        streaming: bool,
        known_version: Option<i64>,
        known_mark: Option<String>,
        known_state: Option<PyRef<'_, super::kept_state::KeptState>>,
        resume_only: bool,
        owner_scoped: bool,
        close_failed_tools: bool,
    ) -> Self {
        RunOptions {
            owner_scoped,
            close_failed_tools,
            has_messages,
            has_state_update,
            start_node,
            streaming,
            known_version,
            known_mark,
            known_state: known_state.map(|k| k.0.clone()),
            resume_only,
            ..self.clone()
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "RunOptions(thread_id={:?}, user_id={:?}, run_id={:?}, recursion_limit={}, node_timeout={:?}, tool_timeout={:?}, on_busy={:?})",
            self.thread_id,
            self.user_id,
            self.run_id,
            self.recursion_limit,
            self.node_timeout,
            self.tool_timeout,
            self.on_busy
        )
    }
}

impl RunOptions {
    /// The engine's `RunConfig` for these settings.
    pub fn run_config(&self) -> RunConfig {
        let mut cfg =
            RunConfig::new(ThreadRef::new(self.thread_id.clone(), self.user_id.clone()).scoped(self.owner_scoped));
        cfg.run_id = self.run_id.clone();
        cfg.recursion_limit = self.recursion_limit;
        cfg.node_timeout = self.node_timeout.map(Duration::from_secs_f64);
        cfg.tool_timeout = self.tool_timeout.map(Duration::from_secs_f64);
        cfg.durable_every_step = self.durable;
        cfg.closing_failed_tools = self.close_failed_tools;
        cfg.idempotent_turns = self.idempotent_turns;
        cfg.lease = engine::LeasePolicy {
            ttl: Duration::from_secs_f64(self.lease_ttl),
            on_busy: engine::OnBusy::parse(self.on_busy).unwrap_or(engine::OnBusy::Reject),
            busy_timeout: Duration::from_secs_f64(self.busy_timeout),
        };
        if let Some(points) = &self.parsed_failpoints {
            cfg.failpoints = Armed::new(Failpoints::from_env(), Some(points.clone()));
        }
        cfg
    }

    /// What the call brings: messages, a state update, a start node, resume-only.
    pub fn input(&self) -> engine::RunInput<'_> {
        engine::RunInput {
            has_messages: self.has_messages,
            has_state_update: self.has_state_update,
            start_node: self.start_node.as_deref(),
            resume_only: self.resume_only,
        }
    }

    /// Whether the call streams (commits are then reported as they happen).
    pub fn streaming(&self) -> bool {
        self.streaming
    }

    /// The commit (version, write mark) whose live state the Python side kept, if any.
    pub fn known(&self) -> Option<(i64, String)> {
        self.known_version.zip(self.known_mark.clone())
    }

    /// The state row of that commit, if the Python side kept it.
    pub fn known_state(&self) -> Option<crate::store::SharedJson> {
        self.known_state.clone()
    }
}
