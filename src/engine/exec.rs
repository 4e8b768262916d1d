use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `ExecutionStatus` of 10xGraph, same string values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    /// A run is under way, or was cut off mid-run (crash): the next run resumes it.
    Running,
    /// Paused before `interrupted_node` runs (`interrupt_before`, or `interrupt()` inside it: the
    /// node runs again on resume).
    InterruptedBefore,
    /// Paused after a node's step was committed (`interrupt_after`, a stop, remote tool calls).
    InterruptedAfter,
    /// The run reached END.
    Completed,
    /// The run failed; the error is kept with the state.
    Error,
}

impl ExecStatus {
    /// Paused before or after a node.
    pub fn is_interrupted(self) -> bool {
        matches!(self, ExecStatus::InterruptedBefore | ExecStatus::InterruptedAfter)
    }
}

/// The part of `execution_meta` the loop owns. The engine is its source of truth; the host copies
/// it into the live state before user code runs and before a snapshot. `internal_data` is not
/// here: it belongs to user code and travels inside the state snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecMeta {
    /// The node the thread is at (the next to run, or the one it paused or failed at).
    pub current_node: String,
    /// Node executions committed on this thread.
    #[serde(default)]
    pub step: i64,
    /// Where the thread's run stands.
    pub status: ExecStatus,
    /// The node a pause happened at.
    #[serde(default)]
    pub interrupted_node: Option<String>,
    /// Why it paused (`interrupt_before`, `interrupt()`, a stop, ...).
    #[serde(default)]
    pub interrupt_reason: Option<String>,
    /// What the pause carries for the caller (a pending `interrupt()`'s question, ...).
    #[serde(default)]
    pub interrupt_data: Option<Value>,
    /// The thread's id, as 10xGraph stores it.
    #[serde(default)]
    pub thread_id: Option<String>,
    /// 10xGraph's stop flag: `none`, `stop_requested` or `stopped`.
    #[serde(default = "no_stop")]
    pub stop_current_execution: String,
    /// Set with `status == Error`; the host stores it as `internal_data["error"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn no_stop() -> String {
    "none".into()
}

impl ExecMeta {
    /// A new thread at `entry`, step 0, running.
    pub fn fresh(entry: &str, thread_id: &str) -> Self {
        ExecMeta {
            current_node: entry.into(),
            step: 0,
            status: ExecStatus::Running,
            interrupted_node: None,
            interrupt_reason: None,
            interrupt_data: None,
            thread_id: Some(thread_id.into()),
            stop_current_execution: no_stop(),
            error: None,
        }
    }

    /// Reads the loop's fields from a stored state; a row without a readable `execution_meta` is
    /// treated as a fresh thread rather than failing the run.
    pub fn from_state(state: &Value, entry: &str, thread_id: &str) -> Self {
        state
            .get("execution_meta")
            .and_then(|m| serde_json::from_value(m.clone()).ok())
            .unwrap_or_else(|| Self::fresh(entry, thread_id))
    }

    /// Records a pause at `node`.
    pub fn set_interrupt(&mut self, node: &str, reason: String, status: ExecStatus, data: Option<Value>) {
        self.interrupted_node = Some(node.into());
        self.interrupt_reason = Some(reason);
        self.status = status;
        self.interrupt_data = data;
    }

    /// Forgets the pause and sets the status back to running.
    pub fn clear_interrupt(&mut self) {
        self.interrupted_node = None;
        self.interrupt_reason = None;
        self.interrupt_data = None;
        self.status = ExecStatus::Running;
    }
}
