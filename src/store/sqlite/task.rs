//! Store calls that hold a connection across statements (a transaction) run as tasks on the
//! runtime, not in the caller's future (`store::task`): a loop stopped for good mid-run froze
//! such a future between two statements, its transaction keeping the file's write lock, and every
//! later write, of this process and of any other on the file, failed after the busy wait
//! (red-team, session 25).

use super::SqliteStore;
use crate::store::{SharedJson, StepWrite, StoreResult, StoredMessage};
use std::future::Future;

impl SqliteStore {
    /// Runs `body` on a clone of the store as a task, and waits for it.
    pub(super) async fn in_task<T, F>(&self, op: &'static str, body: impl FnOnce(SqliteStore) -> F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Future<Output = StoreResult<T>> + Send + 'static,
    {
        crate::store::task::to_the_end(op, body(self.clone())).await
    }
}

/// A `StepWrite`'s data, owned, for a task. Without its failpoint hook: a step with one armed
/// runs inline (the hook is borrowed, and only tests arm it).
pub(super) struct OwnedStep {
    expected_version: i64,
    state: SharedJson,
    mark: Option<String>,
    new_messages: Vec<StoredMessage>,
    replace_messages: bool,
    fence: Option<i64>,
    release_lease: bool,
    previous_mark: Option<String>,
    expected_mark: Option<String>,
}

impl OwnedStep {
    pub(super) fn of(w: &StepWrite<'_>) -> Self {
        OwnedStep {
            expected_version: w.expected_version,
            state: w.state.clone(),
            mark: w.mark.map(str::to_owned),
            new_messages: w.new_messages.to_vec(),
            replace_messages: w.replace_messages,
            fence: w.fence,
            release_lease: w.release_lease,
            previous_mark: w.previous_mark.map(str::to_owned),
            expected_mark: w.expected_mark.map(str::to_owned),
        }
    }

    pub(super) fn write(&self) -> StepWrite<'_> {
        StepWrite {
            expected_version: self.expected_version,
            state: &self.state,
            mark: self.mark.as_deref(),
            new_messages: &self.new_messages,
            replace_messages: self.replace_messages,
            fence: self.fence,
            release_lease: self.release_lease,
            in_tx: None,
            previous_mark: self.previous_mark.as_deref(),
            expected_mark: self.expected_mark.as_deref(),
        }
    }
}
