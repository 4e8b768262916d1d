use crate::store::StoreError;
use serde_json::{Value, json};
use thiserror::Error;

/// Any error of host code, carried as the cause of an `EngineError`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a run can fail with. Each variant maps to one exception class and code in `py/errors.rs`.
#[derive(Debug, Error)]
pub enum EngineError {
    /// Graph misuse: GRAPH_002/003/004, GRAPH_ROUTING_001/002.
    #[error("{message}")]
    Graph {
        /// The error code (`GRAPH_002`, ...).
        code: &'static str,
        /// The message, as the exception's.
        message: String,
        /// The exception's `context` dict.
        context: Value,
        /// The original error, if any.
        #[source]
        cause: Option<BoxError>,
    },
    /// A node raised (NODE_001); `cause` is the original error.
    #[error("{message}")]
    Node {
        /// The error code (`NODE_001`, ...).
        code: &'static str,
        /// The message, as the exception's.
        message: String,
        /// The exception's `context` dict.
        context: Value,
        /// The original error, if any.
        #[source]
        cause: Option<BoxError>,
    },
    /// The run reached its recursion limit (RECURSION_001); the steps before it are committed.
    #[error("Graph execution exceeded recursion limit: {limit}")]
    Recursion {
        /// The run's `recursion_limit`.
        limit: i64,
        /// The thread's step when it stopped.
        step: i64,
        /// The node that would have run next.
        node: String,
    },
    /// A node exceeded `node_timeout` and was cancelled (NODE_TIMEOUT_001); its step was not
    /// committed.
    #[error("Node '{node}' exceeded its timeout of {timeout}s and was cancelled")]
    NodeTimeout {
        /// The node.
        node: String,
        /// The timeout, in seconds.
        timeout: f64,
    },
    /// The store failed or refused a read or write (each `StoreError` has its own class and code).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// New input for a thread whose last run has not finished (crashed mid-run, or running in
    /// another process): ThreadBusyError. Nothing was written.
    #[error(
        "thread '{thread_id}' has an unfinished run at node '{node}'; resume it with ainvoke({{}}, config) (or wait for it) before sending new input"
    )]
    Busy {
        /// The thread.
        thread_id: String,
        /// The node its unfinished run is at.
        node: String,
        /// The thread failed at a tool node (not a run under way, a stop, or a review gate): a
        /// run with `RunConfig::closing_failed_tools` answers the calls, and the turn can go on.
        closable: bool,
    },
    /// Another execution holds the thread's lease and the run's `on_busy` policy gave up
    /// (`reject`, or `wait`/`interrupt` past `busy_timeout`): ThreadBusyError. Nothing ran.
    /// `holder` is None when the caller may not see it (user isolation, not the owner).
    #[error("thread '{thread_id}' is busy: another execution {}holds it{}", holder.as_ref().map_or(String::new(), |h| format!("(run {}, lease token {}) ", h.holder, h.token)), if *waited > 0.0 { format!("; waited {waited:.1}s") } else { String::new() })]
    LeaseBusy {
        /// The thread.
        thread_id: String,
        /// Who holds the lease, when the caller may see it.
        holder: Option<crate::store::LeaseInfo>,
        /// Seconds the run waited for the lease (0 with `reject`).
        waited: f64,
    },
    /// A run of this process on the thread, dropped by its caller, was still recording the tools
    /// that returned before the drop when `busy_timeout` ran out: ThreadBusyError. Those writes
    /// are polled on the event loop that ran it, so they wait for that loop to run again: a
    /// sync call blocking that loop (an `invoke()` inside a coroutine) waits for them in vain.
    #[error(
        "thread '{thread_id}' is busy: a run of it in this process was cancelled and is still recording the tools that returned before the cancel (waited {waited:.1}s); it finishes when the event loop that ran it runs again, so a sync invoke() that blocks that loop waits for it in vain: await ainvoke() there"
    )]
    Settling {
        /// The thread.
        thread_id: String,
        /// Seconds the run waited.
        waited: f64,
    },
    /// Bad input to a run (the Python layer raises ValueError).
    #[error("{0}")]
    InvalidInput(String),
    /// A failpoint armed with `raise` fired (crash-replay tests).
    #[error(transparent)]
    Failpoint(#[from] crate::failpoints::Fired),
    /// An error raised by host code that must reach the caller unchanged.
    #[error(transparent)]
    Host(BoxError),
}

impl EngineError {
    /// The error code the docs list for a failure of the loop itself; None for a store's, a
    /// host's, or refused input (their codes are their own).
    pub fn code(&self) -> Option<&'static str> {
        Some(match self {
            EngineError::Graph { code, .. } | EngineError::Node { code, .. } => code,
            EngineError::Recursion { .. } => "RECURSION_001",
            EngineError::NodeTimeout { .. } => "NODE_TIMEOUT_001",
            EngineError::Busy { .. } => "STORAGE_BUSY_001",
            EngineError::LeaseBusy { waited, .. } if *waited > 0.0 => "STORAGE_BUSY_003",
            EngineError::LeaseBusy { .. } => "STORAGE_BUSY_002",
            EngineError::Settling { .. } => "STORAGE_BUSY_003",
            EngineError::Failpoint(_) => "FAILPOINT_001",
            _ => return None,
        })
    }

    /// A `Graph` error without a cause.
    pub fn graph(code: &'static str, message: impl Into<String>, context: Value) -> Self {
        EngineError::Graph { code, message: message.into(), context, cause: None }
    }

    /// Context dict for the Python exception.
    pub fn context(&self) -> Value {
        match self {
            EngineError::Graph { context, .. } | EngineError::Node { context, .. } => context.clone(),
            EngineError::Recursion { limit, step, node } => {
                json!({"max_steps": limit, "current_step": step, "current_node": node})
            }
            EngineError::NodeTimeout { node, timeout } => json!({"node_name": node, "timeout": timeout}),
            EngineError::Busy { thread_id, node, closable } => {
                json!({"thread_id": thread_id, "current_node": node, "failed_tool_node": closable})
            }
            EngineError::LeaseBusy { thread_id, holder: Some(holder), waited } => json!({
                "thread_id": thread_id,
                "holder_run_id": holder.holder,
                "holder_pid": holder.pid,
                "lease_token": holder.token,
                "lease_expires_in": holder.expires_in,
                "waited": waited,
            }),
            EngineError::LeaseBusy { thread_id, holder: None, waited } => {
                json!({"thread_id": thread_id, "waited": waited})
            }
            EngineError::Settling { thread_id, waited } => {
                json!({"thread_id": thread_id, "waited": waited, "settling": true})
            }
            EngineError::Store(StoreError::Fenced { thread_id, token, current }) => {
                json!({"thread_id": thread_id, "lease_token": token, "current_token": current})
            }
            EngineError::Store(StoreError::Stale { thread_id, expected, current }) => {
                json!({"thread_id": thread_id, "expected_version": expected, "current_version": current})
            }
            EngineError::Store(StoreError::StaleMessages { thread_id, version }) => {
                json!({"thread_id": thread_id, "expected_version": version, "current_version": version, "messages_changed": true})
            }
            EngineError::Store(StoreError::Forbidden { thread_id }) => json!({"thread_id": thread_id}),
            EngineError::Store(StoreError::BadId { field, value, id_type, .. }) => {
                json!({"field": field, "value": value, "id_type": id_type})
            }
            EngineError::Store(StoreError::BadTextId { field, value, .. }) => json!({"field": field, "value": value}),
            _ => json!({}),
        }
    }
}
