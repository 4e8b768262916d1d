//! Recovery's two engine halves: a `resume_only` run continues a thread only while a run is
//! under way there, and `recovery_candidates` tells a live lease holder from a dead or absent one.

mod common;

use async_trait::async_trait;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tenxgraph::engine::{
    BoxError, END, EdgeSpec, EngineError, ExecMeta, ExecStatus, GraphSpec, HostFailure, MsgCursor, NodeHost,
    NodeOutput, RouteValue, RunConfig, RunInput, START, Snapshot, Stored, recovery_candidates, run,
};
use tenxgraph::store::{Checkpointer, LeaseRequest, MemoryStore, SqliteStore, StepWrite, StoredMessage, ThreadRef};

/// Nodes record their name; the node named in `hold` waits until `release` is notified.
#[derive(Default)]
struct Host {
    calls: Mutex<Vec<String>>,
    hold: Option<&'static str>,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait]
impl NodeHost for Host {
    async fn prepare(&self, _stored: Stored<'_>, _exec: &ExecMeta) -> Result<MsgCursor, EngineError> {
        Ok(MsgCursor::default())
    }
    async fn run_node(&self, node: &str, _exec: &ExecMeta) -> Result<NodeOutput, HostFailure> {
        self.calls.lock().unwrap().push(node.to_owned());
        if self.hold == Some(node) {
            self.entered.notify_one();
            self.release.notified().await;
        }
        Ok(NodeOutput::default())
    }
    fn eval_condition(&self, _index: usize) -> Result<RouteValue, BoxError> {
        Ok(RouteValue::Str(END.into()))
    }
    fn snapshot(&self, exec: &ExecMeta, cursor: &MsgCursor) -> Result<Snapshot, EngineError> {
        Ok(Snapshot {
            state: json!({"execution_meta": exec}).to_string(),
            new_messages: vec![],
            replace_messages: false,
            cursor: cursor.clone(),
        })
    }
}

impl Host {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

fn graph() -> GraphSpec {
    GraphSpec {
        nodes: vec!["a".into(), "b".into()],
        edges: vec![EdgeSpec::fixed(START, "a"), EdgeSpec::fixed("a", "b"), EdgeSpec::fixed("b", END)],
        entry: Some("a".into()),
        ..Default::default()
    }
}

const NEW: RunInput = RunInput { has_messages: true, has_state_update: false, start_node: None, resume_only: false };
const RECOVER: RunInput =
    RunInput { has_messages: false, has_state_update: false, start_node: None, resume_only: true };

fn cfg(thread: &str, user: &str) -> RunConfig {
    let mut c = RunConfig::new(ThreadRef::new(thread, user));
    c.run_id = format!("run-{thread}-{}", uuid::Uuid::new_v4().simple());
    c
}

async fn stores() -> Vec<(&'static str, Arc<dyn Checkpointer>)> {
    // The ttl rule itself (SQLite's grace past it: store_conformance.rs).
    let sqlite = SqliteStore::open(":memory:", false, false).await.unwrap().with_lease_grace(Duration::ZERO);
    sqlite.setup().await.unwrap();
    let mut all: Vec<(&'static str, Arc<dyn Checkpointer>)> =
        vec![("memory", Arc::new(MemoryStore::new(false))), ("sqlite", Arc::new(sqlite))];
    if let Some(dsn) = common::pg_dsn() {
        let opts = tenxgraph::store::PgOptions {
            schema: format!("rc_{}", uuid::Uuid::new_v4().simple()),
            ..Default::default()
        };
        all.push((
            "postgres",
            Arc::new(tenxgraph::store::PgStore::connect(&dsn, None, opts).await.expect("test Postgres")),
        ));
    }
    all
}

/// A state as a run that died at `node` leaves it (or, with START, as `aput_state` writes one).
async fn put_state(store: &dyn Checkpointer, t: &ThreadRef, status: &str, node: &str) -> i64 {
    let state = json!({"execution_meta": {"status": status, "current_node": node, "step": 1}});
    let version = store.load(t).await.unwrap().map(|c| c.version).unwrap_or(0);
    let (state_text, mark) = common::state_text(&state);
    let w = StepWrite {
        expected_version: version,
        state: state_text,
        mark,
        new_messages: &[] as &[StoredMessage],
        replace_messages: false,
        fence: None,
        release_lease: false,
        in_tx: None,
        previous_mark: None,
        expected_mark: None,
    };
    store.put_step(t, w).await.unwrap()
}

#[tokio::test]
async fn resume_only_continues_a_running_thread_and_touches_nothing_else() {
    for (name, store) in stores().await {
        let g = graph();
        // A run that died at node b: resumed from b, once.
        let crashed = ThreadRef::new("crashed", "u1");
        put_state(&*store, &crashed, "running", "b").await;
        let host = Host::default();
        let out = run(&g, &*store, &host, &cfg("crashed", "u1"), RECOVER).await.unwrap();
        assert!(!out.nothing_to_resume, "{name}");
        assert_eq!(out.exec.status, ExecStatus::Completed, "{name}");
        assert_eq!(host.calls(), ["b"], "{name}");

        // Finished, failed, paused threads, a state written outside a run, and no thread at all:
        // nothing runs, nothing is written, and the lease is free again afterwards.
        let done = ThreadRef::new("done", "u1");
        run(&g, &*store, &Host::default(), &cfg("done", "u1"), NEW).await.unwrap();
        let cases = [
            ("done", None),
            ("failed", Some(("error", "b"))),
            ("paused", Some(("interrupted_before", "b"))),
            ("outside", Some(("running", START))),
            ("nothing", None),
        ];
        for (thread, state) in cases {
            let t = ThreadRef::new(thread, "u1");
            if let Some((status, node)) = state {
                put_state(&*store, &t, status, node).await;
            }
            let before = store.load(&t).await.unwrap().map(|c| (c.version, c.state));
            let host = Host::default();
            let out = run(&g, &*store, &host, &cfg(thread, "u1"), RECOVER).await.unwrap();
            assert!(out.nothing_to_resume, "{name} {thread}");
            assert!(host.calls().is_empty(), "{name} {thread}: {:?}", host.calls());
            let after = store.load(&t).await.unwrap().map(|c| (c.version, c.state));
            assert_eq!(before, after, "{name} {thread}: recovery wrote to a thread it did not resume");
            if let Some(lease) = store.lease_get(thread).await.unwrap() {
                assert!(!lease.is_live(), "{name} {thread}: lease left held: {lease:?}");
            }
        }
        assert!(store.load(&ThreadRef::new("nothing", "u1")).await.unwrap().is_none(), "{name}");
        assert_eq!(store.load(&done).await.unwrap().unwrap().state["execution_meta"]["status"], "completed", "{name}");
    }
}

#[tokio::test]
async fn candidates_name_a_live_holder_and_pass_over_dead_or_expired_ones() {
    for (name, store) in stores().await {
        for id in ["free", "expired", "elsewhere", "here"] {
            put_state(&*store, &ThreadRef::new(id, "owner"), "running", "b").await;
        }
        let req = |holder: &str, host: &str, ttl_ms: u64| LeaseRequest {
            holder: holder.into(),
            host: host.into(),
            pid: 1,
            pid_start: 1,
            ttl: Duration::from_millis(ttl_ms),
            steal: None,
            user_id: None,
            owner_scoped: false,
        };
        store.lease_acquire("expired", &req("gone", "another-host", 1)).await.unwrap();
        // A holder on a machine whose processes cannot be checked is alive until its lease expires.
        store.lease_acquire("elsewhere", &req("remote-run", "another-host", 60_000)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;

        // A run of this process, held inside node b.
        let host = Arc::new(Host { hold: Some("b"), ..Default::default() });
        let (g, s, h) = (graph(), store.clone(), host.clone());
        let c = cfg("here", "owner");
        let held_run = c.run_id.clone();
        let task = tokio::spawn(async move { run(&g, &*s, &*h, &c, RECOVER).await });
        tokio::time::timeout(Duration::from_secs(30), host.entered.notified()).await.expect("the run reached node b");

        let page = recovery_candidates(&*store, None, 100).await.unwrap();
        let seen: Vec<(String, String, Option<String>)> = page
            .iter()
            .map(|c| {
                (c.thread.thread_id.clone(), c.thread.user_id.clone(), c.holder.as_ref().map(|h| h.holder.clone()))
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("elsewhere".to_string(), "owner".to_string(), Some("remote-run".to_string())),
                ("expired".into(), "owner".into(), None),
                ("free".into(), "owner".into(), None),
                ("here".into(), "owner".into(), Some(held_run.clone())),
            ],
            "{name}"
        );
        host.release.notify_one();
        let out = tokio::time::timeout(Duration::from_secs(30), task).await.expect("run finished").unwrap().unwrap();
        assert_eq!(out.exec.status, ExecStatus::Completed, "{name}");
        // Finished: off the list.
        let ids: Vec<String> =
            recovery_candidates(&*store, None, 100).await.unwrap().into_iter().map(|c| c.thread.thread_id).collect();
        assert_eq!(ids, ["elsewhere", "expired", "free"], "{name}");
    }
}
