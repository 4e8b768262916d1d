use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `ExecutionStatus` of 10xGraph, same string values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    Running,
    InterruptedBefore,
    InterruptedAfter,
    Completed,
    Error,
}

impl ExecStatus {
    pub fn is_interrupted(self) -> bool {
        matches!(self, ExecStatus::InterruptedBefore | ExecStatus::InterruptedAfter)
    }
}

/// The part of `execution_meta` the loop owns. The engine is its source of truth; the host copies
/// it into the live state before user code runs and before a snapshot. `internal_data` is not
/// here: it belongs to user code and travels inside the state snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecMeta {
    pub current_node: String,
    #[serde(default)]
    pub step: i64,
    pub status: ExecStatus,
    #[serde(default)]
    pub interrupted_node: Option<String>,
    #[serde(default)]
    pub interrupt_reason: Option<String>,
    #[serde(default)]
    pub interrupt_data: Option<Value>,
    #[serde(default)]
    pub thread_id: Option<String>,
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

    pub fn set_interrupt(&mut self, node: &str, reason: String, status: ExecStatus, data: Option<Value>) {
        self.interrupted_node = Some(node.into());
        self.interrupt_reason = Some(reason);
        self.status = status;
        self.interrupt_data = data;
    }

    pub fn clear_interrupt(&mut self) {
        self.interrupted_node = None;
        self.interrupt_reason = None;
        self.interrupt_data = None;
        self.status = ExecStatus::Running;
    }
}
