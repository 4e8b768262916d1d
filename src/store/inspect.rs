//! What operators read back (the `tenxgraph` CLI): every ledger row of a thread and its stored
//! state versions. Read-only; runs never use these.

use serde_json::Value;

/// One ledger row. `result` is None when the stored text is not JSON (a malformed row, which a
/// replay treats as no record). `created_at` is seconds since the epoch; None where the backend
/// keeps no time (in-memory).
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerEntry {
    /// The ledger key (a call's key as the engine writes it).
    pub key: String,
    /// The recorded value, result or intent record; None when not JSON.
    pub result: Option<Value>,
    /// When the row was written, seconds since the epoch; None on the in-memory store.
    pub created_at: Option<f64>,
}

/// One stored state version (the state without its messages), newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct StateVersion {
    /// The version the step that wrote it committed (1 for a thread's first step).
    pub version: i64,
    /// When it was written, seconds since the epoch; None on the in-memory store.
    pub created_at: Option<f64>,
    /// The state as stored, without the messages.
    pub state: Value,
}
