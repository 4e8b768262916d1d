use super::tools::{ToolBatch, ToolOutcome, ToolRun, UnknownAnswer};
use super::{BoxError, EngineError, ExecMeta};
use crate::store::{KnownHead, StoredMessage};
use async_trait::async_trait;
use serde_json::Value;

/// Result of a node: an explicit next node (`Command(goto=...)`) or none (follow the edges).
#[derive(Debug, Clone, Default)]
pub struct NodeOutput {
    /// The next node the node named (`Command(goto=...)`), instead of its edges.
    pub goto: Option<String>,
    /// The run pauses after this node, with this reason (a tool node whose calls the client runs:
    /// `remote_tool_call`). The node's step is committed; the next node is worked out when the
    /// thread resumes, from the context the client's results were added to.
    pub pause: Option<String>,
}

/// What a condition returned, reduced to what routing needs.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteValue {
    /// A node name or a path-map key.
    Str(String),
    /// A bool, or the truthiness of any other value (a path-map key `True` / `False`).
    Truthy(bool),
}

/// How a node failed.
#[derive(Debug)]
pub enum HostFailure {
    /// An ordinary exception: the loop wraps it as NodeError NODE_001.
    Raised {
        /// The exception's class name.
        error_type: String,
        /// Its message.
        message: String,
        /// The exception itself, chained as the NodeError's cause.
        cause: BoxError,
    },
    /// An error that must reach the caller unchanged (already a graph error, or not an Exception).
    Passthrough(BoxError),
    /// User code asked for a human answer (`interrupt()`): the run pauses at this node and the
    /// node runs again on resume. `payload` describes the question.
    Interrupt {
        /// The pending interrupt, stored with the paused state.
        payload: serde_json::Value,
    },
}

/// How many stored messages the live context starts with, and the id of the last one. A context
/// that still starts with them has only grown (the common case); otherwise it was rewritten.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MsgCursor {
    /// Stored messages the live context starts with.
    pub len: usize,
    /// The id of the last of them.
    pub last_id: Option<String>,
}

/// What a run starts from.
#[derive(Debug, Clone, Copy)]
pub enum Stored<'a> {
    /// A new thread: the graph's prototype state.
    Fresh,
    /// The thread's latest state row and every message of it.
    Loaded {
        /// The state row.
        state: &'a Value,
        /// The thread's messages, in order, as stored text.
        messages: &'a [crate::store::RawJson],
    },
    /// The thread is still at the host's `known_head`: the host's own live state is current.
    Known,
}

/// One step to persist.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The state without `context`, as JSON text whose last key is the state's header
    /// (`STATE_META_KEY`): the commit puts its write mark in (`store::marked_state`).
    pub state: String,
    /// Messages added since the last commit (all of the context when `replace_messages`).
    pub new_messages: Vec<StoredMessage>,
    /// The context was rewritten: `new_messages` is all of it.
    pub replace_messages: bool,
    /// The cursor once this snapshot is committed.
    pub cursor: MsgCursor,
}

/// A point of a run where 10xGraph fires its graph lifecycle hooks (`GraphLifecycleHook`). The
/// loop names the points, so the order is decided here, on every path (invoke and streaming).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle<'a> {
    /// The state is loaded and the input merged, before the first commit and the first node.
    Start,
    /// `node` finished and its result is merged, before routing and before its step commits.
    NodeDone {
        /// The node.
        node: &'a str,
    },
    /// The run pauses at `node`: `kind` is "before", "after", "interrupt" or "stop".
    Interrupt {
        /// The node.
        node: &'a str,
        /// "before", "after", "interrupt" or "stop".
        kind: &'a str,
    },
    /// The run reached END, before its final commit.
    End,
    /// The run failed (in `exec.error`), before the failed state is committed.
    Error,
    /// A durable commit is about to snapshot the live state.
    Checkpoint,
}

impl Lifecycle<'_> {
    /// (point, node, kind) as the host names them.
    pub fn parts(&self) -> (&'static str, Option<&str>, Option<&str>) {
        match *self {
            Lifecycle::Start => ("start", None, None),
            Lifecycle::NodeDone { node } => ("node_done", Some(node), None),
            Lifecycle::Interrupt { node, kind } => ("interrupt", Some(node), Some(kind)),
            Lifecycle::End => ("end", None, None),
            Lifecycle::Error => ("error", None, None),
            Lifecycle::Checkpoint => ("checkpoint", None, None),
        }
    }
}

/// The engine's window onto user code and the live state of one run.
#[async_trait]
pub trait NodeHost: Send + Sync {
    /// The commit whose live state this host still holds from the thread's previous run in this
    /// process, if any: when the thread is still there, `prepare` gets `Stored::Known`.
    fn known_head(&self) -> Option<KnownHead<'_>> {
        None
    }
    /// The state row of that commit (as the run that made it wrote it), where the host kept it:
    /// with it a store that checks the head at the input commit needs no read before it.
    fn known_state(&self) -> Option<&crate::store::SharedJson> {
        None
    }
    /// Builds the live state and merges the run's input into it. Returns the cursor of what is
    /// already stored.
    async fn prepare(&self, stored: Stored<'_>, exec: &ExecMeta) -> Result<MsgCursor, EngineError>;
    /// After `prepare`: the input is a turn the thread holds already, sent again, and the host
    /// answers it from the stored thread (`config["idempotent_turns"]`): nothing runs and nothing
    /// is written.
    fn replays_stored_turn(&self) -> bool {
        false
    }
    /// Runs a node on the live state. Dropping the future must cancel the node's work.
    async fn run_node(&self, node: &str, exec: &ExecMeta) -> Result<NodeOutput, HostFailure>;
    /// Calls condition `index` on the live state.
    fn eval_condition(&self, index: usize) -> Result<RouteValue, BoxError>;
    /// The step to persist since `cursor`, with `exec` written into the state first.
    fn snapshot(&self, exec: &ExecMeta, cursor: &MsgCursor) -> Result<Snapshot, EngineError>;

    /// Called after each durable commit: a streaming host releases what it held back until the
    /// step was safe (a client never sees a step that a crash could undo).
    fn committed(&self, _version: i64) {}
    /// Lifecycle hooks at `point`. They may change the live state (the next snapshot carries it);
    /// they never fail the run (a failing hook is the host's to log). At `Error` the host may
    /// return a replacement for the error message that is persisted.
    async fn lifecycle(&self, _point: Lifecycle<'_>, _exec: &ExecMeta) -> Option<String> {
        None
    }
    /// Whether this run is streamed (the `mid_stream` failpoint fires only then).
    fn streaming(&self) -> bool {
        false
    }

    // -- tool nodes (only hosts whose graphs have tool nodes implement these) --

    /// The tool calls of the last assistant message (NodeError NODE_002/NODE_003 when there are
    /// none or the context is empty).
    fn begin_tools(&self, node: &str, _exec: &ExecMeta) -> Result<ToolBatch, HostFailure> {
        Err(HostFailure::Passthrough(format!("node '{node}' is not a tool node of this host").into()))
    }
    /// Whether a recorded envelope can be turned back into a result (else the tool runs).
    fn accept_replay(&self, _node: &str, _index: usize, _envelope: &serde_json::value::RawValue) -> bool {
        true
    }
    /// Runs call `index`, recorded under `ledger_key` (None: no ledger for this call). Dropping
    /// the future must cancel the tool; a host that cannot (a sync Python tool in its thread) may
    /// record the late result under `ledger_key` itself, first result winning as always.
    /// `lease_left`: how long, from now, the run surely holds the thread; a host whose call
    /// starts later than that (queued behind other work, or the process was frozen) must not
    /// start it, and fails with `HostFailure::Passthrough` instead.
    async fn run_tool(
        &self,
        node: &str,
        _index: usize,
        _ledger_key: Option<&str>,
        _idempotency_key: Option<String>,
        _lease_left: Option<std::time::Duration>,
    ) -> Result<ToolRun, HostFailure> {
        Err(HostFailure::Passthrough(format!("node '{node}' is not a tool node of this host").into()))
    }
    /// Settles at-most-once call `index`, found started by an earlier attempt but never completed:
    /// the host's answer for the model, a human's via `interrupt()` (`HostFailure::Interrupt`), or
    /// `Retry`. The default tells the model the outcome is unknown.
    /// `retries_spent`: the human "retry" answers already spent on the call (a human host asks
    /// its next question, not the one those answered).
    fn unknown_outcome(
        &self,
        _node: &str,
        _index: usize,
        idempotency_key: Option<String>,
        _retries_spent: u64,
    ) -> Result<UnknownAnswer, HostFailure> {
        let text = format!(
            "The outcome of this call is unknown: it started earlier but its result was never recorded, and it \
             must run at most once, so it was not run again. Check whether it took effect (idempotency key {}) \
             before trying again. [TOOL_OUTCOME_UNKNOWN]",
            idempotency_key.as_deref().unwrap_or("none")
        );
        Ok(UnknownAnswer::Answer(ToolRun {
            envelope: crate::store::shared_json(&serde_json::json!({"__kind__": "raw", "value": text})),
            record: false,
            is_error: true,
        }))
    }
    /// Call `index` returned and its result is recorded (or needs no record): a streaming host
    /// shows it now, never before the ledger has it.
    fn tool_settled(&self, _node: &str, _index: usize) {}
    /// Call `index`, cut off by its `tool_timeout`, had already returned (the limit ran out in
    /// the host's code after the tool, an after-invoke callback say): its result, which stands,
    /// so the model is not told a call that took effect timed out. None: it had not returned.
    fn returned_when_cut(&self, _node: &str, _index: usize) -> Option<ToolRun> {
        None
    }
    /// Tool node `node` was dropped while it ran (node_timeout, a stop, a lost lease): its calls'
    /// ledger writes in flight went with it, and a call that returned after the drop was never
    /// handed back. A host that keeps what its calls returned records them before the run ends.
    fn tools_cut(&self, _node: &str) {}
    /// Whether nothing of the user's (a lifecycle hook) runs between a tool
    /// node's last result and the commit of its step: the engine then lets that commit carry the
    /// node's last ledger rows. A host that runs user code there says false.
    fn quiet_after_tools(&self) -> bool {
        true
    }
    /// Merges the calls' results (and branch state) into the live state, in call order.
    fn finish_tools(&self, node: &str, _outcomes: Vec<ToolOutcome>) -> Result<NodeOutput, HostFailure> {
        Err(HostFailure::Passthrough(format!("node '{node}' is not a tool node of this host").into()))
    }
}
