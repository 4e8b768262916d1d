//! The at-most-once calls of a run whose intent rows are committed but whose tools have not
//! started. A run dropped in that window (its caller cancelled it, left a stream) never
//! ran them, but their rows read "started": the resume could not tell them from a call cut off
//! mid-flight and answered each with an unknown outcome, so the work was lost (red-team, session
//! 23: 1-3 calls in 25-40 rounds of leaving a stream). Once the dropped run's host is done
//! (`run_loop::abandoned`), these rows are marked as a pause marks them: the resume runs the call,
//! after marking it started again. Fenced by the dropped run's own lease token: if another holder
//! took the thread meanwhile, nothing is marked and the rows keep reading "started".
//!
//! A call is marked handed over just *before* `NodeHost::run_tool` is called: from then on the
//! host may have started it, and its row keeps saying so, unless the host says which handed-over
//! calls' tools it started (`release_abandoned`'s `entered`): the others never ran. (The Python
//! host's tool tasks run on the loop that dropped the run, which cancels those not started yet.)

use super::RunConfig;
use crate::store::{Checkpointer, ThreadRef, is_intent, is_paused};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

struct Calls {
    thread: ThreadRef,
    /// Ledger key -> the row that marks the call as not run (a paused intent), and whether the
    /// call was handed to the host.
    marks: HashMap<String, (Value, bool)>,
}

fn registry() -> &'static Mutex<HashMap<(String, String), Calls>> {
    static CALLS: OnceLock<Mutex<HashMap<(String, String), Calls>>> = OnceLock::new();
    CALLS.get_or_init(Default::default)
}

fn key(thread_id: &str, run_id: &str) -> (String, String) {
    (thread_id.to_owned(), run_id.to_owned())
}

/// The run is about to write intent rows for these calls (`marks`: each one's paused row, with
/// the attempt of the intent it replaces) and then run them.
pub(super) fn waiting(cfg: &RunConfig, marks: impl IntoIterator<Item = (String, Value)>) {
    let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
    let entry = map
        .entry(key(&cfg.thread.thread_id, &cfg.run_id))
        .or_insert_with(|| Calls { thread: cfg.thread.clone(), marks: HashMap::new() });
    entry.marks.extend(marks.into_iter().map(|(k, mark)| (k, (mark, false))));
}

/// The call is handed to the host now.
pub(super) fn handed_over(cfg: &RunConfig, ledger_key: &str) {
    let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, handed)) =
        map.get_mut(&key(&cfg.thread.thread_id, &cfg.run_id)).and_then(|calls| calls.marks.get_mut(ledger_key))
    {
        *handed = true;
    }
}

/// The run ended without being dropped (or its lease is not parked): nothing to mark.
pub(super) fn forget(thread_id: &str, run_id: &str) {
    registry().lock().unwrap_or_else(|p| p.into_inner()).remove(&key(thread_id, run_id));
}

/// Marks the dropped run's calls that never started, fenced by its lease `token`: those whose row
/// is still the intent this run wrote (its `attempt`), not paused. Under the fence no other run
/// writes intents between the read and the mark (it would hold a newer token).
/// `entered`: the keys of the calls whose tools the host started (None: it did not say, and every
/// call handed over counts as started).
pub(super) async fn mark_not_started(
    store: &dyn Checkpointer,
    thread_id: &str,
    run_id: &str,
    token: i64,
    entered: Option<&HashSet<String>>,
) {
    let Some(mut calls) = registry().lock().unwrap_or_else(|p| p.into_inner()).remove(&key(thread_id, run_id)) else {
        return;
    };
    calls.marks.retain(|k, (_, handed)| !*handed || entered.is_some_and(|e| !e.contains(k)));
    if calls.marks.is_empty() {
        return;
    }
    let keys: Vec<String> = calls.marks.keys().cloned().collect();
    // A run dropped while its intent commit was in flight: the commit may land after the drop
    // (a COMMIT the server already has). Under the parked lease nobody else writes these rows,
    // so rows still missing are waited for a little (red-team: read before the commit landed,
    // 10-22 of 40 streams left at their second event read as unknown outcomes).
    let mut rows = HashMap::new();
    for pause in [0, 20, 100, 300, 1000] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        rows = match store.ledger_get(&calls.thread, &keys).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(thread_id = %thread_id, run_id = %run_id,
                    "could not read the ledger of a cancelled run's unstarted tool calls; a resume reads them as unknown outcomes: {e}");
                return;
            }
        };
        if keys.iter().all(|k| rows.contains_key(k)) {
            break;
        }
    }
    fn attempt(v: &Value) -> Option<&str> {
        v.get("attempt").and_then(Value::as_str)
    }
    let marks: Vec<(String, Value)> = calls
        .marks
        .into_iter()
        .map(|(k, (mark, _))| (k, mark))
        .filter(|(k, mark)| {
            rows.get(k).is_some_and(|row| {
                is_intent(row) && !is_paused(row) && attempt(row).is_some_and(|a| Some(a) == attempt(mark))
            })
        })
        .map(|(k, mut mark)| {
            // The human "retry" answers the row counts as spent stay counted: a retry cancelled
            // before its call started, then crashed on resume, found its spent "retry" again.
            if let Some(spent) = rows.get(&k).and_then(|row| row.get(super::tools::RETRIES_FIELD)) {
                mark[super::tools::RETRIES_FIELD] = spent.clone();
            }
            (k, mark)
        })
        .collect();
    if marks.is_empty() {
        return;
    }
    match store.ledger_mark(&calls.thread, &marks, Some(token)).await {
        Ok(n) => tracing::info!(
            thread_id = %thread_id,
            run_id = %run_id,
            event = "unstarted_calls_marked",
            "the cancelled run had not started {n} tool call(s) it recorded as started; a resume runs them"
        ),
        Err(e) => tracing::warn!(
            thread_id = %thread_id,
            run_id = %run_id,
            "could not record that {} tool call(s) of a cancelled run never started; a resume reads them as unknown outcomes: {e}",
            marks.len()
        ),
    }
}
