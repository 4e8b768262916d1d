//! Tool results this process kept in memory because their ledger write failed
//! (`store::UnrecordedResults`), written while the process lives and when its store closes, so
//! that a resume in another process finds them.

use super::record::{NotRecorded, log_not_recorded, put_rows};
use crate::store::{Checkpointer, LedgerRow, StoreError, THREAD_MUST_EXIST};

/// Writes the results this process kept because their ledger write failed
/// (`store::UnrecordedResults`), so that a resume in another process finds them: otherwise it runs
/// an idempotent call again, or answers an at-most-once one "outcome unknown". Each thread's rows
/// in one write, the first result recorded for a key winning, so a row another process recorded
/// meanwhile stays. The write is scoped as the run's calls were (owner-scoped where the run was;
/// a store that isolates users checks the owner anyway), and the thread must still exist: a
/// deleted thread stays deleted. Rows the store refuses by its rules (the thread gone, another
/// user's) are dropped; rows not written by `deadline`, or refused for a passing reason, stay for
/// the next try. `last`: the store is closing, so rows still unwritten are lost, and say so.
pub async fn record_kept(store: &dyn Checkpointer, deadline: tokio::time::Instant, last: bool) {
    let Some(kept) = store.unrecorded() else { return };
    for (thread, rows) in kept.pending_rows() {
        let ledger: Vec<LedgerRow> = rows.iter().map(|(k, r)| (k.clone(), r.envelope.clone())).collect();
        let write = put_rows(store, &thread, &ledger, Some(THREAD_MUST_EXIST));
        let result = match tokio::time::timeout_at(deadline, write).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Transient { op: "ledger write", message: "not done by its deadline".into() }),
        };
        let keys = rows.iter().map(|(k, _)| k.as_str());
        match result {
            Ok(_) => {
                kept.mark_recorded(&thread, keys);
                tracing::info!(
                    thread_id = %thread.thread_id,
                    rows = rows.len(),
                    event = "unrecorded_results_recorded",
                    "tool results this process could not record when their tools returned are recorded now"
                );
            }
            Err(e) => {
                let why = NotRecorded::from(&e);
                if !why.keep {
                    // Refused by the store's rules: they must not answer a thread made again
                    // under its id, nor another user's.
                    kept.drop_keys(&thread, keys);
                }
                if !why.keep || last {
                    for (key, r) in &rows {
                        log_not_recorded(&thread.thread_id, None, &r.tool, key, &why.error);
                    }
                } else {
                    tracing::warn!(
                        thread_id = %thread.thread_id,
                        rows = rows.len(),
                        error = %why.error,
                        event = "unrecorded_results_retry",
                        "tool results kept in memory could not be recorded yet; tried again later"
                    );
                }
            }
        }
    }
}

/// Starts a task that tries to record the results `store` keeps (see [`record_kept`]) while the
/// process lives, backing off from 1 s to a minute between tries, for about 15 minutes, each try
/// bounded by 2 s (a close waits for its connection); a later run that ends with results kept
/// starts it again, and closing the store stops it. One at a time per store; it holds the store
/// weakly and ends when nothing is left to record.
pub fn spawn_kept_recorder(store: &std::sync::Arc<dyn Checkpointer>) {
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let Some(kept) = store.unrecorded() else { return };
    if kept.pending() == 0 || kept.closing.load(Ordering::Acquire) || kept.recorder.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak = std::sync::Arc::downgrade(store);
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_secs(1);
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(60));
            let Some(store) = weak.upgrade() else { return };
            let Some(kept) = store.unrecorded() else { return };
            if kept.closing.load(Ordering::Acquire) {
                return; // the close makes the last try; the flag stays set, so none starts again
            }
            record_kept(&*store, tokio::time::Instant::now() + Duration::from_secs(2), false).await;
            let give_up = started.elapsed() > Duration::from_secs(15 * 60);
            if kept.pending() == 0 || give_up {
                kept.recorder.store(false, Ordering::Release);
                if give_up && kept.pending() > 0 {
                    tracing::warn!(
                        results = kept.pending(),
                        event = "unrecorded_results_recorder_gave_up",
                        "tool results kept in memory could not be recorded for 15 minutes; they stay kept for \
                         their threads' next attempts here and for the store's close, and a resume elsewhere may \
                         run their calls again"
                    );
                }
                // A result kept after the check above found the flag still set and started no
                // recorder: this one goes on for it.
                if give_up || kept.pending() == 0 || kept.recorder.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        }
    });
}
