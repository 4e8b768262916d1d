//! The replay-safe tool handler: one node's tool calls, looked up in the ledger in one query, the
//! misses run concurrently under `tool_timeout`, each result recorded the moment it returns.

mod kept;
mod record;
pub use kept::{record_kept, spawn_kept_recorder};
use record::Recorder;
pub use record::{Carried, CarriedRow, ledger_rows, write_carried};

use super::lease::Lease;
use super::ledger::{CallKey, idempotency_key, is_valid_envelope, ledger_key, legacy_key, legacy_row_matches};
use super::{ExecMeta, HostFailure, NodeHost, NodeOutput, RunConfig};
use crate::metrics::{add_duration, inc, metrics};
use crate::store::{Checkpointer, INTENT_KIND, SharedJson, StoreError, is_intent, is_paused, shared_json};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What running a tool twice would do, declared per tool (`@tool(side_effects=...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SideEffects {
    /// Safe to repeat: a call whose outcome is unknown is run again (at-least-once).
    #[default]
    Idempotent,
    /// Must not repeat: a call whose outcome is unknown is not run again; the host answers it
    /// (an "outcome unknown" tool error, or a human via `interrupt()`). A ledger that cannot be
    /// read or written fails closed: the tool does not run.
    AtMostOnce,
    /// No side effects: no ledger at all, free to re-run.
    Pure,
}

impl SideEffects {
    /// `"idempotent"`, `"at_most_once"` or `"pure"`; None for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "idempotent" => Some(SideEffects::Idempotent),
            "at_most_once" => Some(SideEffects::AtMostOnce),
            "pure" => Some(SideEffects::Pure),
            _ => None,
        }
    }
}

/// One call of the issuing assistant message.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// As the model gave it: a JSON string or number (None or "" when it gave none).
    pub call_id: Option<Value>,
    /// The tool's name.
    pub name: String,
    /// What running it twice would do: decides its ledger handling.
    pub effects: SideEffects,
}

/// How the host settles an at-most-once call found started but never completed.
#[derive(Debug, Clone)]
pub enum UnknownAnswer {
    /// Run it again (a human decided it did not take effect).
    Retry,
    /// This is the call's answer (recorded when `record` is set, replacing the intent).
    Answer(ToolRun),
}

/// The calls of the last assistant message, and that message's id.
#[derive(Debug, Clone)]
pub struct ToolBatch {
    /// The assistant message's id: a JSON string or number.
    pub origin_message_id: Option<Value>,
    /// The calls, in the message's order.
    pub calls: Vec<ToolCall>,
    /// The message was first added to the thread by a node of this run (its id new to the
    /// thread), and no tool node has acted on it yet: no earlier attempt can have recorded a
    /// result under its keys. With every step durable the node then skips the ledger lookup (one
    /// round trip per tool node of a new turn); a crash after the message's commit makes the
    /// resumed run load it, and that run looks up.
    pub fresh: bool,
}

impl ToolBatch {
    /// How each call is identified in the ledger: a call id repeated within the message counts
    /// its occurrences, so two calls never share a key.
    fn call_keys(&self) -> Vec<CallKey<'_>> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        self.calls
            .iter()
            .enumerate()
            .map(|(position, c)| {
                let occurrence = c.call_id.as_ref().map_or(0, |id| {
                    let n = seen.entry(id.to_string()).or_insert(0);
                    *n += 1;
                    *n - 1
                });
                CallKey {
                    message_id: self.origin_message_id.as_ref(),
                    call_id: c.call_id.as_ref(),
                    position,
                    occurrence,
                }
            })
            .collect()
    }
}

/// A tool that ran to an answer (an error message the model can read counts as an answer).
#[derive(Debug, Clone)]
pub struct ToolRun {
    /// `{"__kind__": "message" | "raw", "value": ...}`, as the host's text.
    pub envelope: SharedJson,
    /// False for answers that must not be replayed (e.g. malformed arguments: the tool never ran).
    pub record: bool,
    /// The answer is a tool error (still recorded, so a replay gives the same error).
    pub is_error: bool,
}

/// How each call of a node settled, in call order.
#[derive(Debug, Clone)]
pub enum ToolOutcome {
    /// Answered from the ledger (the tool did not run); the recorded envelope.
    Replayed(SharedJson),
    /// The tool ran to this answer (recorded in the ledger when the run's `record` says so; a
    /// failed record is logged, and a replay may run the call again).
    Ran(SharedJson),
    /// The tool exceeded `tool_timeout` and was cancelled (NODE_TIMEOUT_002 for the model).
    TimedOut {
        /// The timeout, in seconds.
        secs: f64,
    },
    /// No answer to record: the tool raised, was refused (an at-most-once tool whose ledger
    /// could not be read or written does not run), or a sibling call's interrupt ended the node.
    Failed {
        /// What the model is told.
        message: String,
    },
}

/// Runs a tool node. Every call settles before this returns (no orphaned task); dropping the
/// returned future (node timeout, stop) cancels the calls still running.
pub async fn run_tool_node<H: NodeHost + ?Sized>(
    host: &H,
    store: &dyn Checkpointer,
    cfg: &RunConfig,
    node: &str,
    exec: &ExecMeta,
    lease: Option<&Lease>,
    carry: Option<&Carried>,
) -> Result<NodeOutput, HostFailure> {
    let fence = lease.map(|l| l.token);
    let batch = host.begin_tools(node, exec)?;
    let call_keys = batch.call_keys();
    // Pure tools never touch the ledger.
    let keys: Vec<Option<String>> = batch
        .calls
        .iter()
        .zip(&call_keys)
        .map(|(c, k)| if c.effects == SideEffects::Pure { None } else { ledger_key(k) })
        .collect();
    // 10xGraph's "<message id>:<call id>" rows, read along (a thread it left mid-node).
    let legacy: Vec<Option<String>> =
        keys.iter().zip(&call_keys).map(|(key, k)| key.as_ref().and_then(|_| legacy_key(k))).collect();
    // One call reads what earlier attempts recorded and writes an intent record for every call
    // without a row (before any tool of this node starts; fenced, so a run that lost its lease
    // fails here). A read failure is a miss for every call; without intents, idempotent tools
    // still run (at-least-once) and at-most-once tools are refused.
    // Only an at-most-once call needs its start on record before it runs (its replay must not
    // run it again). A node of idempotent calls reads the ledger with a plain read: no intent
    // rows, no row locks, so no commit (the ledger records outcomes; a crashed idempotent call is
    // run again, as it would be after finding its intent). The records after each call stay fenced.
    // A run closing a failed node runs nothing: it only reads what was recorded.
    let closing = cfg.closing_failed_tools;
    let with_intents = !closing && batch.calls.iter().any(|c| c.effects == SideEffects::AtMostOnce);
    // This node's intent rows, told apart from an earlier attempt's (a caller may reuse run ids).
    let attempt = if with_intents { uuid::Uuid::new_v4().simple().to_string() } else { String::new() };
    if with_intents {
        // Before the intents are written: a run dropped while their commit is in flight (which
        // then lands) has handed none of these calls to the host either.
        super::unstarted::waiting(
            cfg,
            keys.iter().zip(&batch.calls).filter_map(|(k, call)| Some((k.clone()?, intent(call, cfg, &attempt, true)))),
        );
    }
    let (recorded, read_ok, intents_ok) = if batch.fresh && cfg.durable_every_step && !with_intents && !closing {
        (HashMap::new(), true, true)
    } else {
        begin_ledger(store, cfg, fence, &batch, &keys, &legacy, with_intents.then_some(attempt.as_str())).await?
    };
    // Results this process could not record on an earlier attempt, where the ledger has none:
    // replayed, and recorded below (a failure keeps them for the next attempt again).
    let mut kept = match store.unrecorded() {
        Some(u) => u.take(&cfg.thread, &keys, |k| recorded.get(k).is_some_and(is_valid_envelope)),
        None => HashMap::new(),
    };
    let mut replay_kept = Vec::new();
    let mut plans = Vec::with_capacity(keys.len());
    // Per call: the human "retry" answers its row says were spent (see `run_one`).
    let mut retries = Vec::with_capacity(keys.len());
    for (i, (call, key)) in batch.calls.iter().zip(&keys).enumerate() {
        let row = key.as_ref().and_then(|k| recorded.get(k));
        retries.push(row.filter(|r| is_intent(r)).map_or(0, spent_retries));
        let old = legacy[i].as_ref().and_then(|k| recorded.get(k)).filter(|r| legacy_row_matches(&call_keys[i], r));
        let mine = key.as_ref().and_then(|k| Some((k, kept.remove(k)?)));
        if let Some((k, r)) = mine.filter(|(_, r)| host.accept_replay(node, i, &r.envelope)) {
            tracing::info!(
                thread_id = %cfg.thread.thread_id,
                ledger_key = %k,
                tool = %r.tool,
                event = "unrecorded_result_replayed",
                "a tool result this process could not record earlier is replayed and recorded now, not run again"
            );
            plans.push(Plan::Replay(r.envelope.clone()));
            replay_kept.push(CarriedRow { key: k.clone(), result: r.envelope, tool: r.tool });
            continue;
        }
        let replay =
            |env: &Value| is_valid_envelope(env).then(|| shared_json(env)).filter(|e| host.accept_replay(node, i, e));
        let plan = match (row, old) {
            _ if let Some(env) = row.and_then(replay).or_else(|| old.and_then(replay)) => Plan::Replay(env),
            _ if closing => Plan::Refuse(NOT_ANSWERED),
            (Some(env), _) if is_paused(env) => Plan::Resume,
            (Some(env), _) if is_intent(env) => Plan::Unknown { at_most_once: started_at_most_once(env) },
            _ if call.effects == SideEffects::AtMostOnce && key.is_none() => Plan::Refuse(UNKEYED),
            _ if call.effects == SideEffects::AtMostOnce && !read_ok => Plan::Refuse(LEDGER_UNREADABLE),
            _ if call.effects == SideEffects::AtMostOnce && !intents_ok => Plan::Refuse(INTENT_UNWRITABLE),
            _ => Plan::Run,
        };
        plans.push(plan);
    }
    write_carried(store, cfg, fence, &replay_kept).await;
    restart_paused(store, cfg, fence, &batch, &keys, &mut plans, &retries, &attempt).await?;
    // `after_record` promises a ledger row committed before the step: where it is armed, every
    // row gets its own commit.
    // An at-most-once call's row stays in its own commit: a crash before the step would leave
    // its intent, an "outcome unknown" for a human to settle, not a call run again.
    let carry = carry.filter(|_| {
        !with_intents
            && (cfg.failpoints.is_off() || !batch.calls.iter().any(|c| cfg.failpoints.arms("after_record", &c.name)))
    });
    let recorder = Recorder::new(batch.calls.len(), with_intents, carry, attempt);
    let calls =
        batch.calls.iter().zip(&keys).zip(plans).zip(retries).enumerate().map(|(i, (((call, key), plan), spent))| {
            let recorder = &recorder;
            async move {
                let settled = run_one(host, store, cfg, recorder, lease, node, i, call, key.clone(), plan, spent).await;
                recorder.settle(i);
                settled
            }
        });
    let settled = futures::future::join_all(calls).await;
    let mut outcomes = Vec::with_capacity(settled.len());
    let mut passthrough = None;
    for s in settled {
        match s {
            Ok(o) => outcomes.push(o),
            Err(e) => {
                // An interrupt, or not an ordinary exception (e.g. cancellation): raised once all
                // calls settled, so every finished sibling is in the ledger first.
                passthrough.get_or_insert(e);
                outcomes.push(ToolOutcome::Failed { message: "interrupted".into() });
            }
        }
    }
    if let Some(e) = passthrough {
        return Err(e);
    }
    host.finish_tools(node, outcomes)
}

/// A host's answer to `run_tool` when it did not start the call because `lease_left` had run
/// out by the time the call could begin (boxed in `HostFailure::Passthrough`).
#[derive(Debug)]
pub struct ToolNotStarted;

impl std::fmt::Display for ToolNotStarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the tool call was not started: the run's lease may have run out before it could begin")
    }
}

impl std::error::Error for ToolNotStarted {}

/// How long the run surely holds its lease, for a call about to start. One that may have run out
/// (no renewal went through for a whole TTL: a long lock wait, a frozen process) is renewed
/// first, one round trip: if nobody took the thread meanwhile the run goes on, and a newer
/// holder fences it before the call starts.
async fn lease_left(
    lease: &Lease,
    store: &dyn Checkpointer,
    cfg: &RunConfig,
    call: &ToolCall,
) -> Result<Duration, HostFailure> {
    if lease.surely_held_for().is_zero() && !lease.confirm(store, cfg).await {
        return Err(lease_gone(cfg, lease, call));
    }
    Ok(lease.surely_held_for())
}

/// The run's answer when another holder may have the thread before a call started: fenced, as
/// its next write would be; the call is not started.
fn lease_gone(cfg: &RunConfig, lease: &Lease, call: &ToolCall) -> HostFailure {
    tracing::error!(
        thread_id = %cfg.thread.thread_id,
        run_id = %cfg.run_id,
        tool = %call.name,
        event = "lease_expired_before_tool",
        "the run's lease ran out before a call of {} could start (the process was frozen or starved?); \
         it is not started, and the run stops",
        call.name
    );
    HostFailure::Passthrough(Box::new(lease.fenced()))
}

const LEDGER_UNREADABLE: &str = "it was not run: its ledger could not be read, and this tool must run at most once, \
so running it without knowing whether an earlier attempt took effect could repeat a side effect; try again later \
[TOOL_LEDGER_UNAVAILABLE]";
const NOT_ANSWERED: &str = "it was not run again: its tool node failed before this call's result was recorded, and \
a new message came instead of a retry, so it may or may not have taken effect; check before calling it again \
[TOOL_NOT_ANSWERED]";
const UNKEYED: &str = "it was not run: the assistant message that asked for it has no id, so a replay could not \
tell whether this call already ran, and this tool must run at most once [TOOL_CALL_UNKEYED]";
const INTENT_UNWRITABLE: &str = "it was not run: its start could not be recorded, and this tool must run at most \
once; try again later [TOOL_LEDGER_UNAVAILABLE]";

/// What the handler does with one call.
#[derive(Debug, Clone)]
enum Plan {
    Replay(SharedJson),
    Run,
    /// Found started but never completed: an earlier attempt may or may not have taken effect.
    /// `at_most_once`: the call started as one (its intent row says so).
    Unknown {
        at_most_once: bool,
    },
    /// Found paused at `interrupt()` by the run that the thread's resume continues: run it
    /// again, once its row says started again (`restart_paused`).
    Resume,
    /// Fail closed without running (at-most-once tools when the ledger is unavailable).
    Refuse(&'static str),
}

/// The intent record of a call about to run (`paused`: of a call paused at `interrupt()`).
fn intent(call: &ToolCall, cfg: &RunConfig, attempt: &str, paused: bool) -> Value {
    let mut v = json!({"__kind__": INTENT_KIND, "tool": call.name, "run_id": cfg.run_id, "attempt": attempt});
    if paused {
        v["paused"] = Value::Bool(true);
    }
    if call.effects == SideEffects::AtMostOnce {
        v[AT_MOST_ONCE_FIELD] = Value::Bool(true);
    }
    v
}

/// The intent row's mark of a call that started as at-most-once. Its unknown outcome is not run
/// again whatever the graph now says of the tool: a deploy that renamed or removed it made the
/// call "idempotent" (the class of a name no tool has), and the model was told the tool was not
/// found, as if the call had never happened (red-team, session 37).
const AT_MOST_ONCE_FIELD: &str = "at_most_once";

fn started_at_most_once(row: &Value) -> bool {
    row.get(AT_MOST_ONCE_FIELD).and_then(Value::as_bool) == Some(true)
}

/// `intent`, counting the human "retry" answers spent on the call (kept across its pauses).
fn intent_after(call: &ToolCall, cfg: &RunConfig, attempt: &str, paused: bool, spent: u64) -> Value {
    let mut v = intent(call, cfg, attempt, paused);
    if spent > 0 {
        v[RETRIES_FIELD] = Value::from(spent);
    }
    v
}

/// The intent row's field counting the human "retry" answers spent on its call: the n-th
/// unknown-outcome question of a call is a new question (see `run_one`).
pub(super) const RETRIES_FIELD: &str = "retries";

fn spent_retries(row: &Value) -> u64 {
    row.get(RETRIES_FIELD).and_then(Value::as_u64).unwrap_or(0)
}

/// Paused calls run again on resume, but only once their row says started again: a crash while
/// the resumed call runs must leave a row that reads as a crash, not as another pause. Without
/// that write an at-most-once call is refused; an idempotent one runs.
#[allow(clippy::too_many_arguments)] // the node's calls, keys, plans and retries, side by side
async fn restart_paused(
    store: &dyn Checkpointer,
    cfg: &RunConfig,
    fence: Option<i64>,
    batch: &ToolBatch,
    keys: &[Option<String>],
    plans: &mut [Plan],
    retries: &[u64],
    attempt: &str,
) -> Result<(), HostFailure> {
    let marks: Vec<(String, Value)> = plans
        .iter()
        .zip(keys)
        .zip(&batch.calls)
        .zip(retries)
        .filter(|(((p, _), _), _)| matches!(p, Plan::Resume))
        .filter_map(|(((_, k), call), spent)| Some((k.clone()?, intent_after(call, cfg, attempt, false, *spent))))
        .collect();
    if marks.is_empty() {
        return Ok(());
    }
    let written = match store.ledger_mark(&cfg.thread, &marks, fence).await {
        Ok(_) => true,
        Err(e @ StoreError::Fenced { .. }) => return Err(HostFailure::Passthrough(Box::new(e))),
        Err(e) => {
            tracing::warn!(thread_id = %cfg.thread.thread_id, event = "intent_not_recorded",
                "could not record that {} paused tool call(s) resumed; idempotent tools run anyway, at-most-once tools do not: {e}",
                marks.len());
            false
        }
    };
    for (plan, call) in plans.iter_mut().zip(&batch.calls) {
        if matches!(plan, Plan::Resume) {
            *plan = if written || call.effects != SideEffects::AtMostOnce {
                Plan::Run
            } else {
                Plan::Refuse(INTENT_UNWRITABLE)
            };
        }
    }
    Ok(())
}

/// The node's ledger rows, and (`with_intents`: their attempt) its intent records written
/// (`Checkpointer::ledger_begin`). Returns the rows found, whether the ledger could be read, and
/// whether the intents are in.
async fn begin_ledger(
    store: &dyn Checkpointer,
    cfg: &RunConfig,
    fence: Option<i64>,
    batch: &ToolBatch,
    keys: &[Option<String>],
    legacy: &[Option<String>],
    with_intents: Option<&str>,
) -> Result<(HashMap<String, Value>, bool, bool), HostFailure> {
    let attempt = with_intents.unwrap_or_default();
    let intents: Vec<(String, Value)> = batch
        .calls
        .iter()
        .zip(keys)
        .filter_map(|(call, key)| key.as_ref().map(|k| (k.clone(), intent(call, cfg, attempt, false))))
        .collect();
    if intents.is_empty() {
        return Ok((HashMap::new(), true, true));
    }
    let also_read: Vec<String> = legacy.iter().flatten().cloned().collect();
    let read_keys: Vec<String> = intents.iter().map(|(k, _)| k.clone()).chain(also_read.iter().cloned()).collect();
    if with_intents.is_none() {
        return match store.ledger_get(&cfg.thread, &read_keys).await {
            Ok(found) => Ok((found, true, true)),
            Err(e) => ledger_read_failed(cfg, intents.len(), e),
        };
    }
    match store.ledger_begin(&cfg.thread, &intents, &also_read, fence).await {
        Ok((found, Ok(()))) => {
            if found.len() < intents.len() {
                inc(&metrics().tool_intents);
            }
            Ok((found, true, true))
        }
        Ok((found, Err(e))) => Ok(intents_not_written(cfg, intents.len(), found, &e)),
        Err(e @ StoreError::Fenced { .. }) => ledger_read_failed(cfg, intents.len(), e),
        // A store that writes the intents and reads in one statement (PostgreSQL) loses the read
        // with a refused write (a read-only server, a full disk): read alone, so that what earlier
        // attempts recorded is still replayed (an at-most-once call was answered "not run" while
        // its result was in the ledger, an idempotent one ran again). The intents are not in.
        Err(e) => match store.ledger_get(&cfg.thread, &read_keys).await {
            Ok(found) => Ok(intents_not_written(cfg, intents.len(), found, &e)),
            Err(_) => ledger_read_failed(cfg, intents.len(), e),
        },
    }
}

/// The ledger was read (`found`) but the intents were not written: idempotent tools run, at-most-once
/// tools are refused.
fn intents_not_written(
    cfg: &RunConfig,
    intents: usize,
    found: HashMap<String, Value>,
    e: &StoreError,
) -> (HashMap<String, Value>, bool, bool) {
    tracing::warn!(
        thread_id = %cfg.thread.thread_id,
        event = "intent_not_recorded",
        "could not record that {} tool call(s) started; idempotent tools run anyway, at-most-once tools do not: {e}",
        intents.saturating_sub(found.len())
    );
    (found, true, false)
}

/// A ledger that cannot be read is a miss for every call: idempotent tools run, at-most-once
/// tools are refused; the lease having moved on stops the node.
fn ledger_read_failed(
    cfg: &RunConfig,
    calls: usize,
    e: StoreError,
) -> Result<(HashMap<String, Value>, bool, bool), HostFailure> {
    if matches!(e, StoreError::Fenced { .. }) {
        inc(&metrics().fenced_writes);
        return Err(HostFailure::Passthrough(Box::new(e)));
    }
    inc(&metrics().ledger_read_failures);
    if cfg.closing_failed_tools {
        // A close answers each call from what was recorded: without the ledger it would call a
        // finished tool "not answered" for good. The close fails, writing nothing.
        return Err(HostFailure::Passthrough(Box::new(e)));
    }
    tracing::warn!(
        thread_id = %cfg.thread.thread_id,
        event = "ledger_read_failed",
        "ledger lookup failed, treating {calls} call(s) as not recorded; idempotent tools will run, at-most-once tools will not: {e}"
    );
    Ok((HashMap::new(), false, false))
}

#[allow(clippy::too_many_arguments)]
async fn run_one<H: NodeHost + ?Sized>(
    host: &H,
    store: &dyn Checkpointer,
    cfg: &RunConfig,
    recorder: &Recorder<'_>,
    lease: Option<&Lease>,
    node: &str,
    index: usize,
    call: &ToolCall,
    key: Option<String>,
    plan: Plan,
    mut spent: u64,
) -> Result<ToolOutcome, HostFailure> {
    let fence = lease.map(|l| l.token);
    let m = metrics();
    let idem = key.as_deref().map(|k| idempotency_key(&cfg.thread.thread_id, k));
    match plan {
        Plan::Replay(env) => {
            inc(&m.tool_replayed);
            tracing::info!(
                thread_id = %cfg.thread.thread_id,
                tool = %call.name,
                ledger_key = key.as_deref().unwrap_or(""),
                "tool call replayed from the ledger, not run again"
            );
            return Ok(ToolOutcome::Replayed(env));
        }
        Plan::Refuse(why) => {
            inc(&m.tool_errors);
            return Ok(ToolOutcome::Failed { message: why.to_owned() });
        }
        Plan::Unknown { at_most_once } => {
            let at_most_once = at_most_once || call.effects == SideEffects::AtMostOnce;
            inc(&m.tool_outcome_unknown);
            tracing::warn!(
                thread_id = %cfg.thread.thread_id,
                run_id = %cfg.run_id,
                tool = %call.name,
                ledger_key = key.as_deref().unwrap_or(""),
                event = "tool_outcome_unknown",
                "tool call {} ({}) started earlier but its result was never recorded; {}",
                key.as_deref().unwrap_or(""),
                call.name,
                if at_most_once { "it is at-most-once: not run again" } else { "it is idempotent: running it again (a sync call still running in this process is joined, not started twice)" }
            );
            if at_most_once {
                match host.unknown_outcome(node, index, idem.clone(), spent)? {
                    // The human's "retry" is spent before the call runs: the answer stays with the
                    // thread until the node finishes, and a crash during the retried call found
                    // the same answer and ran the call again, once per crash. The row now counts
                    // it, so the next unknown outcome of this call is a new question.
                    UnknownAnswer::Retry => {
                        let Some(k) = key.as_deref() else {
                            return Ok(ToolOutcome::Failed { message: UNKEYED.to_owned() });
                        };
                        let mark = [(k.to_owned(), intent_after(call, cfg, &recorder.attempt, false, spent + 1))];
                        match store.ledger_mark(&cfg.thread, &mark, fence).await {
                            Ok(1) => spent += 1,
                            Err(e @ StoreError::Fenced { .. }) => return Err(HostFailure::Passthrough(Box::new(e))),
                            Ok(_) | Err(_) => {
                                inc(&m.tool_errors);
                                return Ok(ToolOutcome::Failed { message: INTENT_UNWRITABLE.to_owned() });
                            }
                        }
                    }
                    UnknownAnswer::Answer(run) => {
                        if recorder.record_result(store, cfg, fence, index, call, key.as_deref(), &run).await {
                            host.tool_settled(node, index);
                        }
                        return Ok(ToolOutcome::Ran(run.envelope));
                    }
                }
            }
        }
        Plan::Run => {
            if key.is_some() {
                inc(&m.ledger_misses);
            }
        }
        Plan::Resume => unreachable!("restart_paused settles every paused call"),
    }
    inc(&m.tool_calls);
    let crash = |f: crate::failpoints::Fired| HostFailure::Passthrough(Box::new(f));
    cfg.failpoints.hit("before_tool", &call.name).await.map_err(crash)?;
    if recorder.intents_written
        && let Some(k) = &key
    {
        super::unstarted::handed_over(cfg, k);
    }
    // A run that cannot be sure it holds the thread starts no call: a newer holder may have run
    // it already. The host checks again when the call really starts (a call handed over just
    // before the process froze starts after it thaws): it did not start, the lease is confirmed
    // (or the run fenced), and it is handed over again.
    let started = Instant::now();
    let mut handed = 0;
    let result = loop {
        let left = match lease {
            Some(l) => Some(lease_left(l, store, cfg, call).await?),
            None => None,
        };
        handed += 1;
        let fut = host.run_tool(node, index, key.as_deref(), idem.clone(), left);
        let r = match cfg.tool_timeout {
            Some(limit) => match tokio::time::timeout(limit, fut).await {
                Ok(r) => r,
                Err(_) => {
                    if let Some(run) = host.returned_when_cut(node, index) {
                        tracing::warn!(
                            thread_id = %cfg.thread.thread_id,
                            tool = %call.name,
                            event = "tool_returned_before_timeout",
                            "tool call returned, then its tool_timeout ran out (in code that runs after the tool); its result stands and is recorded"
                        );
                        add_duration(&m.tool_duration_us, started.elapsed());
                        if recorder.record_result(store, cfg, fence, index, call, key.as_deref(), &run).await {
                            host.tool_settled(node, index);
                        }
                        return Ok(ToolOutcome::Ran(run.envelope));
                    }
                    inc(&m.tool_timeouts);
                    tracing::warn!(thread_id = %cfg.thread.thread_id, tool = %call.name, "tool call timed out after {:?} and was cancelled", limit);
                    return Ok(ToolOutcome::TimedOut { secs: limit.as_secs_f64() });
                }
            },
            None => fut.await,
        };
        match r {
            Err(HostFailure::Passthrough(e)) if e.is::<ToolNotStarted>() => {
                if handed >= 3 {
                    return Err(lease_gone(cfg, lease.expect("only a host given a lease refuses"), call));
                }
            }
            r => break r,
        }
    };
    add_duration(&m.tool_duration_us, started.elapsed());
    match result {
        Ok(run) => {
            if run.is_error {
                inc(&m.tool_errors);
            }
            cfg.failpoints.hit("after_tool", &call.name).await.map_err(crash)?;
            let shown_now = recorder.record_result(store, cfg, fence, index, call, key.as_deref(), &run).await;
            cfg.failpoints.hit("after_record", &call.name).await.map_err(crash)?;
            if shown_now {
                host.tool_settled(node, index);
            }
            Ok(ToolOutcome::Ran(run.envelope))
        }
        Err(HostFailure::Raised { message, .. }) => {
            inc(&m.tool_errors);
            Ok(ToolOutcome::Failed { message })
        }
        Err(e @ HostFailure::Interrupt { .. }) => {
            // A pause, not a crash: the row says so, and the resume runs the call again without
            // asking whether an earlier attempt took effect.
            if let Some(k) = key {
                let mark = [(k.clone(), intent_after(call, cfg, &recorder.attempt, true, spent))];
                // A node of idempotent calls wrote no intent rows: where there was no started row
                // to mark, the paused row is inserted (a result already there is never replaced).
                let written = match store.ledger_mark(&cfg.thread, &mark, fence).await {
                    Ok(0) if !recorder.intents_written => {
                        store.ledger_put_many(&cfg.thread, &[(k.clone(), shared_json(&mark[0].1))], fence).await
                    }
                    other => other,
                };
                match written {
                    Err(err @ StoreError::Fenced { .. }) => return Err(HostFailure::Passthrough(Box::new(err))),
                    Err(err) => tracing::warn!(thread_id = %cfg.thread.thread_id, tool = %call.name, ledger_key = %k,
                        "could not record that the call paused; its resume will treat it as an unknown outcome: {err}"),
                    Ok(_) => {}
                }
            }
            Err(e)
        }
        Err(e @ HostFailure::Passthrough(_)) => Err(e),
    }
}
