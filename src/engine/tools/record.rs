//! The tool ledger's writer for one tool node: results recorded the moment their tool returns,
//! grouped into one transaction when they return together, and the node's last results carried
//! into its step's commit.

use super::{ToolCall, ToolRun};
use crate::engine::RunConfig;
use crate::metrics::{inc, metrics};
use crate::store::{Checkpointer, LedgerRow, SharedJson, StoreError, ThreadRef, Unrecorded};
use std::sync::Mutex;
use tokio::sync::oneshot;

/// Group commit for the ledger. A result is written the moment its tool returns; results that
/// return while a write is in flight share the next transaction, so parallel tools do not pay one
/// commit (and one fsync) each. With `carry`, the results that return once no other call of the
/// node is still running are not written here: they go to the node's step, which is committed
/// next, in the same transaction (`Checkpointer::put_step_with_ledger`), one commit fewer per
/// tool node. A result returned while a sibling still runs is written at once, as always.
pub(super) struct Recorder<'a> {
    queue: Mutex<RecorderQueue>,
    /// The node wrote intent rows before its calls started (it has an at-most-once call).
    pub(super) intents_written: bool,
    /// Its intent rows' `attempt` (see `run_tool_node`).
    pub(super) attempt: String,
    carry: Option<&'a Carried>,
}

struct RecorderQueue {
    /// Each result, and who waits for its write.
    pending: Vec<(CarriedRow, oneshot::Sender<Result<Recorded, NotRecorded>>)>,
    writing: bool,
    /// Per call: it has settled (returned, failed, was answered without running).
    settled: Vec<bool>,
    /// Calls not settled yet.
    running: usize,
}

impl RecorderQueue {
    fn settle(&mut self, index: usize) {
        if let Some(done) = self.settled.get_mut(index).filter(|d| !**d) {
            *done = true;
            self.running -= 1;
        }
    }
}

/// Where a result went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    /// Committed in the ledger.
    Written,
    /// Handed to the node's step commit.
    Carried,
}

impl<'a> Recorder<'a> {
    pub(super) fn new(calls: usize, intents_written: bool, carry: Option<&'a Carried>, attempt: String) -> Self {
        let queue = RecorderQueue { pending: Vec::new(), writing: false, settled: vec![false; calls], running: calls };
        Recorder { queue: Mutex::new(queue), intents_written, carry, attempt }
    }

    /// Call `index` has settled (idempotent; `record` settles its call itself).
    pub(super) fn settle(&self, index: usize) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).settle(index);
    }

    /// Records `run` when it should be; a failure is logged as not recorded. Returns whether the
    /// result may be shown now (false: it waits for the step commit that carries its row).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn record_result(
        &self,
        store: &dyn Checkpointer,
        cfg: &RunConfig,
        fence: Option<i64>,
        index: usize,
        call: &ToolCall,
        key: Option<&str>,
        run: &ToolRun,
    ) -> bool {
        let (true, Some(k)) = (run.record, key) else { return true };
        match self.record(store, cfg, fence, index, k, &call.name, &run.envelope).await {
            Ok(Recorded::Written) => true,
            Ok(Recorded::Carried) => false,
            Err(e) => {
                not_recorded(store, cfg, &call.name, k, &run.envelope, &e);
                true
            }
        }
    }

    #[allow(clippy::too_many_arguments)] // each is a distinct fact of one call's record
    async fn record(
        &self,
        store: &dyn Checkpointer,
        cfg: &RunConfig,
        fence: Option<i64>,
        index: usize,
        key: &str,
        tool: &str,
        envelope: &SharedJson,
    ) -> Result<Recorded, NotRecorded> {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.pending.push((CarriedRow { key: key.to_owned(), result: envelope.clone(), tool: tool.to_owned() }, tx));
            // In the same critical section as the push: a writer that sees no call running has
            // every result in `pending`.
            q.settle(index);
            !std::mem::replace(&mut q.writing, true)
        };
        if lead {
            // Let the sibling calls that finished together with this one queue up first (they
            // are polled by the same task): tools returning at once share one transaction.
            tokio::task::yield_now().await;
            loop {
                let (batch, last) = {
                    let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                    if q.pending.is_empty() {
                        q.writing = false;
                        break;
                    }
                    (std::mem::take(&mut q.pending), q.running == 0)
                };
                let (rows, waiting): (Vec<CarriedRow>, Vec<_>) = batch.into_iter().unzip();
                let result = match (last, self.carry) {
                    (true, Some(carry)) => {
                        carry.push(rows);
                        Ok(Recorded::Carried)
                    }
                    _ => put_rows(store, &cfg.thread, &ledger_rows(&rows), fence)
                        .await
                        .map(|_| Recorded::Written)
                        .map_err(|e| NotRecorded::from(&e)),
                };
                for done in waiting {
                    let _ = done.send(result.clone());
                }
            }
        }
        rx.await.unwrap_or_else(|_| Err(NotRecorded { error: "the ledger writer was cancelled".into(), keep: true }))
    }
}

/// One ledger row a tool node left for its step's commit.
#[derive(Debug, Clone)]
pub struct CarriedRow {
    /// The ledger key.
    pub key: String,
    /// The recorded envelope.
    pub result: SharedJson,
    /// The tool's name (for the log line when the row cannot be recorded).
    pub tool: String,
}

/// Ledger rows a tool node left for its step's commit (see `Recorder`). The run loop commits them
/// with the step, or on their own (`write_carried`) when that commit fails or never comes.
#[derive(Debug, Default)]
pub struct Carried {
    rows: Mutex<Vec<CarriedRow>>,
}

impl Carried {
    fn push(&self, rows: Vec<CarriedRow>) {
        self.rows.lock().unwrap_or_else(|p| p.into_inner()).extend(rows);
    }

    /// The rows, emptied.
    pub fn take(&self) -> Vec<CarriedRow> {
        std::mem::take(&mut *self.rows.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The rows as the store takes them.
pub fn ledger_rows(rows: &[CarriedRow]) -> Vec<LedgerRow> {
    rows.iter().map(|r| (r.key.clone(), r.result.clone())).collect()
}

/// Carried rows written on their own, in one transaction: the commit meant to carry them failed
/// or never came. A failure is logged as "COMPLETED but could not be recorded" for each row;
/// returns whether the rows are in.
pub async fn write_carried(store: &dyn Checkpointer, cfg: &RunConfig, fence: Option<i64>, rows: &[CarriedRow]) -> bool {
    if rows.is_empty() {
        return true;
    }
    match put_rows(store, &cfg.thread, &ledger_rows(rows), fence).await {
        Ok(_) => true,
        Err(e) => {
            let e = NotRecorded::from(&e);
            for r in rows {
                not_recorded(store, cfg, &r.tool, &r.key, &r.result, &e);
            }
            false
        }
    }
}

/// A ledger write, tried again while its failures are transient and quick. Under a burst of
/// results (500 turns' tools returning at once on a small pool) a write failed at once for want
/// of a free connection, and its result was only kept in this process's memory (1,000 at most):
/// a resume elsewhere, or past that, ran the tool again. Trying again is safe, since the first
/// result recorded for a key wins. A slow failure (a server not answering within its deadline)
/// is not tried again: that would hold the node for several deadlines.
pub(super) async fn put_rows(
    store: &dyn Checkpointer,
    thread: &ThreadRef,
    rows: &[crate::store::LedgerRow],
    fence: Option<i64>,
) -> Result<usize, StoreError> {
    const TRIES: u32 = 5;
    const QUICK: std::time::Duration = std::time::Duration::from_secs(1);
    let mut pause = std::time::Duration::from_millis(20);
    let mut tries = 1;
    loop {
        let started = tokio::time::Instant::now();
        match store.ledger_put_many(thread, rows, fence).await {
            Err(StoreError::Transient { .. } | StoreError::LockWait { .. })
                if tries < TRIES && started.elapsed() < QUICK =>
            {
                tokio::time::sleep(pause).await;
                pause *= 4;
                tries += 1;
            }
            r => return r,
        }
    }
}

/// Why a result was not recorded, and whether the store may keep it for a later attempt.
#[derive(Debug, Clone)]
pub(super) struct NotRecorded {
    pub(super) error: String,
    /// False where the store refused by its rules rather than failed: the thread was deleted
    /// under the run (fenced, no lease left) or is another user's. A thread made again under
    /// the same id must not be answered with the deleted one's results.
    pub(super) keep: bool,
}

impl From<&StoreError> for NotRecorded {
    fn from(e: &StoreError) -> Self {
        let refused = matches!(e, StoreError::Fenced { current: None, .. } | StoreError::Forbidden { .. });
        NotRecorded { error: e.to_string(), keep: !refused }
    }
}

/// A failure to record is logged, never raised: the side effect already happened and the model
/// needs the result. The store keeps the result for the thread's next attempt in this process
/// (`store::UnrecordedResults`), unless the thread is gone.
fn not_recorded(
    store: &dyn Checkpointer,
    cfg: &RunConfig,
    tool: &str,
    key: &str,
    envelope: &SharedJson,
    e: &NotRecorded,
) {
    inc(&metrics().tool_record_failures);
    if let Some(kept) = store.unrecorded().filter(|_| e.keep) {
        kept.keep(&cfg.thread, key, Unrecorded { envelope: envelope.clone(), tool: tool.to_owned() });
    }
    log_not_recorded(&cfg.thread.thread_id, Some(&cfg.run_id), tool, key, &e.error);
}

/// The message is a constant so alerts and log grouping can match it; the details are fields.
/// Logged under the handler's logger (`tenxgraph.engine.tools`), where alerts match it.
pub(super) fn log_not_recorded(thread_id: &str, run_id: Option<&str>, tool: &str, key: &str, error: &str) {
    tracing::error!(
        target: "tenxgraph::engine::tools",
        thread_id = %thread_id,
        run_id = run_id,
        tool = %tool,
        ledger_key = %key,
        error = %error,
        event = "tool_result_not_recorded",
        "tool call COMPLETED but could not be recorded; a replay of this node may run it again"
    );
}
