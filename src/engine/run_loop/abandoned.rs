//! A run whose future is dropped before it ends (its caller cancelled `ainvoke`, left a stream
//! early, or a sync wrapper was interrupted) still holds its lease row: the run's own release is
//! an `await` at the end of `run`, which a dropped future never reaches. Other processes found
//! the thread busy until the lease expired (`lease_ttl`); red-team, session 23: 190 of 252
//! cancelled runs' rows still held once every run had returned.
//!
//! The lease is not freed on the spot, though: the host still has work of the run to do. The
//! results of tools that returned before the drop are written to the ledger after it
//! (`record_finished_tools` in Python), and a resume that took the thread before those writes
//! landed fired a returned idempotent tool again, or read an at-most-once one as an unknown
//! outcome (red-team, session 23: a stream dropped without `aclose()` beside a waiting resume in
//! the same process, 3 of 60). So the dropped run's lease, with its entry among this process's
//! live runs, is parked here until the host says its late writes are done (`release_abandoned`),
//! or at most [`SETTLE_BOUND`]. Another process finds the row held (and follows its `on_busy`);
//! a run of this process waits for the parked run whatever its `on_busy` says (`settling`): the
//! caller's own retry, started the moment its cancel returned, must be neither refused by its
//! own cancelled run (a first try refused it) nor let in before the writes. Safe as an expiry is:
//! the run writes nothing more through the engine, a statement of it still in flight is fenced
//! and versioned, and the release names its token, so it frees nothing a newer holder has.

use super::Lease;
use crate::engine::lease::LiveRun;
use crate::store::Checkpointer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The longest a dropped run's lease waits for its host: the host's own bounds (tool tasks
/// unwinding 5 s, each late write 10 s) with room for a few writes.
pub const SETTLE_BOUND: Duration = Duration::from_secs(60);

struct Parked {
    store: Arc<dyn Checkpointer>,
    token: i64,
    /// Keeps the run live for this process until the host is done (see `settling`).
    live: LiveRun,
}

fn parked() -> &'static Mutex<HashMap<(String, String), Parked>> {
    static PARKED: OnceLock<Mutex<HashMap<(String, String), Parked>>> = OnceLock::new();
    PARKED.get_or_init(Default::default)
}

/// The host's word that the dropped run `run_id` on `thread_id` has nothing more to write: its
/// parked lease (if any) is released now. Does nothing for a run that ended on its own.
pub fn release_abandoned(thread_id: &str, run_id: &str) {
    let entry = parked().lock().unwrap_or_else(|p| p.into_inner()).remove(&(thread_id.to_owned(), run_id.to_owned()));
    let Some(Parked { store, token, live }) = entry else { return };
    // Leaves this process's live runs now, before the row is free: a run of this process waiting
    // for it takes the row over at once (its holder is this process, with no live run under it).
    drop(live);
    let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
    let thread_id = thread_id.to_owned();
    rt.spawn(async move {
        if let Err(e) = store.lease_release(&thread_id, token).await {
            tracing::warn!(thread_id = %thread_id, "could not release a cancelled run's lease (it expires by itself): {e}");
        }
    });
}

/// Whether `run_id`'s lease on `thread_id` is parked: its run was dropped by this process and its
/// late writes are not done yet. A run of this process waits for it rather than follow `on_busy`.
pub fn settling(thread_id: &str, run_id: &str) -> bool {
    parked().lock().unwrap_or_else(|p| p.into_inner()).contains_key(&(thread_id.to_owned(), run_id.to_owned()))
}

/// Holds the run's lease cell; parks the lease if the run's future is dropped holding it.
pub(super) struct ReleaseIfAbandoned {
    pub(super) cell: OnceLock<Lease>,
    /// None: the caller lends the store and cannot hand it on (the lease expires), or the run
    /// reached its own release (nothing to do on drop).
    store: Option<Arc<dyn Checkpointer>>,
    run_id: String,
}

impl ReleaseIfAbandoned {
    pub(super) fn new(store: Option<&Arc<dyn Checkpointer>>, run_id: &str) -> Self {
        ReleaseIfAbandoned { cell: OnceLock::new(), store: store.cloned(), run_id: run_id.to_owned() }
    }

    pub(super) fn finish(mut self) {
        self.store = None;
    }
}

impl Drop for ReleaseIfAbandoned {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else { return };
        let Some(lease) = self.cell.take().filter(|l| !l.released()) else { return };
        // The host drops a run's future inside the runtime's context; outside one (no runtime
        // left at interpreter exit) the lease expires by itself, as before.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let key = (lease.thread_id.clone(), std::mem::take(&mut self.run_id));
        tracing::debug!(thread_id = %key.0, "the run was abandoned (its caller cancelled it): its lease is released once its late writes are done");
        let (token, live) = lease.into_parked();
        parked().lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), Parked { store, token, live });
        rt.spawn(async move {
            tokio::time::sleep(SETTLE_BOUND).await;
            release_abandoned(&key.0, &key.1);
        });
    }
}
