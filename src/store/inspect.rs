//! What operators read back (the `tenxgraph` CLI): every ledger row of a thread and its stored
//! state versions. Read-only; runs never use these.

use serde_json::Value;

/// One ledger row. `result` is None when the stored text is not JSON (a malformed row, which a
/// replay treats as no record). `created_at` is seconds since the epoch; None where the backend
/// keeps no time (in-memory).
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerEntry {
    pub key: String,
    pub result: Option<Value>,
    pub created_at: Option<f64>,
}

/// One stored state version (the state without its messages), newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct StateVersion {
    pub version: i64,
    pub created_at: Option<f64>,
    pub state: Value,
}
