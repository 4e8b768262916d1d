//! The tool handler (`engine::run_tool_node`) on its own, driven by a Rust host and a real store:
//! finished calls replayed from the ledger, pure tools outside it, unkeyed and unknown-outcome
//! calls by side-effect class, per-call timeouts, repeated call ids.

mod common;

use async_trait::async_trait;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tenxgraph::engine::{
    BoxError, EngineError, ExecMeta, HostFailure, MsgCursor, NodeHost, NodeOutput, RouteValue, RunConfig, SideEffects,
    Snapshot, Stored, ToolBatch, ToolCall, ToolOutcome, ToolRun, run_tool_node,
};
use tenxgraph::store::{
    Checkpointer, MemoryStore, PgOptions, PgStore, SqliteStore, ThreadRef, decode_raw, shared_json,
};

#[derive(Clone, Copy, PartialEq)]
enum Act {
    Answer,
    Hang,
    Raise,
}

/// A tool node's host: the calls of one assistant message, each tool counting its runs.
struct ToolHost {
    batch: ToolBatch,
    acts: Vec<Act>,
    runs: Mutex<HashMap<usize, usize>>,
    keys_seen: Mutex<Vec<Option<String>>>,
    outcomes: Mutex<Vec<ToolOutcome>>,
}

impl ToolHost {
    fn new(message_id: Option<Value>, calls: &[(Option<Value>, &str, SideEffects, Act)]) -> Self {
        ToolHost {
            batch: ToolBatch {
                origin_message_id: message_id,
                calls: calls
                    .iter()
                    .map(|(id, name, fx, _)| ToolCall { call_id: id.clone(), name: (*name).into(), effects: *fx })
                    .collect(),
                fresh: false,
            },
            acts: calls.iter().map(|c| c.3).collect(),
            runs: Mutex::default(),
            keys_seen: Mutex::default(),
            outcomes: Mutex::default(),
        }
    }
    fn runs(&self, index: usize) -> usize {
        self.runs.lock().unwrap().get(&index).copied().unwrap_or(0)
    }
    fn outcomes(&self) -> Vec<ToolOutcome> {
        self.outcomes.lock().unwrap().clone()
    }
}

#[async_trait]
impl NodeHost for ToolHost {
    async fn prepare(&self, _: Stored<'_>, _: &ExecMeta) -> Result<MsgCursor, EngineError> {
        unreachable!("the tool handler never prepares a run")
    }
    async fn run_node(&self, _: &str, _: &ExecMeta) -> Result<NodeOutput, HostFailure> {
        unreachable!("only tool nodes here")
    }
    fn eval_condition(&self, _: usize) -> Result<RouteValue, BoxError> {
        unreachable!("no conditions")
    }
    fn snapshot(&self, _: &ExecMeta, _: &MsgCursor) -> Result<Snapshot, EngineError> {
        unreachable!("the tool handler never commits a step")
    }
    fn begin_tools(&self, _: &str, _: &ExecMeta) -> Result<ToolBatch, HostFailure> {
        Ok(self.batch.clone())
    }
    async fn run_tool(
        &self,
        _: &str,
        index: usize,
        key: Option<&str>,
        _: Option<String>,
        _: Option<std::time::Duration>,
    ) -> Result<ToolRun, HostFailure> {
        *self.runs.lock().unwrap().entry(index).or_insert(0) += 1;
        self.keys_seen.lock().unwrap().push(key.map(str::to_owned));
        match self.acts[index] {
            Act::Answer => Ok(ToolRun {
                envelope: shared_json(
                    &json!({"__kind__": "raw", "value": format!("{} done", self.batch.calls[index].name)}),
                ),
                record: true,
                is_error: false,
            }),
            Act::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                unreachable!("cancelled by tool_timeout")
            }
            Act::Raise => Err(HostFailure::Raised {
                error_type: "ValueError".into(),
                message: "ValueError: card declined".into(),
                cause: "card declined".into(),
            }),
        }
    }
    fn finish_tools(&self, _: &str, outcomes: Vec<ToolOutcome>) -> Result<NodeOutput, HostFailure> {
        *self.outcomes.lock().unwrap() = outcomes;
        Ok(NodeOutput::default())
    }
}

async fn stores() -> Vec<(&'static str, Arc<dyn Checkpointer>)> {
    let sqlite = SqliteStore::open(":memory:", false, false).await.unwrap();
    sqlite.setup().await.unwrap();
    let mut all: Vec<(&'static str, Arc<dyn Checkpointer>)> =
        vec![("memory", Arc::new(MemoryStore::new(false))), ("sqlite", Arc::new(sqlite))];
    if let Some(dsn) = common::pg_dsn() {
        let opts = PgOptions { schema: format!("tl_{}", uuid::Uuid::new_v4().simple()), ..Default::default() };
        all.push(("postgres", Arc::new(PgStore::connect(&dsn, None, opts).await.expect("test Postgres"))));
    }
    all
}

fn cfg(thread: &str) -> RunConfig {
    let mut c = RunConfig::new(ThreadRef::new(thread, "u"));
    c.run_id = "run-1".into();
    c
}

fn exec() -> ExecMeta {
    serde_json::from_value(json!({"current_node": "tools", "step": 1, "status": "running"})).unwrap()
}

async fn run(host: &ToolHost, store: &dyn Checkpointer, c: &RunConfig) -> Vec<ToolOutcome> {
    run_tool_node(host, store, c, "tools", &exec(), None, None).await.expect("tool node");
    host.outcomes()
}

fn ran_value(o: &ToolOutcome) -> Option<Value> {
    match o {
        ToolOutcome::Ran(env) => decode_raw(env).get("value").cloned(),
        _ => None,
    }
}

#[tokio::test]
async fn a_finished_call_is_answered_from_the_ledger_not_run_again() {
    for (name, store) in stores().await {
        let c = cfg(&format!("replay-{name}"));
        let calls = [
            (Some(json!("call_1")), "charge_card", SideEffects::Idempotent, Act::Answer),
            (Some(json!("call_2")), "send_receipt", SideEffects::AtMostOnce, Act::Answer),
        ];
        let first = ToolHost::new(Some(json!("m-1")), &calls);
        let out = run(&first, &*store, &c).await;
        assert!(out.iter().all(|o| matches!(o, ToolOutcome::Ran(_))), "{name}: {out:?}");
        assert_eq!((first.runs(0), first.runs(1)), (1, 1), "{name}");
        let keys: Vec<String> = store.ledger_list(&c.thread).await.unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(keys.len(), 2, "{name}: {keys:?}");
        assert!(keys.contains(&r#"["m-1","call_1"]"#.to_string()), "{name}: {keys:?}");

        // The node replayed (a crash after its tools, before its step): nothing runs again.
        let replay = ToolHost::new(Some(json!("m-1")), &calls);
        let out = run(&replay, &*store, &c).await;
        assert_eq!((replay.runs(0), replay.runs(1)), (0, 0), "{name}");
        match &out[0] {
            ToolOutcome::Replayed(env) => assert_eq!(decode_raw(env)["value"], "charge_card done", "{name}"),
            other => panic!("{name}: expected a replay, got {other:?}"),
        }
        assert!(matches!(out[1], ToolOutcome::Replayed(_)), "{name}: {out:?}");
    }
}

#[tokio::test]
async fn pure_tools_never_touch_the_ledger() {
    for (name, store) in stores().await {
        let c = cfg(&format!("pure-{name}"));
        let calls = [(Some(json!("call_1")), "add", SideEffects::Pure, Act::Answer)];
        for attempt in 1..=2 {
            let host = ToolHost::new(Some(json!("m-1")), &calls);
            let out = run(&host, &*store, &c).await;
            assert_eq!(ran_value(&out[0]), Some(json!("add done")), "{name} attempt {attempt}");
            assert_eq!(host.runs(0), 1, "{name} attempt {attempt}: a pure tool runs every time");
            assert_eq!(host.keys_seen.lock().unwrap().clone(), vec![None], "{name}: no ledger key");
        }
        assert!(store.ledger_list(&c.thread).await.unwrap().is_empty(), "{name}");
    }
}

#[tokio::test]
async fn without_a_message_id_idempotent_tools_run_and_at_most_once_tools_are_refused() {
    for (name, store) in stores().await {
        let c = cfg(&format!("unkeyed-{name}"));
        let calls = [
            (Some(json!("call_1")), "lookup", SideEffects::Idempotent, Act::Answer),
            (Some(json!("call_2")), "charge_card", SideEffects::AtMostOnce, Act::Answer),
        ];
        let host = ToolHost::new(None, &calls);
        let out = run(&host, &*store, &c).await;
        assert_eq!(ran_value(&out[0]), Some(json!("lookup done")), "{name}");
        match &out[1] {
            ToolOutcome::Failed { message } => assert!(message.ends_with("[TOOL_CALL_UNKEYED]"), "{name}: {message}"),
            other => panic!("{name}: expected a refusal, got {other:?}"),
        }
        assert_eq!((host.runs(0), host.runs(1)), (1, 0), "{name}");
        assert!(store.ledger_list(&c.thread).await.unwrap().is_empty(), "{name}: nothing keyed, nothing recorded");
    }
}

#[tokio::test]
async fn a_call_started_but_never_recorded_is_settled_by_its_side_effect_class() {
    for (name, store) in stores().await {
        let c = cfg(&format!("unknown-{name}"));
        let calls = [
            (Some(json!("call_1")), "send_receipt", SideEffects::Idempotent, Act::Answer),
            (Some(json!("call_2")), "charge_card", SideEffects::AtMostOnce, Act::Answer),
        ];
        // An earlier attempt recorded both starts and never got a result (here: both hung past
        // tool_timeout; a crash mid-call leaves the same rows).
        let mut hung = c.clone();
        hung.tool_timeout = Some(Duration::from_millis(100));
        let hang: Vec<_> = calls.iter().map(|(id, n, fx, _)| (id.clone(), *n, *fx, Act::Hang)).collect();
        let first = ToolHost::new(Some(json!("m-1")), &hang);
        let out = run(&first, &*store, &hung).await;
        assert!(out.iter().all(|o| matches!(o, ToolOutcome::TimedOut { .. })), "{name}: {out:?}");
        let rows = store.ledger_list(&c.thread).await.unwrap();
        assert!(rows.iter().all(|e| e.result.as_ref().is_some_and(|r| r["__kind__"] == "started")), "{name}: {rows:?}");
        let host = ToolHost::new(Some(json!("m-1")), &calls);
        let out = run(&host, &*store, &c).await;
        assert_eq!(host.runs(0), 1, "{name}: idempotent: run again");
        assert_eq!(ran_value(&out[0]), Some(json!("send_receipt done")), "{name}");
        assert_eq!(host.runs(1), 0, "{name}: at-most-once: never run twice");
        let text = ran_value(&out[1]).and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        assert!(text.ends_with("[TOOL_OUTCOME_UNKNOWN]"), "{name}: {out:?}");
        // The idempotent call's result replaced its intent; the unknown one still reads as started.
        let rows: HashMap<String, Option<Value>> =
            store.ledger_list(&c.thread).await.unwrap().into_iter().map(|e| (e.key, e.result)).collect();
        assert_eq!(rows[r#"["m-1","call_1"]"#].as_ref().unwrap()["value"], "send_receipt done", "{name}");
        assert_eq!(rows[r#"["m-1","call_2"]"#].as_ref().unwrap()["__kind__"], "started", "{name}");
    }
}

#[tokio::test]
async fn a_hung_call_times_out_alone_and_its_siblings_are_recorded() {
    for (name, store) in stores().await {
        let mut c = cfg(&format!("timeout-{name}"));
        c.tool_timeout = Some(Duration::from_millis(200));
        let calls = [
            (Some(json!("call_1")), "smtp", SideEffects::Idempotent, Act::Hang),
            (Some(json!("call_2")), "lookup", SideEffects::Idempotent, Act::Answer),
            (Some(json!("call_3")), "charge_card", SideEffects::Idempotent, Act::Raise),
        ];
        let host = ToolHost::new(Some(json!("m-1")), &calls);
        let out = run(&host, &*store, &c).await;
        assert!(matches!(out[0], ToolOutcome::TimedOut { secs } if (secs - 0.2).abs() < 1e-9), "{name}: {out:?}");
        assert_eq!(ran_value(&out[1]), Some(json!("lookup done")), "{name}");
        assert!(
            matches!(&out[2], ToolOutcome::Failed { message } if message.contains("card declined")),
            "{name}: {out:?}"
        );
        let rows: HashMap<String, Option<Value>> =
            store.ledger_list(&c.thread).await.unwrap().into_iter().map(|e| (e.key, e.result)).collect();
        assert_eq!(rows[r#"["m-1","call_2"]"#].as_ref().unwrap()["value"], "lookup done", "{name}");
        // Neither the timed-out nor the failed call has a result: a replay runs them again.
        for k in [r#"["m-1","call_1"]"#, r#"["m-1","call_3"]"#] {
            assert_ne!(
                rows.get(k).and_then(|r| r.as_ref()).and_then(|r| r.get("__kind__")),
                Some(&json!("raw")),
                "{name}: {k}"
            );
        }
    }
}

#[tokio::test]
async fn a_repeated_call_id_gets_a_key_of_its_own() {
    for (name, store) in stores().await {
        let c = cfg(&format!("repeat-{name}"));
        let calls = [
            (Some(json!("call_1")), "lookup", SideEffects::Idempotent, Act::Answer),
            (Some(json!("call_1")), "charge_card", SideEffects::Idempotent, Act::Answer),
        ];
        let host = ToolHost::new(Some(json!("m-1")), &calls);
        run(&host, &*store, &c).await;
        let keys = host.keys_seen.lock().unwrap().clone();
        let mut keys: Vec<String> = keys.into_iter().map(Option::unwrap).collect();
        keys.sort();
        assert_eq!(keys, vec![r#"["m-1","call_1",1]"#.to_string(), r#"["m-1","call_1"]"#.to_string()], "{name}");
        let replay = ToolHost::new(Some(json!("m-1")), &calls);
        let out = run(&replay, &*store, &c).await;
        assert_eq!((replay.runs(0), replay.runs(1)), (0, 0), "{name}");
        let values: Vec<Value> = out
            .iter()
            .map(|o| match o {
                ToolOutcome::Replayed(env) => decode_raw(env)["value"].clone(),
                other => panic!("{name}: {other:?}"),
            })
            .collect();
        assert_eq!(values, vec![json!("lookup done"), json!("charge_card done")], "{name}: each call its own result");
    }
}
