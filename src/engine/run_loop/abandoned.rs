//! A run whose future is dropped before it ends (its caller cancelled `ainvoke`, left a stream
//! early, or a sync wrapper was interrupted) still holds its lease row. The run's own release is
//! an `await` at the end of `run`, which a dropped future never reaches: in this process the
//! thread was free at once (the run left `live_runs`), but every other process found it busy
//! until the lease expired (`lease_ttl`; `on_busy="reject"` refused it, `"wait"` waited that
//! long). Red-team, session 23: 190 of 252 cancelled runs' rows still held once every run had
//! returned.
//!
//! The guard below sends that release on its own task when the future is dropped with the lease
//! still held. Safe for the same reasons an expiry is: the dropped run writes nothing more (its
//! future is gone); a statement of it still in flight at the server is fenced by its token and
//! versioned, so it either commits before the next holder takes the lease (which then reads it)
//! or is refused; and the release names this run's token, so it frees nothing a newer holder has.

use super::Lease;
use crate::store::Checkpointer;
use std::sync::{Arc, OnceLock};

/// Releases the run's lease on a task of its own if the run's future is dropped while holding it.
pub(super) struct ReleaseIfAbandoned<'a> {
    cell: &'a OnceLock<Lease>,
    store: &'a Arc<dyn Checkpointer>,
    /// The run reached its own release (or returned): nothing to do on drop.
    finished: bool,
}

impl<'a> ReleaseIfAbandoned<'a> {
    pub(super) fn new(cell: &'a OnceLock<Lease>, store: &'a Arc<dyn Checkpointer>) -> Self {
        ReleaseIfAbandoned { cell, store, finished: false }
    }

    pub(super) fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for ReleaseIfAbandoned<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let Some(lease) = self.cell.get().filter(|l| !l.released()) else { return };
        // The host drops a run's future inside the runtime's context; outside one (no runtime
        // left at interpreter exit) the lease expires by itself, as before.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let (store, thread_id, token) = (Arc::clone(self.store), lease.thread_id.clone(), lease.token);
        tracing::debug!(thread_id = %thread_id, "the run was abandoned (its caller cancelled it): releasing its lease");
        rt.spawn(async move {
            if let Err(e) = store.lease_release(&thread_id, token).await {
                tracing::warn!(thread_id = %thread_id, "could not release an abandoned run's lease (it expires by itself): {e}");
            }
        });
    }
}
