//! Waiting for user code while the run keeps its duties: renewing its lease and answering a stop
//! request. A node is watched so, and so are the lifecycle hooks between nodes: awaited bare, a
//! hook slower than `lease_ttl` let another worker take the thread, and the run's finished node
//! was fenced out with LeaseLostError; a hung hook outlived `stop()` (session 36).

use super::stopping::StopKind;
use super::{Guard, Run};
use crate::engine::lease::Lease;
use crate::engine::stop::StopSignal;
use crate::engine::{Lifecycle, NodeHost, RunConfig};
use crate::store::Checkpointer;
use std::future::Future;
use std::sync::atomic::Ordering;
use tokio::time::{Instant, sleep, sleep_until};

impl<H: NodeHost + ?Sized> Run<'_, H> {
    /// `work`'s output, unless the deadline passes, a stop request is confirmed or the lease is
    /// lost first: then `work` is dropped (a Python task under it is cancelled).
    pub(super) async fn watched<T>(
        &self,
        work: impl Future<Output = T>,
        signal: &StopSignal,
        deadline: Option<Instant>,
    ) -> Result<T, Guard> {
        tokio::pin!(work);
        // The store round trips made while the work runs (a stop check, a lease renewal) run
        // beside it, the deadline and the stop signal, one at a time: awaited inside a branch,
        // a round trip the server never answers (a frozen backend, a row lock held by a frozen
        // session, a network blackhole) stopped the deadline and stop() too.
        enum Chore {
            Stop(StopKind),
            Renewed(bool),
        }
        let mut chore: Option<std::pin::Pin<Box<dyn Future<Output = Chore> + Send + '_>>> = None;
        loop {
            let wake = signal.notify.notified();
            tokio::select! {
                out = &mut work => return Ok(out),
                _ = async { sleep_until(deadline.expect("guarded by is_some")).await }, if deadline.is_some() => {
                    let secs = self.cfg.node_timeout.map(|d| d.as_secs_f64()).unwrap_or_default();
                    return Err(Guard::Timeout(secs));
                }
                done = async { chore.as_mut().expect("guarded by is_some").await }, if chore.is_some() => {
                    chore = None;
                    match done {
                        Chore::Stop(StopKind::Hard) => return Err(Guard::Stopped),
                        Chore::Renewed(false) => return Err(Guard::LeaseLost),
                        _ => {}
                    }
                }
                // A stop signalled by this process: confirmed against the store like a poll,
                // beside the work (a signal raised meanwhile is kept by `take_raised`).
                _ = wake, if chore.is_none() => {
                    chore = Some(Box::pin(async move { Chore::Stop(self.stop_requested(signal).await) }));
                }
                _ = sleep(self.cfg.stop_poll), if chore.is_none() => {
                    chore = Some(Box::pin(async move { Chore::Stop(self.stop_requested(signal).await) }));
                }
                _ = sleep_until(self.lease().renewal_due()), if chore.is_none() => {
                    chore = Some(Box::pin(async move { Chore::Renewed(self.lease().renew(self.store, self.cfg).await) }));
                }
            }
        }
    }

    /// The lifecycle hooks at `point`, watched like a node once the run holds its lease and
    /// listens for stops. Their deadline is the host's (`node_timeout`, after which they are
    /// abandoned and the run goes on). A confirmed stop abandons them too: the run stops at its
    /// next stop check (after the commit it is making, so no finished step is lost), or ends as
    /// it was about to (a pause, END, an error). A lost lease abandons them: the run's next write
    /// is refused by its fencing token, as after a node.
    pub(super) async fn hooks(&self, point: Lifecycle<'_>) -> Option<String> {
        let mut work = std::pin::pin!(self.host.lifecycle(point, &self.exec));
        // A graph without hooks answers at once: no timers to set up at every point of every
        // node (the common case; see issue 16).
        let at_once = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match work.as_mut().poll(cx) {
                std::task::Poll::Ready(out) => Some(out),
                std::task::Poll::Pending => None,
            })
        })
        .await;
        if let Some(out) = at_once {
            return out;
        }
        let (Some(signal), Some(_)) = (self.signal.as_deref(), self.lease.get()) else { return work.await };
        match self.watched(work, signal, None).await {
            Ok(message) => message,
            Err(cut) => {
                let why = match cut {
                    Guard::Stopped => {
                        self.stop_seen.store(true, Ordering::Release);
                        "a stop was requested"
                    }
                    Guard::LeaseLost => "the run lost its lease",
                    Guard::Timeout(_) | Guard::Failed(_) => "they were cut short",
                };
                let (name, _, _) = point.parts();
                tracing::warn!(thread_id = %self.cfg.thread.thread_id, point = name, "lifecycle hooks abandoned: {why}");
                None
            }
        }
    }
}

/// The start hooks (`on_graph_start`, `on_resume`), which run before the run listens for stops:
/// the lease, when the run holds it already (a start that takes it first), is renewed while they
/// run; a hook slower than `lease_ttl` let another worker take the thread (session 36). A lost
/// lease is left to the input commit, which its fencing token refuses.
pub(super) async fn renewing<T>(
    work: impl Future<Output = T>,
    lease: Option<&Lease>,
    store: &dyn Checkpointer,
    cfg: &RunConfig,
) -> T {
    let Some(lease) = lease else { return work.await };
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            // Each store call is bounded by the store's own deadline (statement, busy wait, call
            // timeout), so the hook's answer is seen late at worst, never lost.
            _ = sleep_until(lease.renewal_due()) => {
                if !lease.renew(store, cfg).await {
                    return work.await;
                }
            }
        }
    }
}
