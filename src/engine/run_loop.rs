//! One run of a compiled graph: load, decide where to start, then node -> route -> commit until
//! END, a pause, a stop or an error. Every exit that leaves the thread in a new state commits it.

use super::{
    EngineError, ExecMeta, ExecStatus, GraphSpec, HostFailure, Lifecycle, MsgCursor, NodeHost, NodeOutput, RunConfig,
    STOP_NAMESPACE, StopSignals, Stored, graph::END, next_node, stop_key,
};
use super::lease::{self, Lease};
use super::legacy_resume;
use crate::failpoints::Armed;
use crate::store::{Checkpoint, Checkpointer, KnownHead, LeasedInput, StepWrite, StopKey, StoreError, TxHook};
use serde_json::{Value, json};
use super::stop::StopSignal;
use std::sync::Arc;
use tokio::time::{Instant, sleep, sleep_until};

mod carry;

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
    pub state: Option<Arc<Value>>,
}

/// A mark unique to one commit: a per-process random prefix and a counter (no syscall per commit).
fn next_write_mark() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string());
    format!("{prefix}-{}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

enum Guard {
    Failed(HostFailure),
    Timeout(f64),
    Stopped,
    LeaseLost,
}

/// A stop request as found in the store: `stop()` ends the running node at once; a preemption
/// (`on_busy="interrupt"` from another run) waits for the next safe point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopKind {
    None,
    Hard,
    Soft,
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
    last_state: Option<Arc<Value>>,
    /// The run started on the host's kept state without reading the thread: its input commit
    /// asks the store to refuse a head that is not that commit (`put_input_on_head`).
    on_head: bool,
    /// The stored state the run started from (borrowed: copied only on that failure path).
    loaded_state: Option<&'a Value>,
    /// The live state could not be serialised: the run ends in the error status.
    unserialisable: bool,
    /// A tool node's last ledger rows, for the next commit to carry (see `tools::Recorder`).
    carried: super::Carried,
}

/// The `in_step_tx` failpoint, run by the store inside the step's transaction.
struct InTx<'a> {
    armed: &'a Armed,
    node: &'a str,
}

#[async_trait::async_trait]
impl TxHook for InTx<'_> {
    async fn in_transaction(&self) -> Result<(), String> {
        self.armed.hit("in_step_tx", self.node).await.map_err(|f| f.to_string())
    }
}

/// Runs the graph on `cfg.thread` until it ends, pauses, stops or fails.
///
/// Durability: the run's input is committed before the first node; after each node the state and
/// the node's new messages are committed in one transaction (`durable_every_step`), so a crash
/// replays at most the node in flight. Every commit names the version it started from.
pub async fn run<H: NodeHost + ?Sized>(
    graph: &GraphSpec,
    store: &dyn Checkpointer,
    host: &H,
    cfg: &RunConfig,
    input: RunInput<'_>,
) -> Result<RunOutcome, EngineError> {
    let cell = std::sync::OnceLock::new();
    let mut done = None;
    let mut refused = false;
    if optimistic_start(cfg, &input) {
        let opt = Optimistic::default();
        let r = run_leased(graph, store, host, cfg, input, &cell, Some(&opt), false).await;
        refused = opt.refused.load(std::sync::atomic::Ordering::Acquire);
        if refused {
            tracing::debug!(thread_id = %cfg.thread.thread_id, "the thread was busy or moved since it was loaded; taking its lease first");
        } else {
            done = Some(r);
        }
    }
    let result = match done {
        Some(r) => r,
        None => {
            // The lease comes first: what is loaded next is what the previous holder left.
            let lease = lease::acquire(store, cfg).await?;
            let _ = cell.set(lease);
            run_leased(graph, store, host, cfg, input, &cell, None, refused).await
        }
    };
    // The last commit released it in its own transaction unless the run ended without one.
    if let Some(lease) = cell.get()
        && !lease.released()
        && !matches!(result, Err(EngineError::Store(StoreError::Fenced { .. })))
    {
        lease.release(store).await;
    }
    result
}

/// A run that loads its thread before it holds the lease and takes the lease with its input
/// commit (`Checkpointer::put_input_leased`): one commit instead of two. `refused`: the thread's
/// lease was live or its version moved, nothing was written, and the run starts again the usual
/// way (lease first, then a fresh load).
#[derive(Default)]
struct Optimistic {
    refused: std::sync::atomic::AtomicBool,
}

impl Optimistic {
    fn refuse(&self) {
        self.refused.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// What a refused optimistic start returns to `run`, which drops it and starts again.
fn refused_start() -> EngineError {
    EngineError::InvalidInput("the thread was busy or moved since it was loaded".into())
}

/// Only a turn that brings messages always commits its input; every other start (a resume, a
/// recovery, a state update) decides under the lease whether it writes at all. `after_lease`
/// armed: the test wants the lease taken before the load.
fn optimistic_start(cfg: &RunConfig, input: &RunInput<'_>) -> bool {
    input.has_messages
        && !input.resume_only
        && (cfg.failpoints.is_off() || !cfg.failpoints.arms("after_lease", &cfg.thread.thread_id))
}

/// The thread as the host kept it from its last commit here, for a start that does not read it:
/// the input commit then checks that the head is still that commit (`put_input_on_head`). None
/// when the host kept no state row, or the row is not the commit it names, or it says `running`:
/// such a start reads, so a run under way is judged by its lease and not by a kept copy.
fn kept_head<H: NodeHost + ?Sized>(host: &H, k: KnownHead<'_>, entry: &str, thread_id: &str) -> Option<Checkpoint> {
    let state = host.known_state()?;
    if !k.matches(k.version, state) || ExecMeta::from_state(state, entry, thread_id).status == ExecStatus::Running {
        return None;
    }
    Some(Checkpoint {
        version: k.version,
        state: (**state).clone(),
        messages: Vec::new(),
        rewrite_messages: false,
        messages_known: true,
    })
}

async fn run_leased<H: NodeHost + ?Sized>(
    graph: &GraphSpec,
    store: &dyn Checkpointer,
    host: &H,
    cfg: &RunConfig,
    input: RunInput<'_>,
    lease: &std::sync::OnceLock<Lease>,
    optimistic: Option<&Optimistic>,
    reload: bool,
) -> Result<RunOutcome, EngineError> {
    let t = &cfg.thread;
    let entry = graph
        .entry
        .clone()
        .ok_or_else(|| EngineError::graph("GRAPH_002", "No entry point set", json!({})))?;
    // After a refused start the host's live state already has the input merged: load it all.
    let known = if reload { None } else { host.known_head() };
    let kept = match (optimistic, known) {
        (Some(_), Some(k)) if store.checks_head_at_input() => kept_head(host, k, &entry, &t.thread_id),
        _ => None,
    };
    let on_head = kept.is_some();
    let mut stored = match optimistic {
        None => store.load_with(t, known).await?,
        Some(_) if on_head => kept,
        Some(opt) => {
            // The lease row is read alongside: a live holder means waiting (or refusing) under the
            // run's policy, decided before any of the input's work.
            let (held, loaded) = store.lease_and_load(t, known).await;
            if matches!(held, Ok(Some(ref info)) if info.is_live()) {
                opt.refuse();
                return Err(refused_start());
            }
            loaded?
        }
    };
    // A run 10xGraph 0.10 left unfinished: its row names the node that completed, its Redis
    // cache the node in flight (see `legacy_resume`). Only a resume asks; a new turn is refused
    // below as for any run under way.
    let resuming = !input.has_messages && input.start_node.is_none();
    let mut from_legacy_cache = false;
    // 10xGraph's entry, used or not, is stale once this run commits: dropped after that commit.
    let mut drop_legacy_cache = false;
    if resuming && legacy_resume::unfinished_legacy_run(stored.as_ref()) {
        let found = store.legacy_state_cache(t).await;
        drop_legacy_cache = found != crate::store::LegacyCache::Absent;
        match legacy_resume::from_cache(graph, stored.as_ref(), found) {
            Ok(Some(cp)) => {
                tracing::info!(
                    thread_id = %t.thread_id,
                    event = "legacy_cache_resume",
                    node = cp.state["execution_meta"]["current_node"].as_str().unwrap_or_default(),
                    version = cp.version,
                    "resuming the run 10xGraph left unfinished from its Redis state cache"
                );
                stored = Some(cp);
                from_legacy_cache = true;
            }
            Ok(None) => {}
            Err(why) => tracing::warn!(
                thread_id = %t.thread_id,
                event = "legacy_cache_unusable",
                "10xGraph's Redis state cache entry of this thread is not used: {why}; resuming from the database"
            ),
        }
    }
    if stored.is_none() && !input.has_messages && !input.resume_only {
        return Err(EngineError::InvalidInput("Input data must contain 'messages' for new execution.".into()));
    }
    let (version, mut exec) = match &stored {
        Some(cp) => (cp.version, ExecMeta::from_state(&cp.state, &entry, &t.thread_id)),
        None => (0, ExecMeta::fresh(&entry, &t.thread_id)),
    };
    let previous = exec.status;
    // A state that still points at START was written outside a run (aput_state): no run of the
    // engine died there, so recovery leaves it alone.
    if input.resume_only && (stored.is_none() || previous != ExecStatus::Running || exec.current_node == super::START) {
        return Ok(RunOutcome { exec, version, stopped: false, mark: None, nothing_to_resume: true, state: None });
    }
    // "Finish this thread if it is not finished" on a finished thread: nothing to run. The host
    // gets the stored state as it is (status completed) and the run commits nothing, so a retried
    // `ainvoke({})` never calls a model or a tool again.
    let finished = stored.is_some()
        && previous == ExecStatus::Completed
        && !input.has_messages
        && !input.has_state_update
        && input.start_node.is_none();
    if let (true, Some(cp)) = (finished, &stored) {
        let parts = if cp.messages_known { Stored::Known } else { Stored::Loaded { state: &cp.state, messages: &cp.messages } };
        host.prepare(parts, &exec).await?;
        return Ok(RunOutcome { exec, version, stopped: false, mark: None, nothing_to_resume: false, state: None });
    }
    // A run that has not finished (crashed, or still running elsewhere) owns the thread: new
    // messages appended in the middle of it would land between an assistant's tool calls and
    // their results and break the thread. Finish it first with `{}`.
    if previous == ExecStatus::Running && stored.is_some() && (input.has_messages || input.start_node.is_some())
        && exec.current_node != super::START
    {
        // Without the lease, "running" may be a live run's: its lease decides, under the policy.
        if let Some(opt) = optimistic {
            opt.refuse();
        }
        return Err(EngineError::Busy { thread_id: t.thread_id.clone(), node: exec.current_node.clone() });
    }
    // A static interrupt_before is answered by resuming: its check is skipped for that node once.
    let mut skip_before = None;
    // A pause for the client's tools is answered by its results: the run goes on past that node.
    let resume_after = (previous == ExecStatus::InterruptedAfter
        && exec.interrupt_reason.as_deref() == Some(REMOTE_TOOL_REASON))
    .then(|| exec.current_node.clone());
    match previous {
        ExecStatus::Completed => {
            exec.current_node = entry.clone();
            exec.step = 0;
        }
        // The failed node runs again. 10xGraph kept `step`, so after a recursion error the next
        // run executed nothing; a new run gets a fresh step budget instead.
        ExecStatus::Error => exec.step = 0,
        // A static interrupt_before is answered by resuming; a dynamic interrupt() re-runs its
        // node, whose interrupt_before (if any) was answered when the node first started.
        ExecStatus::InterruptedBefore => skip_before = exec.interrupted_node.clone(),
        ExecStatus::InterruptedAfter | ExecStatus::Running => {}
    }
    // A state written outside a run (aput_state) still points at START.
    if exec.current_node == super::START {
        exec.current_node = entry.clone();
    }
    if let Some(start) = input.start_node {
        if !graph.nodes.iter().any(|n| n == start) {
            return Err(EngineError::InvalidInput(format!("input state current_node '{start}' is not a node of this graph")));
        }
        exec.current_node = start.to_owned();
        skip_before = None;
    }
    exec.clear_interrupt();
    exec.error = None;
    exec.stop_current_execution = "none".into();
    exec.thread_id = Some(t.thread_id.clone());

    let key = stop_key(&t.thread_id, &t.user_id);
    // A stop request left from an earlier run must not stop this one (an optimistic start clears
    // it in its input commit).
    if optimistic.is_none()
        && let Err(e) = store.cache_clear(STOP_NAMESPACE, &key).await
    {
        tracing::warn!(thread_id = %t.thread_id, "could not clear an old stop request: {e}");
    }
    let stored_parts = match &stored {
        None => Stored::Fresh,
        Some(c) if c.messages_known => {
            // Without a read nothing is confirmed yet: counted when the input commit is.
            if !on_head {
                crate::metrics::inc(&crate::metrics::metrics().live_state_reuses);
            }
            Stored::Known
        }
        Some(c) => {
            crate::metrics::inc(&crate::metrics::metrics().history_loads);
            Stored::Loaded { state: &c.state, messages: &c.messages }
        }
    };
    let mut cursor = host.prepare(stored_parts, &exec).await?;
    // 10xGraph's row without its cache names the node that completed; where running that node
    // again cannot be right, route on from it (the conditions see the loaded state, as they did).
    let route_on = match &stored {
        Some(c) if resuming && !from_legacy_cache && legacy_resume::unfinished_legacy_run(Some(c)) => {
            // Only the last message is looked at: the rest stay undecoded.
            legacy_resume::route_on_from(graph, &exec.current_node, previous, &c.last_message().into_iter().collect::<Vec<_>>())
        }
        _ => None,
    };
    if let Some(want) = route_on {
        match next_node(&exec.current_node, &graph.edges, |i| host.eval_condition(i)) {
            Ok(next) if want.accepts(graph, &next) => {
                tracing::info!(
                    thread_id = %t.thread_id,
                    event = "legacy_route_on",
                    completed = %exec.current_node,
                    node = %next,
                    "10xGraph's run stopped after node '{}' completed: resuming at '{next}'",
                    exec.current_node
                );
                exec.current_node = next;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                thread_id = %t.thread_id,
                "could not route on from 10xGraph's last completed node '{}' ({e}); it runs again",
                exec.current_node
            ),
        }
    }
    host.lifecycle(Lifecycle::Start, &exec).await;
    // A thread last written by 10xGraph: its context is the truth; rewrite the message rows.
    let rewrite = stored.as_ref().is_some_and(|c| c.rewrite_messages);
    if rewrite {
        cursor = MsgCursor::default();
    }

    let mut run = Run {
        graph,
        store,
        host,
        cfg,
        exec,
        version,
        cursor,
        stop_key: key.clone(),
        // The key was cleared just above: nothing from another process can be pending yet, so the
        // first poll waits one interval like the others (a stop from this process is signalled).
        last_stop_poll: std::sync::Mutex::new(Some(Instant::now())),
        rewrite,
        step_node: "__input__".into(),
        lease,
        optimistic,
        finishing: false,
        preempt: Default::default(),
        mark: None,
        seen_mark: stored.as_ref().and_then(|c| crate::store::write_mark(&c.state)).map(str::to_owned),
        last_state: None,
        on_head,
        loaded_state: stored.as_ref().map(|c| &c.state),
        unserialisable: false,
        carried: Default::default(),
    };
    if stored.is_none()
        || rewrite
        || input.has_messages
        || input.has_state_update
        || input.start_node.is_some()
        || previous != ExecStatus::Running
    {
        if let Err(e) = run.commit(true).await {
            if let (Some(opt), true) = (optimistic, run.unserialisable) {
                // The error state is written under the lease, by the start that takes it first.
                opt.refuse();
                return Err(e);
            }
            return if run.unserialisable { run.fail(e).await } else { Err(e) };
        }
    }
    if drop_legacy_cache && run.mark.is_some()
        && let Err(e) = store.state_cache_clear(t).await
    {
        tracing::warn!(thread_id = %t.thread_id, "could not drop 10xGraph's stale state cache entry: {e}");
    }
    let signal = StopSignals::global().subscribe(&key);
    let resume_after = if input.start_node.is_some() { None } else { resume_after };
    let result = match run.drive(skip_before, resume_after, &signal).await {
        // A state the store cannot hold ends the run like a node that raised: the thread is left
        // in the error status (not `running`, which would wedge it), with the error named.
        Err(e) if run.unserialisable => run.fail(e).await,
        r => r,
    };
    // Rows no commit carried (the run ended between its tool node and that node's step).
    let _ = run.write_carried(run.carried.take()).await;
    StopSignals::global().release(&key, &signal);
    result
}

/// A stored state without its messages: the part a commit writes.
fn without_context(state: &Value) -> Value {
    match state.as_object() {
        Some(o) if o.contains_key("context") => {
            Value::Object(o.iter().filter(|(k, _)| k.as_str() != "context").map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        _ => state.clone(),
    }
}

/// `interrupt_reason` while a tool node waits for the client to run its remote calls (10xGraph's).
pub const REMOTE_TOOL_REASON: &str = "remote_tool_call";

impl<H: NodeHost + ?Sized> Run<'_, H> {
    fn outcome(&self, stopped: bool) -> RunOutcome {
        RunOutcome {
            exec: self.exec.clone(),
            version: self.version,
            stopped,
            mark: self.mark.clone(),
            nothing_to_resume: false,
            state: self.last_state.clone(),
        }
    }

    /// The run's lease. Every caller runs after the input commit, which takes it when the run
    /// started without it (a refused start returns before any node).
    fn lease(&self) -> &Lease {
        self.lease.get().expect("the lease is taken before the first node")
    }

    /// The input commit of an optimistic start: the lease and the step in one transaction. The
    /// outer error ends the run as it is (a failpoint, a refusal marked on `opt`: nothing was
    /// written); the inner one is the store's, handled as `put_step`'s.
    async fn commit_input(&self, w: StepWrite<'_>, opt: &Optimistic) -> Result<Result<i64, StoreError>, EngineError> {
        let cfg = self.cfg;
        if !cfg.failpoints.is_off() {
            cfg.failpoints.hit("before_input_tx", &cfg.thread.thread_id).await?;
        }
        let taking = lease::taking(cfg);
        let stop = StopKey { namespace: STOP_NAMESPACE, key: &self.stop_key };
        let req = lease::request(cfg);
        let put = if self.on_head {
            self.store.put_input_on_head(&cfg.thread, &req, w, Some(stop)).await
        } else {
            self.store.put_input_leased(&cfg.thread, &req, w, Some(stop)).await
        };
        match put {
            Ok(LeasedInput::Committed { token, version }) => {
                let _ = self.lease.set(taking.taken(cfg, token));
                if self.on_head {
                    let m = crate::metrics::metrics();
                    crate::metrics::inc(&m.live_state_reuses);
                    crate::metrics::inc(&m.start_reads_skipped);
                }
                Ok(Ok(version))
            }
            Ok(LeasedInput::Held(_)) | Err(StoreError::Stale { .. }) => {
                opt.refuse();
                Err(refused_start())
            }
            Err(e) => Ok(Err(e)),
        }
    }

    /// The run's last commit: it also frees the thread's lease, in the same transaction.
    async fn commit_final(&mut self) -> Result<(), EngineError> {
        self.finishing = true;
        self.commit(true).await
    }

    /// Commits the live state. A non-durable step leaves the cursor alone, so the next durable
    /// commit carries every message since the last one.
    async fn commit(&mut self, durable: bool) -> Result<(), EngineError> {
        if !durable {
            return Ok(());
        }
        self.host.lifecycle(Lifecycle::Checkpoint, &self.exec).await;
        let mut snap = match self.host.snapshot(&self.exec, &self.cursor) {
            Ok(snap) => snap,
            Err(e) if self.exec.status == ExecStatus::Error => match self.error_snapshot() {
                Some(snap) => snap,
                None => return Err(e),
            },
            Err(e) => {
                self.unserialisable = true;
                return Err(e);
            }
        };
        let mark = next_write_mark();
        crate::store::set_write_mark(&mut snap.state, &mark);
        let hook = InTx { armed: &self.cfg.failpoints, node: &self.step_node };
        let w = StepWrite {
            expected_version: self.version,
            state: &snap.state,
            new_messages: &snap.new_messages,
            replace_messages: snap.replace_messages || self.rewrite,
            fence: self.lease.get().map(|l| l.token),
            release_lease: self.finishing,
            in_tx: if self.cfg.failpoints.is_off() { None } else { Some(&hook as &dyn TxHook) },
            previous_mark: self.seen_mark.as_deref(),
        };
        let written = match (self.lease.get(), self.optimistic) {
            (None, Some(opt)) => self.commit_input(w, opt).await?,
            _ => self.put_step_carrying(w).await,
        };
        self.version = match written {
            Ok(v) => v,
            Err(e) => {
                match e {
                    StoreError::Stale { .. } => crate::metrics::inc(&crate::metrics::metrics().stale_conflicts),
                    StoreError::Fenced { .. } => crate::metrics::inc(&crate::metrics::metrics().fenced_writes),
                    _ => {}
                }
                return Err(e.into());
            }
        };
        crate::metrics::inc(&crate::metrics::metrics().steps_committed);
        if self.finishing {
            self.lease().mark_released();
        }
        self.cursor = snap.cursor;
        self.last_state = Some(Arc::new(snap.state));
        self.seen_mark = Some(mark.clone());
        self.mark = Some(mark);
        self.rewrite = false;
        self.host.committed(self.version);
        if !self.cfg.failpoints.is_off() {
            self.cfg.failpoints.hit("after_step", &self.step_node).await?;
            if self.host.streaming() {
                self.cfg.failpoints.hit("mid_stream", &self.step_node).await?;
            }
        }
        tracing::debug!(thread_id = %self.cfg.thread.thread_id, version = self.version, "step committed");
        Ok(())
    }

    /// The error state when the live state cannot be serialised: the last state the store holds
    /// from this run (or as loaded), with the loop's fields saying the node in flight failed. The
    /// node's work is lost, as when it raises; None for a thread with nothing stored yet.
    fn error_snapshot(&self) -> Option<super::Snapshot> {
        let mut state = match (&self.last_state, self.loaded_state) {
            (Some(committed), _) => (**committed).clone(),
            (None, loaded) => without_context(loaded?),
        };
        let mut exec = self.exec.clone();
        if self.step_node != "__input__" {
            exec.current_node = self.step_node.clone();
        }
        let meta = state.as_object_mut()?.entry("execution_meta").or_insert_with(|| json!({}));
        let Some(meta) = meta.as_object_mut() else { return None };
        if let Ok(Value::Object(fields)) = serde_json::to_value(&exec) {
            meta.extend(fields);
        }
        let internal = meta.entry("internal_data").or_insert_with(|| json!({}));
        if let Some(internal) = internal.as_object_mut() {
            internal.insert("error".into(), json!(exec.error));
        }
        Some(super::Snapshot { state, new_messages: vec![], replace_messages: false, cursor: self.cursor.clone() })
    }

    /// Marks the thread as failed, commits that, and returns `err`.
    async fn fail(&mut self, err: EngineError) -> Result<RunOutcome, EngineError> {
        if matches!(err, EngineError::Store(_)) {
            return Err(err); // the store itself refused: writing the error state would fail too
        }
        self.exec.status = ExecStatus::Error;
        self.exec.error = Some(err.to_string());
        if let Some(message) = self.host.lifecycle(Lifecycle::Error, &self.exec).await {
            self.exec.error = Some(message);
        }
        if let Err(e) = self.commit_final().await {
            tracing::error!(thread_id = %self.cfg.thread.thread_id, "could not record the failed state: {e}");
        }
        Err(err)
    }

    /// Asks the store when this process signalled a stop, or when the poll interval passed (a
    /// request from another process); otherwise answers without a round trip.
    async fn stop_requested(&self, signal: &StopSignal) -> StopKind {
        {
            let mut last = self.last_stop_poll.lock().unwrap_or_else(|p| p.into_inner());
            let due = last.is_none_or(|t| t.elapsed() >= self.cfg.stop_poll);
            if !signal.take_raised() && !due {
                return StopKind::None;
            }
            *last = Some(Instant::now());
        }
        match self.store.cache_get(STOP_NAMESPACE, &self.stop_key).await {
            Ok(Some(v)) if v.get("preempt").is_some() => {
                self.preempt.store(true, std::sync::atomic::Ordering::Release);
                StopKind::Soft
            }
            Ok(Some(v)) if !v.is_null() && v != json!(false) => StopKind::Hard,
            Ok(_) => StopKind::None,
            Err(e) => {
                tracing::warn!(thread_id = %self.cfg.thread.thread_id, "stop check failed: {e}");
                StopKind::None
            }
        }
    }

    /// Renews the lease when due; a lost lease ends the run without another write.
    async fn keep_lease(&self) -> Result<(), EngineError> {
        if self.lease().renew(self.store, self.cfg).await {
            Ok(())
        } else {
            Err(self.lease_lost())
        }
    }

    fn lease_lost(&self) -> EngineError {
        EngineError::Store(StoreError::Fenced {
            thread_id: self.cfg.thread.thread_id.clone(),
            token: self.lease().token,
            current: None,
        })
    }

    async fn stop(&mut self, kind: StopKind) -> Result<RunOutcome, EngineError> {
        if let Err(e) = self.store.cache_clear(STOP_NAMESPACE, &self.stop_key).await {
            tracing::warn!(thread_id = %self.cfg.thread.thread_id, "could not consume the stop request: {e}");
        }
        let node = self.exec.current_node.clone();
        let (reason, source) = if kind == StopKind::Soft { ("preempted", "preempt") } else { ("stop_requested", "stop") };
        self.exec.set_interrupt(
            &node,
            reason.into(),
            ExecStatus::InterruptedAfter,
            Some(json!({"source": source, "run_id": self.cfg.run_id})),
        );
        self.exec.stop_current_execution = "stopped".into();
        tracing::info!(thread_id = %self.cfg.thread.thread_id, node = %node, reason, "run stopped by request");
        self.host.lifecycle(Lifecycle::Interrupt { node: &node, kind: "stop" }, &self.exec).await;
        self.commit_final().await?;
        Ok(self.outcome(true))
    }

    async fn drive(
        &mut self,
        mut skip_before: Option<String>,
        resume_after: Option<String>,
        signal: &Arc<StopSignal>,
    ) -> Result<RunOutcome, EngineError> {
        if let Some(node) = resume_after {
            self.step_node = node.clone();
            let next = match self.route(&node, None) {
                Ok(n) => n,
                Err(e) => return self.fail(e).await,
            };
            self.exec.step += 1;
            self.exec.current_node = next;
        }
        loop {
            if self.exec.current_node == END {
                self.exec.status = ExecStatus::Completed;
                self.host.lifecycle(Lifecycle::End, &self.exec).await;
                self.commit_final().await?;
                return Ok(self.outcome(false));
            }
            self.keep_lease().await?;
            let node = self.exec.current_node.clone();
            let tool_node = self.graph.tool_nodes.iter().any(|n| *n == node);
            match self.stop_requested(signal).await {
                StopKind::Hard => return self.stop(StopKind::Hard).await,
                // A safe point: not between an assistant's tool calls and their results.
                _ if !tool_node && self.preempt.load(std::sync::atomic::Ordering::Acquire) => {
                    return self.stop(StopKind::Soft).await;
                }
                _ => {}
            }
            let skip = skip_before.take().is_some_and(|n| n == node);
            if !skip && self.graph.interrupt_before.contains(&node) {
                self.exec.set_interrupt(&node, format!("interrupt_before: {node}"), ExecStatus::InterruptedBefore, None);
                self.host.lifecycle(Lifecycle::Interrupt { node: &node, kind: "before" }, &self.exec).await;
                self.commit_final().await?;
                return Ok(self.outcome(false));
            }
            let out = match self.guarded_node(&node, signal).await {
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
                    self.host.lifecycle(Lifecycle::Interrupt { node: &node, kind: "interrupt" }, &self.exec).await;
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
            self.host.lifecycle(Lifecycle::NodeDone { node: &node }, &self.exec).await;
            if let Some(reason) = out.pause {
                // current_node stays: the resumed run routes past it (see resume_after).
                self.exec.set_interrupt(&node, reason, ExecStatus::InterruptedAfter, None);
                self.host.lifecycle(Lifecycle::Interrupt { node: &node, kind: "after" }, &self.exec).await;
                self.commit_final().await?;
                return Ok(self.outcome(false));
            }
            let next = match self.route(&node, out.goto) {
                Ok(n) => n,
                Err(e) => return self.fail(e).await,
            };
            self.exec.step += 1;
            self.exec.current_node = next.clone();
            if self.graph.interrupt_after.contains(&node) {
                self.exec.set_interrupt(&node, format!("interrupt_after: {node}"), ExecStatus::InterruptedAfter, None);
                self.host.lifecycle(Lifecycle::Interrupt { node: &node, kind: "after" }, &self.exec).await;
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

    /// The node after `node`: its `Command(goto=...)`, else its edges.
    fn route(&self, node: &str, goto: Option<String>) -> Result<String, EngineError> {
        let next = match goto {
            Some(g) => g,
            None => next_node(node, &self.graph.edges, |i| self.host.eval_condition(i))?,
        };
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
                Box::pin(super::run_tool_node(self.host, self.store, self.cfg, node, &self.exec, Some(self.lease().token), carry))
            } else {
                self.host.run_node(node, &self.exec)
            };
        tokio::pin!(fut);
        let deadline = self.cfg.node_timeout.map(|d| Instant::now() + d);
        loop {
            let wake = signal.notify.notified();
            tokio::select! {
                r = &mut fut => {
                    crate::metrics::add_duration(&m.node_duration_us, started.elapsed());
                    if r.is_err() { crate::metrics::inc(&m.node_errors); }
                    return r.map_err(Guard::Failed);
                }
                _ = async { sleep_until(deadline.expect("guarded by is_some")).await }, if deadline.is_some() => {
                    let secs = self.cfg.node_timeout.map(|d| d.as_secs_f64()).unwrap_or_default();
                    crate::metrics::inc(&m.node_timeouts);
                    return Err(Guard::Timeout(secs));
                }
                _ = wake => if self.stop_requested(signal).await == StopKind::Hard {
                    crate::metrics::inc(&m.node_stopped);
                    return Err(Guard::Stopped);
                },
                _ = sleep(self.cfg.stop_poll) => if self.stop_requested(signal).await == StopKind::Hard {
                    crate::metrics::inc(&m.node_stopped);
                    return Err(Guard::Stopped);
                },
                _ = sleep_until(self.lease().renewal_due()) => if !self.lease().renew(self.store, self.cfg).await {
                    return Err(Guard::LeaseLost);
                },
            }
        }
    }
}
