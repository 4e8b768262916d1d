use super::LeasePolicy;
use crate::failpoints::{Armed, Failpoints};
use crate::store::ThreadRef;
use std::time::Duration;

/// A node's deadline when the config names none (10xGraph's `DEFAULT_NODE_TIMEOUT_SECONDS`).
pub const DEFAULT_NODE_TIMEOUT_SECONDS: f64 = 900.0;
/// A tool call's deadline when the config names none (10xGraph's `DEFAULT_TOOL_TIMEOUT_SECONDS`).
pub const DEFAULT_TOOL_TIMEOUT_SECONDS: f64 = 300.0;
/// Steps a run may take when the config names no `recursion_limit`.
pub const DEFAULT_RECURSION_LIMIT: i64 = 25;
/// How long `on_busy="wait"` waits for a held thread by default.
pub const DEFAULT_BUSY_TIMEOUT_SECONDS: f64 = 30.0;
/// A lease's life after its last renewal, by default.
pub const DEFAULT_LEASE_TTL_SECONDS: f64 = 5.0;
/// Longer deadlines are cut to this (about 31 years): a `Duration` cannot hold infinity.
pub const MAX_TIMEOUT_SECONDS: f64 = 1e9;

/// Per-run settings, already resolved from the caller's config dict.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The thread and the user the run acts for.
    pub thread: ThreadRef,
    /// This run's id: the lease holder's name and a log field.
    pub run_id: String,
    /// Node executions this run may make before `EngineError::Recursion` (10xGraph's default: 25).
    pub recursion_limit: i64,
    /// `None` disables the deadline.
    pub node_timeout: Option<Duration>,
    /// Per tool call; `None` disables it.
    pub tool_timeout: Option<Duration>,
    /// Commit after every node (true), or only at the run's exits: a pause, a stop, an error, END.
    pub durable_every_step: bool,
    /// How often a running node checks the store for a stop request from another process.
    /// Stops from this process arrive at once through `StopSignals`.
    pub stop_poll: Duration,
    /// The thread lease: ttl, and what to do when another execution holds the thread.
    pub lease: LeasePolicy,
    /// Crash-test failpoints in force (the environment's plus the run's); usually none.
    pub failpoints: Armed,
    /// The run only closes a tool node that failed: a thread in `error` at a tool node whose
    /// calls have no results (a node timeout, say) gets one result message per call, the
    /// ledger's where a call's result was recorded and an error that says it was not run
    /// otherwise; nothing runs, and the thread ends `completed` after that node. What a new turn
    /// on such a thread does first (`EngineError::Busy { closable: true }`).
    pub closing_failed_tools: bool,
    /// `config["idempotent_turns"]`: a turn the thread holds, sent again, is answered from the
    /// store (the host decides in `prepare`), paused threads included: there new input is
    /// otherwise refused before the host sees it.
    pub idempotent_turns: bool,
}

impl RunConfig {
    /// 10xGraph's defaults: recursion limit 25, node timeout 900 s, tool timeout 300 s, a commit per
    /// step, the default lease, and the failpoints of `TENXGRAPH_FAILPOINTS`.
    pub fn new(thread: ThreadRef) -> Self {
        RunConfig {
            thread,
            run_id: String::new(),
            recursion_limit: DEFAULT_RECURSION_LIMIT,
            node_timeout: Some(Duration::from_secs_f64(DEFAULT_NODE_TIMEOUT_SECONDS)),
            tool_timeout: Some(Duration::from_secs_f64(DEFAULT_TOOL_TIMEOUT_SECONDS)),
            durable_every_step: true,
            stop_poll: Duration::from_millis(500),
            lease: LeasePolicy::default(),
            failpoints: Armed::new(Failpoints::from_env(), None),
            closing_failed_tools: false,
            idempotent_turns: false,
        }
    }
}

/// 10xGraph's `resolve_timeout`: a missing value gives the default, `None` or `<= 0` disables,
/// anything unparsable warns and gives the default.
pub fn resolve_timeout(raw: Option<Option<f64>>, key: &str, default: f64) -> Option<Duration> {
    match raw {
        None => Some(Duration::from_secs_f64(default)),
        Some(None) => None,
        Some(Some(v)) if v.is_nan() => {
            tracing::warn!("invalid {key} nan; using the default of {default:?}s");
            Some(Duration::from_secs_f64(default))
        }
        Some(Some(v)) if v <= 0.0 => None,
        Some(Some(v)) => Some(Duration::from_secs_f64(v.min(MAX_TIMEOUT_SECONDS))),
    }
}
