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
//! the same process, 3 of 60). So the dropped run's lease row is released only once the host says
//! its late writes are done (`release_abandoned`), or after at most [`SETTLE_BOUND`]: another
//! process waits for them. This process's own runs still see the thread free the moment the
//! future is dropped (its entry among the live runs goes with the lease), as before: a retry the
//! caller starts at once must not be refused by its own cancelled run; the same-process race
//! above is left open (docs/reliability.md, session 23). Safe as an expiry is: the run writes
//! nothing more through the engine, a statement of it still in flight is fenced and versioned,
//! and the release names its token, so it frees nothing a newer holder has.

use super::Lease;
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
}

fn parked() -> &'static Mutex<HashMap<(String, String), Parked>> {
    static PARKED: OnceLock<Mutex<HashMap<(String, String), Parked>>> = OnceLock::new();
    PARKED.get_or_init(Default::default)
}

/// The host's word that the dropped run `run_id` on `thread_id` has nothing more to write: its
/// parked lease (if any) is released now. Does nothing for a run that ended on its own.
pub fn release_abandoned(thread_id: &str, run_id: &str) {
    let entry = parked().lock().unwrap_or_else(|p| p.into_inner()).remove(&(thread_id.to_owned(), run_id.to_owned()));
    let Some(Parked { store, token }) = entry else { return };
    let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
    let thread_id = thread_id.to_owned();
    rt.spawn(async move {
        if let Err(e) = store.lease_release(&thread_id, token).await {
            tracing::warn!(thread_id = %thread_id, "could not release a cancelled run's lease (it expires by itself): {e}");
        }
    });
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
        // This process's own runs see the thread free at once, as before (the lease's entry
        // among the live runs goes with it); the row waits for the host.
        parked().lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), Parked { store, token: lease.token });
        drop(lease);
        rt.spawn(async move {
            tokio::time::sleep(SETTLE_BOUND).await;
            release_abandoned(&key.0, &key.1);
        });
    }
}
