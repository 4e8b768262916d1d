//! A store call run as a task on the runtime instead of in the caller's future.
//!
//! The caller's future may be polled from an asyncio loop's thread (src/py/driver.rs). A loop
//! stopped for good mid-call (`run_until_complete` returning while the call is pending, a loop
//! left with its tasks pending) froze such a future: a transaction it held kept its locks (the
//! SQLite file's write lock, PostgreSQL's row locks) and its pooled connection was never given
//! back. As a task the call runs to its end whether or not anybody polls the caller. A caller
//! that is dropped still aborts it (its transaction rolls back), as dropping it inline did: only
//! a caller nobody drives any more no longer stops it.

use super::{StoreError, StoreResult};
use std::future::Future;

/// Runs `fut` as a task and waits for it; aborted if this future is dropped first.
pub async fn to_the_end<T, F>(op: &'static str, fut: F) -> StoreResult<T>
where
    T: Send + 'static,
    F: Future<Output = StoreResult<T>> + Send + 'static,
{
    let task = tokio::spawn(fut);
    let _abort = AbortOnDrop(task.abort_handle());
    match task.await {
        Ok(out) => out,
        Err(e) => Err(StoreError::backend(op, e)),
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        // A no-op once the task ended.
        self.0.abort();
    }
}
