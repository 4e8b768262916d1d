//! Store calls that hold a connection across statements (a transaction) run as tasks on the
//! runtime, not in the caller's future.
//!
//! The caller's future may be polled from an asyncio loop's thread (src/py/driver.rs). A loop
//! stopped for good mid-run (`run_until_complete` returning after a cancel, a loop closed with its
//! tasks pending) froze such a future between two statements: its transaction kept the file's
//! write lock, and every later write, of this process and of any other on the file, failed after
//! the busy wait (red-team, session 25). As a task, the transaction runs to its end whether or not
//! anybody polls the caller. A caller that is dropped still aborts it, as dropping it inline did
//! (the transaction rolls back): only a caller nobody drives any more no longer stops it.

use super::SqliteStore;
use crate::store::{StepWrite, StoreError, StoreResult, StoredMessage};
use serde_json::Value;
use std::future::Future;

impl SqliteStore {
    /// Runs `body` on a clone of the store as a task, and waits for it.
    pub(super) async fn in_task<T, F>(&self, op: &'static str, body: impl FnOnce(SqliteStore) -> F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Future<Output = StoreResult<T>> + Send + 'static,
    {
        let task = tokio::spawn(body(self.clone()));
        let _abort = AbortOnDrop(task.abort_handle());
        match task.await {
            Ok(out) => out,
            Err(e) => Err(StoreError::backend(op, e)),
        }
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        // A no-op once the task ended.
        self.0.abort();
    }
}

/// A `StepWrite`'s data, owned, for a task. Without its failpoint hook: a step with one armed
/// runs inline (the hook is borrowed, and only tests arm it).
pub(super) struct OwnedStep {
    expected_version: i64,
    state: Value,
    new_messages: Vec<StoredMessage>,
    replace_messages: bool,
    fence: Option<i64>,
    release_lease: bool,
    previous_mark: Option<String>,
}

impl OwnedStep {
    pub(super) fn of(w: &StepWrite<'_>) -> Self {
        OwnedStep {
            expected_version: w.expected_version,
            state: w.state.clone(),
            new_messages: w.new_messages.to_vec(),
            replace_messages: w.replace_messages,
            fence: w.fence,
            release_lease: w.release_lease,
            previous_mark: w.previous_mark.map(str::to_owned),
        }
    }

    pub(super) fn write(&self) -> StepWrite<'_> {
        StepWrite {
            expected_version: self.expected_version,
            state: &self.state,
            new_messages: &self.new_messages,
            replace_messages: self.replace_messages,
            fence: self.fence,
            release_lease: self.release_lease,
            in_tx: None,
            previous_mark: self.previous_mark.as_deref(),
        }
    }
}
