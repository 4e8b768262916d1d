//! The replay-safe tool handler: one node's tool calls, looked up in the ledger in one query, the
//! misses run concurrently under `tool_timeout`, each result recorded the moment it returns.

use super::ledger::{idempotency_key, is_valid_envelope, ledger_key};
use super::metrics::{add_duration, inc, metrics};
use super::{ExecMeta, HostFailure, NodeHost, NodeOutput, RunConfig};
use crate::store::Checkpointer;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::oneshot;

/// One call of the issuing assistant message.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub call_id: Option<String>,
    pub name: String,
}

/// The calls of the last assistant message, and that message's id.
#[derive(Debug, Clone)]
pub struct ToolBatch {
    pub origin_message_id: Option<String>,
    pub calls: Vec<ToolCall>,
}

/// A tool that ran to an answer (an error message the model can read counts as an answer).
#[derive(Debug, Clone)]
pub struct ToolRun {
    /// `{"__kind__": "message" | "raw", "value": ...}`
    pub envelope: Value,
    /// False for answers that must not be replayed (e.g. malformed arguments: the tool never ran).
    pub record: bool,
    pub is_error: bool,
}

/// How each call of a node settled, in call order.
#[derive(Debug, Clone)]
pub enum ToolOutcome {
    Replayed(Value),
    Ran(Value),
    TimedOut { secs: f64 },
    Failed { message: String },
}

/// Runs a tool node. Every call settles before this returns (no orphaned task); dropping the
/// returned future (node timeout, stop) cancels the calls still running.
pub async fn run_tool_node<H: NodeHost + ?Sized>(
    host: &H,
    store: &dyn Checkpointer,
    cfg: &RunConfig,
    node: &str,
    exec: &ExecMeta,
) -> Result<NodeOutput, HostFailure> {
    let batch = host.begin_tools(node, exec)?;
    let keys: Vec<Option<String>> = batch
        .calls
        .iter()
        .map(|c| ledger_key(batch.origin_message_id.as_deref(), c.call_id.as_deref()))
        .collect();
    let recorded = lookup(store, cfg, &keys).await;
    let recorder = Recorder::default();
    let calls = batch.calls.iter().zip(&keys).enumerate().map(|(i, (call, key))| {
        let hit = key
            .as_ref()
            .and_then(|k| recorded.get(k))
            .filter(|env| is_valid_envelope(env) && host.accept_replay(node, i, env))
            .cloned();
        run_one(host, store, cfg, &recorder, node, i, call, key.clone(), hit)
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

/// One query for the whole node. A read failure is a miss for every call: the tools run
/// (at-least-once) instead of the run failing.
async fn lookup(store: &dyn Checkpointer, cfg: &RunConfig, keys: &[Option<String>]) -> HashMap<String, Value> {
    let wanted: Vec<String> = keys.iter().flatten().cloned().collect();
    if wanted.is_empty() {
        return HashMap::new();
    }
    match store.ledger_get(&cfg.thread, &wanted).await {
        Ok(m) => m,
        Err(e) => {
            inc(&metrics().ledger_read_failures);
            tracing::warn!(
                thread_id = %cfg.thread.thread_id,
                event = "ledger_read_failed",
                "ledger lookup failed, treating {} call(s) as not recorded; they will run: {e}",
                wanted.len()
            );
            HashMap::new()
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_one<H: NodeHost + ?Sized>(
    host: &H,
    store: &dyn Checkpointer,
    cfg: &RunConfig,
    recorder: &Recorder,
    node: &str,
    index: usize,
    call: &ToolCall,
    key: Option<String>,
    hit: Option<Value>,
) -> Result<ToolOutcome, HostFailure> {
    let m = metrics();
    if let Some(env) = hit {
        inc(&m.tool_replayed);
        tracing::info!(
            thread_id = %cfg.thread.thread_id,
            tool = %call.name,
            ledger_key = key.as_deref().unwrap_or(""),
            "tool call replayed from the ledger, not run again"
        );
        return Ok(ToolOutcome::Replayed(env));
    }
    if key.is_some() {
        inc(&m.ledger_misses);
    }
    inc(&m.tool_calls);
    let idem = key.as_deref().map(|k| idempotency_key(&cfg.thread.thread_id, k));
    let crash = |f: crate::failpoints::Fired| HostFailure::Passthrough(Box::new(f));
    cfg.failpoints.hit("before_tool", &call.name).await.map_err(crash)?;
    let started = Instant::now();
    let fut = host.run_tool(node, index, idem);
    let result = match cfg.tool_timeout {
        Some(limit) => match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => {
                inc(&m.tool_timeouts);
                tracing::warn!(thread_id = %cfg.thread.thread_id, tool = %call.name, "tool call timed out after {:?} and was cancelled", limit);
                return Ok(ToolOutcome::TimedOut { secs: limit.as_secs_f64() });
            }
        },
        None => fut.await,
    };
    add_duration(&m.tool_duration_us, started.elapsed());
    match result {
        Ok(run) => {
            if run.is_error {
                inc(&m.tool_errors);
            }
            cfg.failpoints.hit("after_tool", &call.name).await.map_err(crash)?;
            if let (true, Some(k)) = (run.record, key.as_deref()) {
                if let Err(e) = recorder.record(store, cfg, k, &run.envelope).await {
                    not_recorded(cfg, &call.name, k, &e);
                }
            }
            cfg.failpoints.hit("after_record", &call.name).await.map_err(crash)?;
            host.tool_settled(node, index);
            Ok(ToolOutcome::Ran(run.envelope))
        }
        Err(HostFailure::Raised { message, .. }) => {
            inc(&m.tool_errors);
            Ok(ToolOutcome::Failed { message })
        }
        Err(e @ (HostFailure::Passthrough(_) | HostFailure::Interrupt { .. })) => Err(e),
    }
}

/// Group commit for the ledger. A result is written the moment its tool returns; results that
/// return while a write is in flight share the next transaction, so parallel tools do not pay one
/// commit (and one fsync) each.
#[derive(Default)]
struct Recorder {
    queue: Mutex<RecorderQueue>,
}

#[derive(Default)]
struct RecorderQueue {
    pending: Vec<(String, Value, oneshot::Sender<Result<(), String>>)>,
    writing: bool,
}

impl Recorder {
    async fn record(&self, store: &dyn Checkpointer, cfg: &RunConfig, key: &str, envelope: &Value) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.pending.push((key.to_owned(), envelope.clone(), tx));
            !std::mem::replace(&mut q.writing, true)
        };
        if lead {
            loop {
                let batch = {
                    let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                    if q.pending.is_empty() {
                        q.writing = false;
                        break;
                    }
                    std::mem::take(&mut q.pending)
                };
                let entries: Vec<(String, Value)> = batch.iter().map(|(k, v, _)| (k.clone(), v.clone())).collect();
                let result = store.ledger_put_many(&cfg.thread, &entries).await.map(|_| ()).map_err(|e| e.to_string());
                for (_, _, done) in batch {
                    let _ = done.send(result.clone());
                }
            }
        }
        rx.await.unwrap_or_else(|_| Err("the ledger writer was cancelled".into()))
    }
}

/// A failure to record is logged, never raised: the side effect already happened and the model
/// needs the result.
fn not_recorded(cfg: &RunConfig, tool: &str, key: &str, error: &str) {
    inc(&metrics().tool_record_failures);
    // The message is a constant so alerts and log grouping can match it; the details are fields.
    tracing::error!(
        thread_id = %cfg.thread.thread_id,
        run_id = %cfg.run_id,
        tool = %tool,
        ledger_key = %key,
        error = %error,
        event = "tool_result_not_recorded",
        "tool call COMPLETED but could not be recorded; a replay of this node may run it again"
    );
}
