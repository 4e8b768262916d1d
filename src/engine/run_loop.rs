//! One run of a compiled graph: load, decide where to start, then node -> route -> commit until
//! END, a pause, a stop or an error. Every exit that leaves the thread in a new state commits it.

use super::lease::{self, Lease};
use super::stop::StopSignal;
use super::{
    EngineError, ExecMeta, ExecStatus, GraphSpec, HostFailure, Lifecycle, MsgCursor, NodeHost, NodeOutput, RunConfig,
    graph::END, next_node,
};
use crate::store::{Checkpointer, StoreError};
use serde_json::{Value, json};
use start::{Optimistic, optimistic_start, run_leased};
use std::sync::Arc;
use stopping::StopKind;
use tokio::time::Instant;

mod abandoned;
pub use abandoned::release_abandoned;
pub(super) use abandoned::settling_thread;
mod carry;
mod commit;
mod start;
mod stopping;
mod watch;

/// What the caller handed the run, as far as the loop cares.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunInput<'a> {
    /// The input brought messages (a new turn, not a resume).
    pub has_messages: bool,
    /// The input brought a state update.
    pub has_state_update: bool,
    /// `input["state"]["current_node"]`: where to start instead of the saved node.
    pub start_node: Option<&'a str>,
    /// Recovery: continue the thread only if, under the lease, its latest state is still a run
    /// under way (another worker may have finished it since it was listed). Otherwise nothing
    /// runs, nothing is written and the outcome says `nothing_to_resume`.
    pub resume_only: bool,
}

/// How a run ended; every step it reports is committed.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The thread's execution meta at the end (completed, paused, or as stored).
    pub exec: ExecMeta,
    /// The thread's version after the run's last commit.
    pub version: i64,
    /// The run ended on a stop request.
    pub stopped: bool,
    /// The write mark of the run's last commit (None when it committed nothing): a host that
    /// keeps the live state names it as its `known_head` at the thread's next run.
    pub mark: Option<String>,
    /// `resume_only` found no run to continue; `exec` is the thread's stored state as it is.
    pub nothing_to_resume: bool,
    /// The state row of the run's last commit (None when it committed nothing): a host that
    /// keeps the live state hands it back as its `known_state`.
    pub state: Option<crate::store::SharedJson>,
}

enum Guard {
    Failed(HostFailure),
    Timeout(f64),
    Stopped,
    LeaseLost,
}

struct Run<'a, H: NodeHost + ?Sized> {
    graph: &'a GraphSpec,
    store: &'a dyn Checkpointer,
    host: &'a H,
    cfg: &'a RunConfig,
    exec: ExecMeta,
    version: i64,
    cursor: MsgCursor,
    stop_key: String,
    /// When the store was last asked for a stop request (at most once per `stop_poll`).
    last_stop_poll: std::sync::Mutex<Option<Instant>>,
    /// The next commit replaces the thread's message rows (see `Checkpoint::rewrite_messages`).
    rewrite: bool,
    /// The node whose step the next commit writes (`__input__` before the first node).
    step_node: String,
    /// The last node that ran in the thread: a completed thread names it as its `current_node`,
    /// as 10xGraph's does (a run that only completes a thread paused after its last node starts
    /// with that node).
    last_node: Option<String>,
    /// The run's lease: empty until the input commit takes it (see `Optimistic`).
    lease: &'a std::sync::OnceLock<Lease>,
    /// Set while the run has loaded the thread without its lease.
    optimistic: Option<&'a Optimistic>,
    /// The next commit is the run's last (see `commit_final`).
    finishing: bool,
    /// A preemption was requested: stop before the next node that is not a tool node.
    preempt: std::sync::atomic::AtomicBool,
    /// The write mark of this run's last commit.
    mark: Option<String>,
    /// The write mark the thread's latest row carried when this run last saw it (at load, then
    /// its own commits): the store keeps a commit's mark only while that is still so.
    seen_mark: Option<String>,
    /// The state of the run's last commit (moved in, no copy): what the error state is written
    /// from when the live state cannot be serialised; before the first commit, `loaded_state`.
    last_state: Option<crate::store::SharedJson>,
    /// The run started on the host's kept state without reading the thread: its input commit
    /// asks the store to refuse a head that is not that commit (`put_input_on_head`).
    on_head: bool,
    /// The stored state the run started from (borrowed: copied only on that failure path).
    loaded_state: Option<&'a Value>,
    /// The live state could not be serialised: the run ends in the error status.
    unserialisable: bool,
    /// A tool node's last ledger rows, for the next commit to carry (see `tools::Recorder`).
    carried: super::Carried,
    /// The stop signal `drive` listens to (None before it): lifecycle hooks are watched with it.
    signal: Option<Arc<StopSignal>>,
    /// A stop was confirmed while lifecycle hooks ran: the next stop check obeys it.
    stop_seen: std::sync::atomic::AtomicBool,
}

/// Runs the graph on `cfg.thread` until it ends, pauses, stops or fails.
///
/// Durability: the run's input is committed before the first node; after each node the state and
/// the node's new messages are committed in one transaction (`durable_every_step`), so a crash
/// replays at most the node in flight. Every commit names the version it started from.
///
/// A run whose future is dropped before it ends keeps its lease row held until it expires; a
/// caller that shares the store uses `run_shared`, which releases it.
pub async fn run<H: NodeHost + ?Sized>(
    graph: &GraphSpec,
    store: &dyn Checkpointer,
    host: &H,
    cfg: &RunConfig,
    input: RunInput<'_>,
) -> Result<RunOutcome, EngineError> {
    run_holding(graph, store, None, host, cfg, input).await
}

/// `run`, for a caller that holds the store shared: a run whose future is dropped before it ends
/// (its caller cancelled it) releases its lease on a task of its own (see `abandoned`).
pub async fn run_shared<H: NodeHost + ?Sized>(
    graph: &GraphSpec,
    store: &Arc<dyn Checkpointer>,
    host: &H,
    cfg: &RunConfig,
    input: RunInput<'_>,
) -> Result<RunOutcome, EngineError> {
    run_holding(graph, &**store, Some(store), host, cfg, input).await
}

async fn run_holding<H: NodeHost + ?Sized>(
    graph: &GraphSpec,
    store: &dyn Checkpointer,
    shared: Option<&Arc<dyn Checkpointer>>,
    host: &H,
    cfg: &RunConfig,
    input: RunInput<'_>,
) -> Result<RunOutcome, EngineError> {
    // Before the lease: taken first, a busy thread's running turn was asked to stop (on_busy=
    // "interrupt") for input that can never run (red-team, session 26).
    if let Some(start) = input.start_node {
        start::known_start(graph, start)?;
    }
    let abandoned = abandoned::ReleaseIfAbandoned::new(shared, &cfg.thread.thread_id, &cfg.run_id);
    let cell = &abandoned.cell;
    let mut done = None;
    let mut refused = false;
    if optimistic_start(cfg, &input) {
        let opt = Optimistic::default();
        let r = run_leased(graph, store, host, cfg, input, cell, Some(&opt), false).await;
        refused = opt.refused.load(std::sync::atomic::Ordering::Acquire);
        if refused {
            tracing::debug!(thread_id = %cfg.thread.thread_id, "the thread was busy or moved since it was loaded; taking its lease first");
        } else {
            done = Some(r);
        }
    }
    let result = match done {
        Some(r) => r,
        // The lease comes first: what is loaded next is what the previous holder left.
        None => match lease::acquire(store, cfg).await {
            Ok(lease) => {
                let _ = cell.set(lease);
                run_leased(graph, store, host, cfg, input, cell, None, refused).await
            }
            Err(e) => Err(e),
        },
    };
    // The last commit released it in its own transaction unless the run ended without one. Also
    // after a refused write: the release names this run's token, so where a newer holder has the
    // lease it changes nothing, and where the thread was deleted under the run (its ledger write
    // refused) it frees the row at once instead of leaving it held until it expires.
    if let Some(lease) = cell.get()
        && !lease.released()
    {
        lease.release(store).await;
    }
    abandoned.finish();
    if let Some(shared) = shared {
        // Results this run (or an earlier one) could not record: written while the process lives,
        // for a resume elsewhere to find.
        super::tools::spawn_kept_recorder(shared);
    }
    result
}

/// `interrupt_reason` while a tool node waits for the client to run its remote calls (10xGraph's).
pub const REMOTE_TOOL_REASON: &str = "remote_tool_call";

/// `interrupt_reason` of a thread that failed routing out of `interrupted_node`, a node whose
/// step is committed: a retry (`{}`) routes again from it instead of running it again.
pub const ROUTING_FAILED_REASON: &str = "routing_failed";

/// `interrupt_reason` of a running thread whose input commit took a run past `interrupted_node`
/// without routing yet (the client's results for a remote-tool pause, a retry after a routing
/// error): a run that resumes it after a crash routes on from that node too. Without it the
/// committed state named the node as the one to run, and a resume ran it again (a tool node on
/// the client's results: NODE_002, the thread wedged; red-team, session 34).
pub const ROUTING_PENDING_REASON: &str = "routing_pending";

/// The key of `interrupt_data` that keeps, beside `ROUTING_FAILED_REASON`,
/// `REMOTE_TOOL_REASON` or `ROUTING_PENDING_REASON`, the `Command(goto=...)` the node returned.
pub const ROUTING_GOTO_KEY: &str = "goto";

/// The goto kept with a routing failure or a pause for the client's tools (or with the input
/// commit of the run that routes on from it).
pub fn routing_goto(exec: &ExecMeta) -> Option<String> {
    let routing = matches!(
        exec.interrupt_reason.as_deref(),
        Some(ROUTING_FAILED_REASON | ROUTING_PENDING_REASON | REMOTE_TOOL_REASON)
    );
    let data = exec.interrupt_data.as_ref().filter(|_| routing)?;
    data.get(ROUTING_GOTO_KEY).and_then(serde_json::Value::as_str).map(str::to_owned)
}

/// `interrupt_data` keeping `goto` (see `ROUTING_GOTO_KEY`).
pub fn goto_data(goto: Option<String>) -> Option<Value> {
    goto.map(|g| json!({ ROUTING_GOTO_KEY: g }))
}

impl<H: NodeHost + ?Sized> Run<'_, H> {
    async fn drive(
        &mut self,
        mut skip_before: Option<String>,
        resume_after: Option<String>,
        signal: &Arc<StopSignal>,
    ) -> Result<RunOutcome, EngineError> {
        self.signal = Some(signal.clone());
        if let Some(node) = resume_after {
            self.step_node = node.clone();
            self.last_node = Some(node.clone());
            // The node's `Command(goto=...)` when routing it failed (see `routing_failed`).
            let goto = routing_goto(&self.exec);
            let next = match self.route(&node, goto.as_deref()) {
                Ok(n) => n,
                Err(e) => return self.routing_failed(&node, goto, e).await,
            };
            self.exec.interrupted_node = None;
            self.exec.interrupt_reason = None;
            self.exec.interrupt_data = None;
            self.exec.step += 1;
            self.exec.current_node = next;
        }
        loop {
            if self.exec.current_node == END {
                match self.last_node.take() {
                    Some(last) => self.exec.current_node = last,
                    // Routed out of START straight to END: no node ran, and START is the last
                    // one 10xGraph names (it runs START as a node).
                    None if self.step_node == "__input__" => self.exec.current_node = super::START.into(),
                    None => {}
                }
                self.exec.status = ExecStatus::Completed;
                self.hooks(Lifecycle::End).await;
                self.commit_final().await?;
                return Ok(self.outcome(false));
            }
            self.keep_lease().await?;
            let node = self.exec.current_node.clone();
            let tool_node = self.graph.tool_nodes.contains(&node);
            match self.stop_requested(signal).await {
                StopKind::Hard => return self.stop(StopKind::Hard).await,
                // A safe point: not between an assistant's tool calls and their results.
                _ if !tool_node && self.preempt.load(std::sync::atomic::Ordering::Acquire) => {
                    // Seen while the node ran: obeyed only if it still stands (its requester may
                    // have given up or been cancelled since, and nobody would take the thread).
                    if self.preempt_stands().await {
                        return self.stop(StopKind::Soft).await;
                    }
                    self.preempt.store(false, std::sync::atomic::Ordering::Release);
                }
                _ => {}
            }
            let skip = skip_before.take().is_some_and(|n| n == node);
            if !skip && self.graph.pauses_before(&node) {
                self.exec.set_interrupt(
                    &node,
                    format!("interrupt_before: {node}"),
                    ExecStatus::InterruptedBefore,
                    None,
                );
                self.hooks(Lifecycle::Interrupt { node: &node, kind: "before" }).await;
                self.commit_final().await?;
                return Ok(self.outcome(false));
            }
            let guarded = self.guarded_node(&node, signal).await;
            if matches!(guarded, Err(Guard::Stopped | Guard::LeaseLost | Guard::Timeout(_)))
                && self.graph.tool_nodes.contains(&node)
            {
                self.host.tools_cut(&node);
            }
            let out = match guarded {
                Ok(o) => o,
                Err(Guard::Stopped) => return self.stop(StopKind::Hard).await,
                Err(Guard::LeaseLost) => return Err(self.lease_lost()),
                Err(Guard::Timeout(t)) => return self.fail(EngineError::NodeTimeout { node, timeout: t }).await,
                Err(Guard::Failed(HostFailure::Passthrough(e))) => match e.downcast::<StoreError>() {
                    // The tool handler's fenced intent write: this run no longer owns the thread.
                    Ok(store_err) => return Err(EngineError::Store(*store_err)),
                    Err(e) => return self.fail(EngineError::Host(e)).await,
                },
                Err(Guard::Failed(HostFailure::Interrupt { payload })) => {
                    // current_node stays: the node runs again when the thread is resumed.
                    let data = json!({"interrupt": payload});
                    self.exec.set_interrupt(&node, "interrupt".into(), ExecStatus::InterruptedBefore, Some(data));
                    self.hooks(Lifecycle::Interrupt { node: &node, kind: "interrupt" }).await;
                    self.commit_final().await?;
                    return Ok(self.outcome(false));
                }
                Err(Guard::Failed(HostFailure::Raised { error_type, message, cause })) => {
                    let err = EngineError::Node {
                        code: "NODE_001",
                        message: format!("Error in node '{node}': {message}"),
                        context: json!({"node_name": node, "error_type": error_type}),
                        cause: Some(cause),
                    };
                    return self.fail(err).await;
                }
            };
            self.step_node = node.clone();
            self.last_node = Some(node.clone());
            self.hooks(Lifecycle::NodeDone { node: &node }).await;
            if self.cfg.closing_failed_tools {
                // Every call has its answer: the thread is done with this turn (no route on, no
                // pause, no review gate), and the new turn that asked for the close comes next.
                self.exec.step += 1;
                self.exec.current_node = END.into();
                continue;
            }
            if let Some(reason) = out.pause {
                // current_node stays: the resumed run routes past it (see resume_after), by the
                // node's goto (a handoff beside a client's call: it was lost, and the run went
                // down the tool node's edge; red-team, session 38).
                self.exec.set_interrupt(&node, reason, ExecStatus::InterruptedAfter, goto_data(out.goto));
                self.hooks(Lifecycle::Interrupt { node: &node, kind: "after" }).await;
                self.commit_final().await?;
                return Ok(self.outcome(false));
            }
            let next = match self.route(&node, out.goto.as_deref()) {
                Ok(n) => n,
                Err(e) => return self.routing_failed(&node, out.goto, e).await,
            };
            self.exec.step += 1;
            self.exec.current_node = next.clone();
            if self.graph.pauses_after(&node) {
                self.exec.set_interrupt(&node, format!("interrupt_after: {node}"), ExecStatus::InterruptedAfter, None);
                self.hooks(Lifecycle::Interrupt { node: &node, kind: "after" }).await;
                self.commit_final().await?;
                return Ok(self.outcome(false));
            }
            if next != END && self.exec.step >= self.cfg.recursion_limit {
                let err = EngineError::Recursion { limit: self.cfg.recursion_limit, step: self.exec.step, node: next };
                return self.fail(err).await;
            }
            if next == END {
                continue; // the END branch commits the completed state once
            }
            self.commit(self.cfg.durable_every_step).await?;
        }
    }

    /// Fails the run on a routing error out of `node`, whose output is merged: the failed state
    /// names `node` (`ROUTING_FAILED_REASON`), so a retry routes again from it. It ran again on
    /// every retry (its output stored again: a second model call, a second reply; after a model
    /// that asked for tools, calls left unanswered), 10xGraph's rule for a node that failed.
    /// The node's `goto` is kept with it (`interrupt_data["goto"]`): a retry routed by the
    /// node's edges alone went down its static edge, a path nobody chose, where 10xGraph keeps
    /// the goto and fails again until the graph has that node (differential red-team, session 38).
    async fn routing_failed(
        &mut self,
        node: &str,
        goto: Option<String>,
        e: EngineError,
    ) -> Result<RunOutcome, EngineError> {
        self.exec.interrupted_node = Some(node.to_owned());
        self.exec.interrupt_reason = Some(ROUTING_FAILED_REASON.into());
        self.exec.interrupt_data = goto_data(goto);
        self.fail(e).await
    }

    /// The node after `node`: its `Command(goto=...)`, else its edges.
    fn route(&self, node: &str, goto: Option<&str>) -> Result<String, EngineError> {
        let mut next = match goto {
            Some(g) => g.to_owned(),
            None => next_node(node, &self.graph.edges, |i| self.host.eval_condition(i))?,
        };
        // Back to START is through START's edges again, as 10xGraph routes out of its START node;
        // a pause before START stops it there first, as it stops a new turn (10xGraph's too).
        if next == super::START {
            if self.graph.pauses_before(super::START) {
                return Ok(next);
            }
            next = route_out_of_start(self.graph, self.host)?;
        }
        // 10xGraph let an unknown name through and failed later with a bare KeyError.
        if !self.graph.has_node(&next) || next == super::START {
            return Err(EngineError::graph(
                "GRAPH_ROUTING_002",
                format!("Node '{node}' routed to '{next}', which is not a node of this graph"),
                json!({"from_node": node, "to_node": next}),
            ));
        }
        Ok(next)
    }

    /// Runs a node under its deadline while watching for a stop request. Returning early drops the
    /// node future, which cancels the node's Python task.
    async fn guarded_node(&self, node: &str, signal: &Arc<StopSignal>) -> Result<NodeOutput, Guard> {
        let started = Instant::now();
        let m = crate::metrics::metrics();
        crate::metrics::inc(&m.node_executions);
        let fut: std::pin::Pin<Box<dyn std::future::Future<Output = Result<NodeOutput, HostFailure>> + Send + '_>> =
            if self.graph.tool_nodes.iter().any(|n| n == node) {
                let carry = self.carries_ledger(node).then_some(&self.carried);
                Box::pin(super::run_tool_node(
                    self.host,
                    self.store,
                    self.cfg,
                    node,
                    &self.exec,
                    Some(self.lease()),
                    carry,
                ))
            } else {
                self.host.run_node(node, &self.exec)
            };
        let deadline = self.cfg.node_timeout.map(|d| Instant::now() + d);
        let r = match self.watched(fut, signal, deadline).await {
            Ok(r) => r.map_err(Guard::Failed),
            Err(cut) => Err(cut),
        };
        match &r {
            Err(Guard::Timeout(_)) => crate::metrics::inc(&m.node_timeouts),
            Err(Guard::Stopped) => crate::metrics::inc(&m.node_stopped),
            Err(Guard::LeaseLost) => {}
            Err(Guard::Failed(_)) | Ok(_) => {
                crate::metrics::add_duration(&m.node_duration_us, started.elapsed());
                if r.is_err() {
                    crate::metrics::inc(&m.node_errors);
                }
            }
        }
        r
    }
}

/// The first node of a turn: out of START by its edges (conditions first, then its fixed edge),
/// on the live state with the input merged. 10xGraph runs START as a node and routes out of it;
/// starting at the fixed entry ignored `add_conditional_edges(START, ...)`.
fn route_out_of_start<H: NodeHost + ?Sized>(graph: &GraphSpec, host: &H) -> Result<String, EngineError> {
    let first = next_node(super::START, &graph.edges, |i| host.eval_condition(i))?;
    if first == super::START || !graph.has_node(&first) {
        return Err(EngineError::graph(
            "GRAPH_ROUTING_002",
            format!("'{}' routed to '{first}', which is not a node of this graph", super::START),
            json!({"from_node": super::START, "to_node": first}),
        ));
    }
    Ok(first)
}
