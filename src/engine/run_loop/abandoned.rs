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
//! or at most [`SETTLE_BOUND`], renewed meanwhile as its run renewed it (`keep_parked`). Another
//! process finds the row held (and follows its `on_busy`); a run of this process waits for the
//! parked run whatever its `on_busy` says (`settling_thread`): the
//! caller's own retry, started the moment its cancel returned, must be neither refused by its
//! own cancelled run (a first try refused it) nor let in before the writes. Safe as an expiry is:
//! the run writes nothing more through the engine, a statement of it still in flight is fenced
//! and versioned, and the release names its token, so it frees nothing a newer holder has.

use super::Lease;
use crate::engine::lease::LiveRun;
use crate::engine::unstarted;
use crate::store::Checkpointer;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The longest a dropped run's lease waits for its host: the host's own bounds (tool tasks
/// unwinding 5 s, each late write 10 s) with room for a few writes.
pub const SETTLE_BOUND: Duration = Duration::from_secs(60);

/// The longest the mark of a dropped run's unstarted calls may take (one statement).
const MARK_BOUND: Duration = Duration::from_secs(10);

struct Parked {
    store: Arc<dyn Checkpointer>,
    token: i64,
    /// Keeps the run live for this process until the host is done (see `settling_thread`).
    _live: LiveRun,
    /// `release_abandoned` is under way (the host's call, or the bound's).
    releasing: bool,
}

fn parked() -> &'static Mutex<HashMap<(String, String), Parked>> {
    static PARKED: OnceLock<Mutex<HashMap<(String, String), Parked>>> = OnceLock::new();
    PARKED.get_or_init(Default::default)
}

/// The host's word that the dropped run `run_id` on `thread_id` has nothing more to write: the
/// calls whose tools never started are marked so (`unstarted`; `entered`: the ledger keys of the
/// calls whose tools the host started, None counting every call handed to it), then its parked
/// lease (if any) is released. Does nothing for a run that ended on its own.
pub fn release_abandoned(thread_id: &str, run_id: &str, entered: Option<HashSet<String>>) {
    let key = (thread_id.to_owned(), run_id.to_owned());
    let (store, token) = {
        let mut map = parked().lock().unwrap_or_else(|p| p.into_inner());
        let Some(p) = map.get_mut(&key).filter(|p| !p.releasing) else { return };
        p.releasing = true;
        (p.store.clone(), p.token)
    };
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        unstarted::forget(thread_id, run_id);
        parked().lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        return;
    };
    rt.spawn(async move {
        // Before the run leaves this process's live runs (a run of this process waiting for the
        // thread must find the calls marked), and bounded (a store that hangs must not keep
        // those waiting runs past it).
        let marked = tokio::time::timeout(MARK_BOUND, unstarted::mark_not_started(&*store, &key.0, &key.1, token, entered.as_ref())).await;
        if marked.is_err() {
            tracing::warn!(thread_id = %key.0, "marking a cancelled run's unstarted tool calls took over {MARK_BOUND:?}; a resume reads them as unknown outcomes");
        }
        // Leaves this process's live runs now, before the row is free: a run of this process
        // waiting for it takes the row over at once (its holder is this process, with no live
        // run under it).
        drop(parked().lock().unwrap_or_else(|p| p.into_inner()).remove(&key));
        if let Err(e) = store.lease_release(&key.0, token).await {
            tracing::warn!(thread_id = %key.0, "could not release a cancelled run's lease (it expires by itself): {e}");
        }
        // Results the run could not record before or after its cancel: written while the process
        // lives (a run that ends on its own starts the recorder as it returns).
        crate::engine::tools::spawn_kept_recorder(&store);
    });
}

/// Whether a run of this process dropped on `thread_id` is still settling (any run id).
pub fn settling_thread(thread_id: &str) -> bool {
    let map = parked().lock().unwrap_or_else(|p| p.into_inner());
    !map.is_empty() && map.keys().any(|(t, _)| t == thread_id)
}

/// Whether the lease `token` of `key` in `store` is still parked (not released yet, nor replaced
/// by another run with that thread and run id, in this store or another).
fn still_parked(key: &(String, String), store: &Arc<dyn Checkpointer>, token: i64) -> bool {
    let same_store = |p: &Parked| std::ptr::addr_eq(Arc::as_ptr(&p.store), Arc::as_ptr(store));
    parked().lock().unwrap_or_else(|p| p.into_inner()).get(key).is_some_and(|p| p.token == token && same_store(p))
}

/// Keeps a parked lease as its run kept it, renewed every third of its `ttl`, until it is
/// released, and releases it after at most `SETTLE_BOUND`. Unrenewed, it expired under the late
/// writes (default `lease_ttl` 5 s, the host's unwinding up to 5 s): another process, or this
/// one, took the thread before them and ran a returned tool again (red-team, session 24).
async fn keep_parked(store: Arc<dyn Checkpointer>, key: (String, String), token: i64, ttl: Duration) {
    let deadline = tokio::time::Instant::now() + SETTLE_BOUND;
    let every = (ttl / 3).max(Duration::from_millis(10));
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(every.min(left)).await;
        if !still_parked(&key, &store, token) {
            return;
        }
        match store.lease_renew(&key.0, token, ttl).await {
            Ok(true) => {}
            Ok(false) => break, // another holder has it: nothing left to keep
            Err(e) => {
                tracing::warn!(thread_id = %key.0, "could not renew a cancelled run's lease while its late writes land: {e}")
            }
        }
    }
    if still_parked(&key, &store, token) {
        release_abandoned(&key.0, &key.1, None);
    }
}

/// Holds the run's lease cell; parks the lease if the run's future is dropped holding it.
pub(super) struct ReleaseIfAbandoned {
    pub(super) cell: OnceLock<Lease>,
    /// None: the caller lends the store and cannot hand it on (the lease expires), or the run
    /// reached its own release (nothing to do on drop).
    store: Option<Arc<dyn Checkpointer>>,
    thread_id: String,
    run_id: String,
}

impl ReleaseIfAbandoned {
    pub(super) fn new(store: Option<&Arc<dyn Checkpointer>>, thread_id: &str, run_id: &str) -> Self {
        ReleaseIfAbandoned {
            cell: OnceLock::new(),
            store: store.cloned(),
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
        }
    }

    pub(super) fn finish(mut self) {
        self.store = None;
    }
}

impl Drop for ReleaseIfAbandoned {
    fn drop(&mut self) {
        // No store: the run ended (`finish`), or its caller lends the store and cannot hand it on
        // (the lease expires). No runtime (interpreter exit): the lease expires, as before.
        let (Some(store), Ok(rt)) = (self.store.take(), tokio::runtime::Handle::try_current()) else {
            unstarted::forget(&self.thread_id, &self.run_id);
            return;
        };
        let lease = match self.cell.take() {
            Some(lease) if !lease.released() => lease,
            Some(_) => return unstarted::forget(&self.thread_id, &self.run_id),
            None => {
                // Dropped before it held a lease, maybe while taking it: the take may land after
                // the drop, with no `Lease` left to release it.
                unstarted::forget(&self.thread_id, &self.run_id);
                let (thread_id, run_id) = (std::mem::take(&mut self.thread_id), std::mem::take(&mut self.run_id));
                rt.spawn(async move { crate::engine::lease::release_if_taken(&*store, &thread_id, &run_id).await });
                return;
            }
        };
        let key = (lease.thread_id.clone(), std::mem::take(&mut self.run_id));
        tracing::debug!(thread_id = %key.0, "the run was abandoned (its caller cancelled it): its lease is released once its late writes are done");
        let (token, ttl, live) = lease.into_parked();
        parked()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), Parked { store: store.clone(), token, _live: live, releasing: false });
        rt.spawn(keep_parked(store, key, token, ttl));
    }
}
