//! The start of a run: load the thread (or use the state this process kept from its last commit),
//! decide where to start, commit the input, then drive. An optimistic start loads before it holds
//! the lease and takes the lease with its input commit; a refused one starts again lease first.

use super::{REMOTE_TOOL_REASON, ROUTING_FAILED_REASON, Run, RunInput, RunOutcome};
use crate::engine::lease::Lease;
use crate::engine::{
    EngineError, ExecMeta, ExecStatus, GraphSpec, Lifecycle, MsgCursor, NodeHost, RunConfig, STOP_NAMESPACE,
    StopSignals, Stored, legacy_resume, next_node, stop_key,
};
use crate::store::{Checkpoint, Checkpointer, KnownHead};
use serde_json::{Value, json};
use tokio::time::Instant;

/// A run that loads its thread before it holds the lease and takes the lease with its input
/// commit (`Checkpointer::put_input_leased`): one commit instead of two. `refused`: the thread's
/// lease was live or its version moved, nothing was written, and the run starts again the usual
/// way (lease first, then a fresh load).
#[derive(Default)]
pub(super) struct Optimistic {
    pub(super) refused: std::sync::atomic::AtomicBool,
}

impl Optimistic {
    pub(super) fn refuse(&self) {
        self.refused.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// What a refused optimistic start returns to `run`, which drops it and starts again.
pub(super) fn refused_start() -> EngineError {
    EngineError::InvalidInput("the thread was busy or moved since it was loaded".into())
}

/// Only a turn that brings messages always commits its input; every other start (a resume, a
/// recovery, a state update) decides under the lease whether it writes at all. `after_lease`
/// armed: the test wants the lease taken before the load.
pub(super) fn optimistic_start(cfg: &RunConfig, input: &RunInput<'_>) -> bool {
    input.has_messages
        && !input.resume_only
        && (cfg.failpoints.is_off() || !cfg.failpoints.arms("after_lease", &cfg.thread.thread_id))
        // The input commit takes an expired lease row at once: beside a dropped run of this
        // process that is still writing, the lease is taken first (`lease::acquire` waits).
        && !super::abandoned::settling_thread(&cfg.thread.thread_id)
}

/// The thread as the host kept it from its last commit here, for a start that does not read it:
/// the input commit then checks that the head is still that commit (`put_input_on_head`). None
/// when the host kept no state row, or the row is not the commit it names, or it says `running`:
/// such a start reads, so a run under way is judged by its lease and not by a kept copy.
pub(super) fn kept_head<H: NodeHost + ?Sized>(
    host: &H,
    k: KnownHead<'_>,
    entry: &str,
    thread_id: &str,
) -> Option<Checkpoint> {
    // Decoded here, once per start: the row crosses the run as text (see `marked_state`).
    let state: Value = serde_json::from_str(host.known_state()?.get()).ok()?;
    if !k.matches(k.version, &state) || ExecMeta::from_state(&state, entry, thread_id).status == ExecStatus::Running {
        return None;
    }
    Some(Checkpoint { version: k.version, state, messages: Vec::new(), rewrite_messages: false, messages_known: true })
}

#[allow(clippy::too_many_arguments)] // the run's parts, borrowed from run_loop
pub(super) async fn run_leased<H: NodeHost + ?Sized>(
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
    let entry = graph.entry.clone().ok_or_else(|| EngineError::graph("GRAPH_002", "No entry point set", json!({})))?;
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
    // A run 10xGraph 0.10 left unfinished: its row names the node that completed, or a run it
    // never wrote, and its Redis cache the node in flight (see `legacy_resume`). A resume goes on
    // from there; a new turn is refused below as for any run under way (sent on from the row, it
    // ran the model again and fired a tool 10xGraph's ledger had recorded: red-team, session 41).
    let resuming = !input.has_messages && input.start_node.is_none();
    let mut from_legacy_cache = false;
    // 10xGraph's entry, used or not, is stale once this run commits: dropped after that commit.
    let mut drop_legacy_cache = false;
    if legacy_resume::may_have_legacy_cache(stored.as_ref()) {
        let mut found = match store.legacy_state_cache(t).await {
            Ok(found) => found,
            Err(e) => legacy_resume::unreadable_legacy_cache(store, t, stored.is_some(), resuming, e).await?,
        };
        if !legacy_resume::cache_entry_is_this_threads(&found, t) {
            // Another thread's (the key is ambiguous): neither used nor dropped.
            tracing::warn!(
                thread_id = %t.thread_id,
                event = "legacy_cache_unusable",
                "10xGraph's Redis state cache entry under this thread's key belongs to another thread; not used"
            );
            found = crate::store::LegacyCache::Absent;
        }
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
    // A close of a failed tool node that finds the thread emptied (`aclear_state`,
    // `aclean_thread` since the turn was refused) has nothing to close: the turn goes on as the
    // thread's first. It was refused as an input without messages, a false and untyped
    // ValueError for a turn that had them (red-team soak, session 38).
    if cfg.closing_failed_tools && stored.is_none() {
        let exec = ExecMeta::fresh(&entry, &t.thread_id);
        return Ok(RunOutcome { exec, version: 0, stopped: false, mark: None, nothing_to_resume: true, state: None });
    }
    if stored.is_none() && !input.has_messages && !graph.starts_with_messages && !input.resume_only {
        return Err(EngineError::InvalidInput("Input data must contain 'messages' for new execution.".into()));
    }
    let (version, mut exec) = match &stored {
        Some(cp) => (cp.version, ExecMeta::from_state(&cp.state, &entry, &t.thread_id)),
        None => (0, ExecMeta::fresh(&entry, &t.thread_id)),
    };
    let previous = exec.status;
    // A state that still points at START was written outside a run (aput_state): no run of the
    // engine died there, so recovery leaves it alone.
    if input.resume_only
        && (stored.is_none() || previous != ExecStatus::Running || exec.current_node == crate::engine::START)
    {
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
        // A close that finds the thread finished (another turn closed it) did nothing either.
        return as_stored(host, cp, exec, version, cfg.closing_failed_tools).await;
    }
    // A run that has not finished (crashed, or still running elsewhere) owns the thread: new
    // messages appended in the middle of it would land between an assistant's tool calls and
    // their results and break the thread. Finish it first with `{}`.
    // The same holds for a thread that stopped (or paused, or failed) *at* a tool node: a hard
    // `stop()` cancels a tool node half way (or before it ran), a static `interrupt_before` on
    // the tool node waits in front of it, a node timeout fails it; each leaves the assistant's
    // tool calls without results, and the new message would land right there (the tool node
    // then runs on the user's message: NODE_002, the thread in `error` at that node for good).
    // Only the client's results for a remote-tool pause may come as messages.
    let tools_unanswered = previous != ExecStatus::Completed
        && graph.tool_nodes.contains(&exec.current_node)
        && exec.interrupt_reason.as_deref() != Some(REMOTE_TOOL_REASON);
    // Failed there (a node timeout, say), rather than stopped or paused: a close can answer it.
    let failed_at_tools = tools_unanswered && previous == ExecStatus::Error;
    // A crashed run (the lease is this run's: no messages, so no optimistic start) whose node
    // this graph lacks (renamed or removed by a deploy) can only go on from a node the caller
    // names, which is what GRAPH_004 advises: refused here as busy, the two answers sent the
    // caller back and forth and the thread was wedged for the new code (red-team, session 37).
    let renamed_under_a_crash = previous == ExecStatus::Running
        && !input.has_messages
        && input.start_node.is_some()
        && !graph.has_node(&exec.current_node);
    if (previous == ExecStatus::Running || (tools_unanswered && input.start_node.is_none()))
        && !renamed_under_a_crash
        && stored.is_some()
        && (input.has_messages || input.start_node.is_some())
        && exec.current_node != crate::engine::START
    {
        // A paused thread's turn sent again, under `idempotent_turns`: answered with the stored
        // turn when the host finds it is one (what it holds is the paused turn, not the input).
        if cfg.idempotent_turns
            && matches!(previous, ExecStatus::InterruptedBefore | ExecStatus::InterruptedAfter)
            && let Some(cp) = &stored
        {
            host.prepare(as_found(cp), &exec).await?;
            if host.replays_stored_turn() {
                return replayed(cp, &entry, &t.thread_id, optimistic);
            }
        }
        // Without the lease, "running" may be a live run's: its lease decides, under the policy.
        if let Some(opt) = optimistic {
            opt.refuse();
        }
        let closable = failed_at_tools && input.has_messages;
        return Err(EngineError::Busy { thread_id: t.thread_id.clone(), node: exec.current_node.clone(), closable });
    }
    // A run that closes a failed tool node finds, under the lease, whether there still is one
    // (another worker may have closed it, or resumed it, since the turn was refused): if not it
    // does nothing, and the turn is tried again as it is.
    let closing = cfg.closing_failed_tools;
    if closing
        && !(failed_at_tools && input.start_node.is_none() && !input.has_messages)
        && let Some(cp) = &stored
    {
        return as_stored(host, cp, exec, version, true).await;
    }
    // A bare `{}` ("finish this thread") that had to wait for another run of the thread: that run
    // may have finished the crashed turn and paused at a static review gate (`interrupt_before` /
    // `interrupt_after`) or at a stop. Going on would take this `{}` for the reviewer's "go on",
    // which its caller never saw to give (two recovery workers on one crashed thread). What it
    // asked for is done: it gets the paused thread as it is, and nothing runs or is written.
    let bare = !input.has_messages && !input.has_state_update && input.start_node.is_none();
    if bare
        && lease.get().is_some_and(|l| l.waited && l.waited_from != Some(version))
        && matches!(previous, ExecStatus::InterruptedBefore | ExecStatus::InterruptedAfter)
        && exec.interrupt_reason.as_deref() != Some(REMOTE_TOOL_REASON)
        && let Some(cp) = &stored
    {
        return as_stored(host, cp, exec, version, false).await;
    }
    // A static interrupt_before is answered by resuming: its check is skipped for that node once.
    let mut skip_before = None;
    // A pause for the client's tools is answered by its results: the run goes on past that node.
    // A retry of a thread that failed routing out of a committed node routes again from it.
    let rerouted = previous == ExecStatus::Error
        && exec.interrupt_reason.as_deref() == Some(ROUTING_FAILED_REASON)
        && exec.interrupted_node.as_deref() == Some(exec.current_node.as_str())
        && !input.has_messages;
    // A run cut off after the input commit of one of those: it routes on from the node too.
    let routing_pending = previous == ExecStatus::Running
        && exec.interrupt_reason.as_deref() == Some(super::ROUTING_PENDING_REASON)
        && exec.interrupted_node.as_deref() == Some(exec.current_node.as_str());
    let resume_after = ((previous == ExecStatus::InterruptedAfter
        && exec.interrupt_reason.as_deref() == Some(REMOTE_TOOL_REASON))
        || rerouted
        || routing_pending)
        .then(|| exec.current_node.clone());
    // The node's `Command(goto=...)` kept with its routing failure or its pause for the client's
    // tools, for the input commit (see below) and the routing.
    let resume_goto = resume_after.as_ref().and_then(|_| super::routing_goto(&exec));
    // The turn starts at START (a new thread, a new turn, a state written outside a run): its
    // first node is routed out of START below, once the input is merged.
    let mut at_start = stored.is_none();
    match previous {
        ExecStatus::Completed => {
            exec.current_node = entry.clone();
            exec.step = 0;
            at_start = true;
        }
        // The failed node runs again. 10xGraph kept `step`, so after a recursion error the next
        // run executed nothing; a new run gets a fresh step budget instead.
        ExecStatus::Error => exec.step = 0,
        // A static interrupt_before is answered by resuming; a dynamic interrupt() re-runs its
        // node, whose interrupt_before (if any) was answered when the node first started.
        ExecStatus::InterruptedBefore => skip_before = exec.interrupted_node.clone(),
        // Paused after the graph's last node: the turn is over but for the reviewer's "go on".
        // A new message is a new turn (as in 10xGraph); going on from END would store it, run
        // nothing and complete the thread with the message never answered.
        ExecStatus::InterruptedAfter if exec.current_node == crate::engine::END && input.has_messages => {
            exec.current_node = entry.clone();
            exec.step = 0;
            at_start = true;
        }
        ExecStatus::InterruptedAfter | ExecStatus::Running => {}
    }
    // A state written outside a run (aput_state) still points at START.
    if exec.current_node == crate::engine::START {
        exec.current_node = entry.clone();
        at_start = true;
    }
    if let Some(start) = input.start_node {
        known_start(graph, start)?;
        exec.current_node = start.to_owned();
        skip_before = None;
        at_start = false;
    }
    known_resume_node(graph, &t.thread_id, &exec.current_node)?;
    if closing {
        // Its review gate was for running the calls; closing runs none.
        skip_before = Some(exec.current_node.clone());
    }
    // Paused after the graph's last node: a bare `{}` completes the thread, naming that node.
    let last_node = if exec.current_node == crate::engine::END { exec.interrupted_node.clone() } else { None };
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
    let mut cursor = match host.prepare(stored_parts, &exec).await {
        Ok(cursor) => cursor,
        // Input refused on a kept copy the store has not confirmed: another process may have
        // moved the thread on or deleted it, and the refusal named a pause that was no longer
        // there (session 36). Decided again on a read, under the lease.
        Err(_) if on_head && let Some(opt) = optimistic => {
            opt.refuse();
            return Err(refused_start());
        }
        Err(e) => return Err(e),
    };
    // `interrupt_before=[START]` gates every turn: its input is committed and the run pauses at
    // START, nothing routed (the resume routes). `interrupt_after=[START]` pauses once the first
    // node is routed. 10xGraph's rules; START was GRAPH_004 here.
    let start = crate::engine::START;
    let gate = match at_start && !closing && input.start_node.is_none() {
        true if graph.pauses_before(start) && skip_before.as_deref() != Some(start) => {
            Some((ExecStatus::InterruptedBefore, "before"))
        }
        true if graph.pauses_after(start) => Some((ExecStatus::InterruptedAfter, "after")),
        _ => None,
    };
    if matches!(gate, Some((ExecStatus::InterruptedBefore, _))) {
        exec.current_node = start.into();
    } else if at_start && graph.routes_out_of_start() {
        // Before the input commit: a condition that fails, or routes nowhere, refuses the turn
        // with nothing written.
        exec.current_node = super::route_out_of_start(graph, host)?;
    }
    if host.replays_stored_turn()
        && let Some(cp) = &stored
    {
        // A turn the thread holds, sent again (a client's retry after a lost response, a second
        // worker given the same request): its stored result is the answer. Decided on the state
        // this run read, which for a run that waited is the state after the other run's turn.
        return replayed(cp, &entry, &t.thread_id, optimistic);
    }
    // 10xGraph's row without its cache names the node that completed; where running that node
    // again cannot be right, route on from it (the conditions see the loaded state, as they did).
    let route_on = match &stored {
        Some(c) if resuming && !from_legacy_cache && legacy_resume::unfinished_legacy_run(Some(c)) => {
            // Only the last message is looked at: the rest stay undecoded.
            legacy_resume::route_on_from(
                graph,
                &exec.current_node,
                previous,
                &c.last_message().into_iter().collect::<Vec<_>>(),
            )
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
    super::watch::renewing(host.lifecycle(Lifecycle::Start, &exec), lease.get(), store, cfg).await;
    // A gated turn's input commit is its pause: a second commit for the pause left a window where
    // a crash stored the turn as running, and its resume ran the first node past the gate (or,
    // before START, left the thread running at START for good; red-team, session 34).
    if let Some((status, kind)) = gate {
        exec.set_interrupt(start, format!("interrupt_{kind}: {start}"), status, None);
        super::watch::renewing(
            host.lifecycle(Lifecycle::Interrupt { node: start, kind }, &exec),
            lease.get(),
            store,
            cfg,
        )
        .await;
    }
    // A thread last written by 10xGraph: its context is the truth; rewrite the message rows.
    let rewrite = stored.as_ref().is_some_and(|c| c.rewrite_messages);
    if rewrite {
        cursor = MsgCursor::default();
    }

    let resume_after = if input.start_node.is_some() { None } else { resume_after };
    if let Some(node) = &resume_after {
        // The input commit below must say that the run routes on from this node (see
        // ROUTING_PENDING_REASON); `drive` clears it once it has.
        exec.interrupted_node = Some(node.clone());
        exec.interrupt_reason = Some(super::ROUTING_PENDING_REASON.into());
        exec.interrupt_data = super::goto_data(resume_goto);
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
        last_node,
        lease,
        optimistic,
        // A gated turn's input commit is its last: it releases the lease it holds in the same
        // transaction (an optimistic start takes the lease in that commit; released after it).
        finishing: gate.is_some() && lease.get().is_some(),
        preempt: Default::default(),
        mark: None,
        seen_mark: stored.as_ref().and_then(|c| crate::store::write_mark(&c.state)).map(str::to_owned),
        last_state: None,
        on_head,
        loaded_state: stored.as_ref().map(|c| &c.state),
        unserialisable: false,
        carried: Default::default(),
        signal: None,
        stop_seen: Default::default(),
    };
    // A close writes once, at its end: a crash before that leaves the failed node as it was, and
    // the next turn closes it again.
    if !closing
        && (stored.is_none()
            || rewrite
            || input.has_messages
            || input.has_state_update
            || input.start_node.is_some()
            || previous != ExecStatus::Running
            || gate.is_some())
        && let Err(e) = run.commit(true).await
    {
        if let (Some(opt), true) = (optimistic, run.unserialisable) {
            // The error state is written under the lease, by the start that takes it first.
            opt.refuse();
            return Err(e);
        }
        // Input the store cannot hold (a state update it cannot serialise, two ids that are one
        // as stored) is a refused request: the thread stays as it was. Marking it failed made a
        // completed thread read `error` at its entry, and the next `{}` ran that node again (a
        // model asking for its tools again: red-team of session 25). Only a thread left running
        // is marked failed, or it would stay wedged.
        return if run.unserialisable && previous == ExecStatus::Running { run.fail(e).await } else { Err(e) };
    }
    if drop_legacy_cache
        && run.mark.is_some()
        && let Err(e) = store.state_cache_clear(t).await
    {
        tracing::warn!(thread_id = %t.thread_id, "could not drop 10xGraph's stale state cache entry: {e}");
    }
    // Released when this function returns or its future is dropped (a caller's cancel).
    let subscription = StopSignals::global().subscribe(&key);

    let driven = match gate {
        Some(_) => Ok(run.outcome(false)),
        None => run.drive(skip_before, resume_after, subscription.signal()).await,
    };
    let result = match driven {
        // A state the store cannot hold ends the run like a node that raised: the thread is left
        // in the error status (not `running`, which would wedge it), with the error named.
        Err(e) if run.unserialisable => run.fail(e).await,
        r => r,
    };
    // Rows no commit carried (the run ended between its tool node and that node's step).
    let _ = run.write_carried(run.carried.take()).await;
    // A stop confirmed while the last hooks ran (a pause, END, an error) found the run ending
    // anyway: answered, not left for the thread's next turn.
    if run.stop_seen.load(std::sync::atomic::Ordering::Acquire)
        && let Err(e) = store.cache_clear(crate::engine::STOP_NAMESPACE, &key).await
    {
        tracing::warn!(thread_id = %t.thread_id, "could not consume the stop request: {e}");
    }
    drop(subscription);
    result
}

/// A replay (`NodeHost::replays_stored_turn`) answers from what the run read, and commits
/// nothing that would check it: it is decided under the lease. An optimistic start read without
/// it, from this process's kept copy (which another process may have moved on from or deleted)
/// or from the store while another run committed (SQLite reads a thread's state row and its
/// messages apart: a turn's input was seen without its status, and answered as a turn with no
/// reply, 1 in 15 runs under load); such a start is refused, and the run starts again under the
/// lease with a read.
fn replayed(
    cp: &Checkpoint,
    entry: &str,
    thread_id: &str,
    optimistic: Option<&Optimistic>,
) -> Result<RunOutcome, EngineError> {
    if let Some(opt) = optimistic {
        opt.refuse();
        return Err(refused_start());
    }
    // The thread as stored: this run may have readied its exec for a new turn already.
    let exec = ExecMeta::from_state(&cp.state, entry, thread_id);
    Ok(RunOutcome { exec, version: cp.version, stopped: false, mark: None, nothing_to_resume: false, state: None })
}

/// What the host builds the live state from, for a stored checkpoint (without counting it).
fn as_found(cp: &Checkpoint) -> Stored<'_> {
    if cp.messages_known { Stored::Known } else { Stored::Loaded { state: &cp.state, messages: &cp.messages } }
}

/// The thread handed to the host as it is stored, and the run ends there: nothing runs and
/// nothing is written.
async fn as_stored<H: NodeHost + ?Sized>(
    host: &H,
    cp: &Checkpoint,
    exec: ExecMeta,
    version: i64,
    nothing_to_resume: bool,
) -> Result<RunOutcome, EngineError> {
    host.prepare(as_found(cp), &exec).await?;
    Ok(RunOutcome { exec, version, stopped: false, mark: None, nothing_to_resume, state: None })
}

/// A start node the input names (`"state": {"current_node": ...}`) must be a node of the graph.
/// The node a thread goes on from (paused, failed, or cut off there) is one this graph has. A
/// deploy that renamed or removed it made the run fail inside the loop with the `KeyError` of the
/// node table (`NODE_001` "Error in node 'ask': 'ask'"), and wrote the thread failed: a pending
/// question was lost, and the old graph could no longer resume it. Refused before anything is
/// written.
fn known_resume_node(graph: &GraphSpec, thread_id: &str, node: &str) -> Result<(), EngineError> {
    if graph.has_node(node) {
        return Ok(());
    }
    Err(EngineError::graph(
        "GRAPH_004",
        format!(
            "thread '{thread_id}' goes on from node '{node}', which this graph does not have (renamed or removed \
             since the thread was written): nothing was run or written; run it with a graph that has that node, \
             or name the node to start at with the input's \"state\": {{\"current_node\": ...}} (the node that \
             took its place: a tool node's recorded calls are then answered from its ledger, where a model node \
             would ask for them again)"
        ),
        json!({"node": node, "thread_id": thread_id}),
    ))
}

pub(super) fn known_start(graph: &GraphSpec, start: &str) -> Result<(), EngineError> {
    if graph.nodes.iter().any(|n| n == start) {
        return Ok(());
    }
    Err(EngineError::InvalidInput(format!("input state current_node '{start}' is not a node of this graph")))
}
