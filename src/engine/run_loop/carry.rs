//! A tool node's last ledger rows on their way into its step's commit (see `tools::Recorder`):
//! when a node may hand them over, and what happens to them when that commit fails.

use super::Run;
use crate::engine::{CarriedRow, NodeHost};
use crate::store::{StepWrite, StoreError};

impl<H: NodeHost + ?Sized> Run<'_, H> {
    /// Ledger rows the step's commit could not carry, in their own transaction; false when
    /// that failed too (logged per row as not recorded).
    pub(super) async fn write_carried(&self, rows: Vec<CarriedRow>) -> bool {
        crate::engine::tools::write_carried(self.store, self.cfg, self.lease.get().map(|l| l.token), &rows).await
    }

    /// `put_step`, carrying the ledger rows a tool node left (see `tools::Recorder`). When that
    /// fails, nothing of it was written: the rows go in on their own. When they fail alone too,
    /// the ledger is what failed, and a ledger that cannot be written must not stop the run
    /// (promise 2: the failure is logged and the result still goes to the model), so the step
    /// is written once more without them. A refusal (stale, fenced, forbidden) or a failpoint is
    /// the step's own: no second attempt. A fenced step whose thread was deleted under the run
    /// is `Fenced` (see `stale_or_deleted`).
    pub(super) async fn put_step_carrying(&self, w: StepWrite<'_>) -> Result<i64, StoreError> {
        let fence = w.fence;
        match (self.put_step_carrying_as_read(w).await, fence) {
            (Err(stale @ StoreError::Stale { current, .. }), Some(token)) if current <= 0 => {
                Err(self.stale_or_deleted(stale, token).await)
            }
            (r, _) => r,
        }
    }

    /// A fenced step that found no state: the thread was cleared (`aclear_state`: its row stays,
    /// another writer's change, `Stale`) or deleted under the run (`aclean_thread`: the lease
    /// row stays while held, so the fence passed). A deleted thread is refused as the run's
    /// ledger writes refuse it, `Fenced` with no current token: the run no longer has a thread
    /// to own, and a caller must not read it as a conflict a retry could pass. Read on this
    /// error path only; a failing read leaves the error as it was.
    async fn stale_or_deleted(&self, stale: StoreError, token: i64) -> StoreError {
        match self.store.get_thread(&self.cfg.thread).await {
            Ok(None) => StoreError::Fenced { thread_id: self.cfg.thread.thread_id.clone(), token, current: None },
            _ => stale,
        }
    }

    /// `put_step_carrying` with the store's own answer.
    async fn put_step_carrying_as_read(&self, w: StepWrite<'_>) -> Result<i64, StoreError> {
        let carried = self.carried.take();
        if carried.is_empty() {
            return self.store.put_step(&self.cfg.thread, w).await;
        }
        let err = match self
            .store
            .put_step_with_ledger(&self.cfg.thread, w, &crate::engine::tools::ledger_rows(&carried))
            .await
        {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let rows_written = self.write_carried(carried).await;
        let the_steps_own = matches!(
            err,
            StoreError::Stale { .. }
                | StoreError::Fenced { .. }
                | StoreError::Forbidden { .. }
                | StoreError::Failpoint(_)
        );
        if rows_written || the_steps_own {
            return Err(err);
        }
        tracing::warn!(thread_id = %self.cfg.thread.thread_id, "the step with its ledger rows failed ({err}); writing the step alone");
        self.store.put_step(&self.cfg.thread, w).await
    }

    /// Whether tool node `node` leaves its last ledger rows to its step's commit: only when that
    /// commit comes next with nothing of the user's in between (no lifecycle hook, no routing
    /// condition) and the store commits rows and step atomically.
    pub(super) fn carries_ledger(&self, node: &str) -> bool {
        self.cfg.durable_every_step
            && self.store.joins_ledger_to_step()
            && self.host.quiet_after_tools()
            && !self.graph.edges.iter().any(|e| e.from == node && e.condition.is_some())
    }
}
