//! Finding the runs that died: threads whose latest state is `running` while nobody live holds
//! their lease. The listing is advisory: a run may start or finish between this read and the
//! resume, so the resume itself takes the lease (`on_busy = reject`) and, under it, goes ahead
//! only if the thread is still running (`RunInput::resume_only`).

use super::lease::holder_is_dead;
use crate::store::{Checkpointer, LeaseInfo, StoreError, StoreResult, ThreadRef};

/// A thread whose latest state says a run is under way.
#[derive(Debug, Clone)]
pub struct RecoveryCandidate {
    /// The thread and its owner (the user to resume it as).
    pub thread: ThreadRef,
    /// The live holder of its lease: a run in progress in another process or on another machine
    /// (or in this process). None: the lease is free, expired, released, or its holder's process
    /// is gone; the run died and the thread can be resumed.
    pub holder: Option<LeaseInfo>,
    /// Why the store refuses this thread's id (a 10xGraph-written id 0 or below on an int
    /// schema): it can never be resumed here, and is reported rather than failing the page.
    pub refused: Option<String>,
}

/// One page of recovery candidates, by thread id after `after` (at most `limit`).
pub async fn recovery_candidates(
    store: &dyn Checkpointer,
    after: Option<&str>,
    limit: i64,
) -> StoreResult<Vec<RecoveryCandidate>> {
    let threads = store.running_threads(after, limit).await?;
    let mut out = Vec::with_capacity(threads.len());
    for thread in threads {
        // One legacy row the id type refuses must not stop the pass for every other thread
        // (red-team, session 35: a 10xGraph thread "0" left every crashed run unrecovered).
        let lease = match store.lease_get(&thread.thread_id).await {
            Ok(lease) => lease,
            Err(e @ (StoreError::BadId { .. } | StoreError::BadTextId { .. })) => {
                out.push(RecoveryCandidate { thread, holder: None, refused: Some(e.to_string()) });
                continue;
            }
            Err(e) => return Err(e),
        };
        // No run is asking (""), so a holder in this process counts as alive exactly while one
        // of its runs is still registered.
        let holder = lease.filter(|l| l.is_live() && !holder_is_dead(&thread.thread_id, "", l));
        out.push(RecoveryCandidate { thread, holder, refused: None });
    }
    Ok(out)
}
