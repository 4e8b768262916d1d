//! Stop requests (this process's signal or another's row), preemption at a safe point, and the
//! lease a run renews while it works.

use super::{Run, RunOutcome};
use crate::engine::lease::Lease;
use crate::engine::stop::StopSignal;
use crate::engine::{EngineError, ExecStatus, Lifecycle, NodeHost, STOP_NAMESPACE};
use serde_json::json;
use tokio::time::Instant;

/// A stop request as found in the store: `stop()` ends the running node at once; a preemption
/// (`on_busy="interrupt"` from another run) waits for the next safe point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StopKind {
    None,
    Hard,
    Soft,
}

/// A stop check in flight; dropped before it finished, it makes the next check ask the store.
struct PollUnfinished<'a>(Option<&'a std::sync::Mutex<Option<Instant>>>);

impl Drop for PollUnfinished<'_> {
    fn drop(&mut self) {
        if let Some(last) = self.0 {
            *last.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

impl<H: NodeHost + ?Sized> Run<'_, H> {
    /// The run's lease. Every caller runs after the input commit, which takes it when the run
    /// started without it (a refused start returns before any node).
    pub(super) fn lease(&self) -> &Lease {
        self.lease.get().expect("the lease is taken before the first node")
    }
    /// Asks the store when this process signalled a stop, or when the poll interval passed (a
    /// request from another process); otherwise answers without a round trip.
    pub(super) async fn stop_requested(&self, signal: &StopSignal) -> StopKind {
        if self.stop_seen.load(std::sync::atomic::Ordering::Acquire) {
            return StopKind::Hard;
        }
        {
            let mut last = self.last_stop_poll.lock().unwrap_or_else(|p| p.into_inner());
            let due = last.is_none_or(|t| t.elapsed() >= self.cfg.stop_poll);
            if !signal.take_raised() && !due {
                return StopKind::None;
            }
            *last = Some(Instant::now());
        }
        // The check beside a node is dropped when the node ends first: the signal it took, or
        // the poll it counted, must not be lost with it, or the request went unseen at the
        // boundary (a preemption arriving as a node ended was missed, the turn run to its end:
        // red-team of session 25). Dropped, the next check asks the store.
        let mut unfinished = PollUnfinished(Some(&self.last_stop_poll));
        let kind = match self.store.cache_get(STOP_NAMESPACE, &self.stop_key).await {
            // A requester that stopped asking (cancelled, or gave up) is not obeyed. Cleared: a
            // preemption is written only where no request is pending, so the void one kept every
            // later requester out until it expired (second red-team, session 36).
            Ok(Some(v))
                if v.get("preempt").is_some()
                    && crate::engine::lease::preempter_gone(&self.cfg.thread.thread_id, &v) =>
            {
                self.clear_request_of_another_run().await;
                StopKind::None
            }
            Ok(Some(v)) if v.get("preempt").is_some() => {
                self.preempt.store(true, std::sync::atomic::Ordering::Release);
                StopKind::Soft
            }
            // A stop aimed at an earlier run of the thread (`stop()` read that run's lease, and
            // the run ended before the request landed) is not this run's: it stopped the next
            // turn (red-team, session 35). Cleared, or it stood for its hour in the way of a
            // preemption (written only where no request is pending) and of `ais_stop_requested`.
            // A stop of this run written between the read and the clear is lost: one round trip.
            Ok(Some(v)) if v.get("token").is_some_and(|n| n.as_i64() != self.lease.get().map(|l| l.token)) => {
                self.clear_request_of_another_run().await;
                StopKind::None
            }
            Ok(Some(v)) if !v.is_null() && v != json!(false) => StopKind::Hard,
            Ok(_) => StopKind::None,
            Err(e) => {
                tracing::warn!(thread_id = %self.cfg.thread.thread_id, "stop check failed: {e}");
                StopKind::None
            }
        };
        unfinished.0 = None;
        kind
    }

    /// Clears a request found void for this run (a stale stop, a preemption whose requester is
    /// gone), once the run holds the lease. A request written between the read and the clear is
    /// lost: one round trip (`stop()` again works; a waiting preempter asks again).
    async fn clear_request_of_another_run(&self) {
        if self.lease.get().is_some()
            && let Err(e) = self.store.cache_clear(STOP_NAMESPACE, &self.stop_key).await
        {
            tracing::warn!(thread_id = %self.cfg.thread.thread_id, "could not clear a void stop request: {e}");
        }
    }

    /// Whether the preemption this run saw is still asked for: its request is in the store and
    /// its requester has not shown to be gone. A store that cannot be read says yes (as before).
    pub(super) async fn preempt_stands(&self) -> bool {
        match self.store.cache_get(STOP_NAMESPACE, &self.stop_key).await {
            Ok(Some(v)) if v.get("preempt").is_some() => {
                !crate::engine::lease::preempter_gone(&self.cfg.thread.thread_id, &v)
            }
            Ok(_) => false,
            Err(_) => true,
        }
    }

    /// Renews the lease when due; a lost lease ends the run without another write.
    pub(super) async fn keep_lease(&self) -> Result<(), EngineError> {
        if self.lease().renew(self.store, self.cfg).await { Ok(()) } else { Err(self.lease_lost()) }
    }

    pub(super) fn lease_lost(&self) -> EngineError {
        EngineError::Store(self.lease().fenced())
    }

    pub(super) async fn stop(&mut self, kind: StopKind) -> Result<RunOutcome, EngineError> {
        if let Err(e) = self.store.cache_clear(STOP_NAMESPACE, &self.stop_key).await {
            tracing::warn!(thread_id = %self.cfg.thread.thread_id, "could not consume the stop request: {e}");
        }
        self.stop_seen.store(false, std::sync::atomic::Ordering::Release);
        let node = self.exec.current_node.clone();
        let (reason, source) =
            if kind == StopKind::Soft { ("preempted", "preempt") } else { ("stop_requested", "stop") };
        self.exec.set_interrupt(
            &node,
            reason.into(),
            ExecStatus::InterruptedAfter,
            Some(json!({"source": source, "run_id": self.cfg.run_id})),
        );
        self.exec.stop_current_execution = "stopped".into();
        tracing::info!(thread_id = %self.cfg.thread.thread_id, node = %node, reason, "run stopped by request");
        self.hooks(Lifecycle::Interrupt { node: &node, kind: "stop" }).await;
        self.commit_final().await?;
        Ok(self.outcome(true))
    }
}
