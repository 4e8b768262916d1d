//! How a Postgres store is configured.

use std::time::Duration;

/// The settings of a `PgStore`; `Default` gives 10xGraph 0.10's defaults.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// The schema holding every table and function (checked by `validate_schema`).
    pub schema: String,
    /// Pool size: at most this many connections are open at once.
    pub max_connections: u32,
    /// How long a query waits for a pooled connection, and a connection attempt for the server,
    /// before failing with `StoreError::Transient`.
    pub acquire_timeout: Duration,
    /// State rows kept per thread (older ones are deleted by each step); 0 or less keeps all.
    pub state_history_limit: i32,
    /// Threads are private to the user who created them: another user reads nothing and writes
    /// fail with `StoreError::Forbidden`.
    pub enforce_user_isolation: bool,
    /// Connection attempts before `TransientStorageError` (with 0.2 s, 0.4 s, ... backoff).
    pub connect_retries: u32,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: "public".into(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            state_history_limit: 20,
            enforce_user_isolation: true,
            connect_retries: 3,
        }
    }
}
