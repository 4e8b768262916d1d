//! The loop driven by Rust closures instead of Python: routing, commits, limits, timeouts, stop,
//! static interrupts, and resuming a run that died mid-node.

mod common;

use async_trait::async_trait;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tenxgraph::engine::{
    BoxError, END, EdgeSpec, EngineError, ExecMeta, ExecStatus, GraphSpec, HostFailure, MsgCursor, NodeHost,
    NodeOutput, OnBusy, RouteValue, RunConfig, RunInput, START, STOP_NAMESPACE, Snapshot, StopSignals, Stored,
    release_abandoned, run, run_shared, stop_key,
};
use tenxgraph::store::{Checkpointer, MemoryStore, SqliteStore, StoredMessage, ThreadRef};

#[derive(Clone, Copy)]
enum Behave {
    Say,
    Fail,
    Hang,
    Sleep(u64),
    Goto(&'static str),
    Pause,
}

#[derive(Default)]
struct Live {
    counter: i64,
    messages: Vec<StoredMessage>,
}

struct TestHost {
    live: Mutex<Live>,
    input: Vec<StoredMessage>,
    nodes: HashMap<&'static str, Behave>,
    /// Condition 0 routes "loop" while counter < limit, then END.
    loop_until: i64,
    calls: Mutex<Vec<String>>,
    hang_dropped: Arc<AtomicBool>,
}

impl TestHost {
    fn new(nodes: &[(&'static str, Behave)], input: &[&str]) -> Self {
        TestHost {
            live: Mutex::default(),
            input: input
                .iter()
                .map(|t| {
                    StoredMessage::new(format!("in-{t}"), &json!({"id": format!("in-{t}"), "role": "user", "text": t}))
                })
                .collect(),
            nodes: nodes.iter().copied().collect(),
            loop_until: 3,
            calls: Mutex::default(),
            hang_dropped: Arc::new(AtomicBool::new(false)),
        }
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct Boom;
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ValueError: boom")
    }
}
impl std::error::Error for Boom {}

#[async_trait]
impl NodeHost for TestHost {
    async fn prepare(&self, stored: Stored<'_>, _exec: &ExecMeta) -> Result<MsgCursor, EngineError> {
        let mut live = self.live.lock().unwrap();
        let mut cursor = MsgCursor::default();
        if let Stored::Loaded { state, messages: msgs } = stored {
            live.counter = state["counter"].as_i64().unwrap_or(0);
            live.messages = msgs
                .iter()
                .map(|m| {
                    let m: Value = serde_json::from_str(m.get()).unwrap();
                    StoredMessage::new(m["id"].as_str().unwrap(), &m)
                })
                .collect();
            cursor = MsgCursor { len: msgs.len(), last_id: live.messages.last().map(|m| m.id.clone()) };
        }
        live.messages.extend(self.input.iter().cloned());
        Ok(cursor)
    }

    async fn run_node(&self, node: &str, exec: &ExecMeta) -> Result<NodeOutput, HostFailure> {
        self.calls.lock().unwrap().push(node.to_owned());
        let behave = self.nodes[node];
        match behave {
            Behave::Fail => {
                return Err(HostFailure::Raised {
                    error_type: "ValueError".into(),
                    message: "boom".into(),
                    cause: Box::new(Boom),
                });
            }
            Behave::Hang => {
                let _flag = DropFlag(self.hang_dropped.clone());
                std::future::pending::<()>().await;
            }
            Behave::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Behave::Say | Behave::Goto(_) | Behave::Pause => {}
        }
        let mut live = self.live.lock().unwrap();
        live.counter += 1;
        let id = format!("{node}-{}", exec.step);
        live.messages.push(StoredMessage::new(id.clone(), &json!({"id": id, "role": "assistant", "node": node})));
        let pause = matches!(behave, Behave::Pause).then(|| "remote_tool_call".to_owned());
        Ok(NodeOutput { goto: if let Behave::Goto(g) = behave { Some(g.into()) } else { None }, pause })
    }

    fn eval_condition(&self, _index: usize) -> Result<RouteValue, BoxError> {
        let live = self.live.lock().unwrap();
        Ok(RouteValue::Str(if live.counter < self.loop_until { "a".into() } else { END.into() }))
    }

    fn snapshot(&self, exec: &ExecMeta, cursor: &MsgCursor) -> Result<Snapshot, EngineError> {
        let live = self.live.lock().unwrap();
        let new_messages = live.messages[cursor.len..].to_vec();
        Ok(Snapshot {
            state: json!({"counter": live.counter, "execution_meta": exec}).to_string(),
            new_messages,
            replace_messages: false,
            cursor: MsgCursor { len: live.messages.len(), last_id: live.messages.last().map(|m| m.id.clone()) },
        })
    }
}

fn linear(nodes: &[&str]) -> GraphSpec {
    let mut edges = vec![EdgeSpec::fixed(START, nodes[0])];
    for w in nodes.windows(2) {
        edges.push(EdgeSpec::fixed(w[0], w[1]));
    }
    edges.push(EdgeSpec::fixed(nodes[nodes.len() - 1], END));
    GraphSpec {
        nodes: nodes.iter().map(|s| s.to_string()).collect(),
        edges,
        entry: Some(nodes[0].into()),
        ..Default::default()
    }
}

fn cfg(thread: &str) -> RunConfig {
    RunConfig::new(ThreadRef::new(thread, "u"))
}

const NEW: RunInput = RunInput { has_messages: true, has_state_update: false, start_node: None, resume_only: false };
const RESUME: RunInput =
    RunInput { has_messages: false, has_state_update: false, start_node: None, resume_only: false };

/// Returns once a run holds the thread's lease: a second run started after a fixed sleep found
/// the thread free on a loaded machine and went first (`4 2`, session 40).
async fn until_held(store: &dyn Checkpointer, thread_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !store.lease_get(thread_id).await.unwrap().is_some_and(|l| l.is_live()) {
        assert!(Instant::now() < deadline, "no run took the lease of {thread_id}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn stores() -> Vec<Arc<dyn Checkpointer>> {
    let sqlite = SqliteStore::open(":memory:", false, false).await.unwrap();
    sqlite.setup().await.unwrap();
    let mut all: Vec<Arc<dyn Checkpointer>> = vec![Arc::new(MemoryStore::new(false)), Arc::new(sqlite)];
    // Postgres too when scripts/test.sh provides one.
    if let Some(dsn) = common::pg_dsn() {
        let opts = tenxgraph::store::PgOptions {
            schema: format!("e_{}", uuid::Uuid::new_v4().simple()),
            ..Default::default()
        };
        all.push(Arc::new(tenxgraph::store::PgStore::connect(&dsn, None, opts).await.expect("test Postgres")));
    }
    all
}

#[tokio::test]
async fn a_linear_graph_commits_input_and_every_node() {
    for store in stores().await {
        let g = linear(&["a", "b", "c"]);
        let host = TestHost::new(&[("a", Behave::Say), ("b", Behave::Say), ("c", Behave::Say)], &["hi"]);
        let out = run(&g, &*store, &host, &cfg("t1"), NEW).await.unwrap();
        assert_eq!(out.exec.status, ExecStatus::Completed);
        assert_eq!(out.exec.step, 3);
        // input commit + one per node (the last node's commit is the completed one)
        assert_eq!(out.version, 4);
        let cp = store.load(&ThreadRef::new("t1", "u")).await.unwrap().unwrap();
        let msgs = cp.message_values().unwrap();
        let ids: Vec<&str> = msgs.iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["in-hi", "a-0", "b-1", "c-2"]);
        // A completed thread names the last node that ran, as 10xGraph's does.
        assert_eq!(cp.state["execution_meta"]["current_node"], "c");
    }
}

#[tokio::test]
async fn a_fresh_thread_without_messages_is_rejected() {
    let store = MemoryStore::new(false);
    let g = linear(&["a"]);
    let host = TestHost::new(&[("a", Behave::Say)], &[]);
    let err = run(&g, &store, &host, &cfg("t"), RESUME).await.unwrap_err();
    assert!(matches!(err, EngineError::InvalidInput(ref m) if m.contains("must contain 'messages'")), "{err:?}");
    assert!(host.calls().is_empty());
}

#[tokio::test]
async fn conditional_loop_and_recursion_limit() {
    let mut g = linear(&["a"]);
    g.edges.retain(|e| e.from != "a");
    g.edges.push(EdgeSpec { from: "a".into(), to: String::new(), condition: Some(0), condition_result: None });
    let store = MemoryStore::new(false);
    let host = TestHost::new(&[("a", Behave::Say)], &["x"]);
    let out = run(&g, &store, &host, &cfg("loop"), NEW).await.unwrap();
    assert_eq!(host.calls(), ["a", "a", "a"]);
    assert_eq!(out.exec.status, ExecStatus::Completed);

    let mut host = TestHost::new(&[("a", Behave::Say)], &["x"]);
    host.loop_until = 100;
    let mut c = cfg("limit");
    c.recursion_limit = 4;
    let err = run(&g, &store, &host, &c, NEW).await.unwrap_err();
    assert!(matches!(err, EngineError::Recursion { limit: 4, step: 4, .. }), "{err:?}");
    let cp = store.load(&ThreadRef::new("limit", "u")).await.unwrap().unwrap();
    assert_eq!(cp.state["execution_meta"]["status"], "error");
    // A new run gets a fresh step budget instead of completing at once (10xGraph's quirk).
    let mut host2 = TestHost::new(&[("a", Behave::Say)], &["again"]);
    host2.loop_until = 100;
    let err = run(&g, &store, &host2, &c, NEW).await.unwrap_err();
    assert!(matches!(err, EngineError::Recursion { .. }));
    assert_eq!(host2.calls().len(), 4);
}

#[tokio::test]
async fn a_failing_node_is_wrapped_and_recorded() {
    let store = MemoryStore::new(false);
    let g = linear(&["a", "bad"]);
    let host = TestHost::new(&[("a", Behave::Say), ("bad", Behave::Fail)], &["x"]);
    let err = run(&g, &store, &host, &cfg("f"), NEW).await.unwrap_err();
    match &err {
        EngineError::Node { code, message, context, cause } => {
            assert_eq!(*code, "NODE_001");
            assert!(message.contains("Error in node 'bad': boom"), "{message}");
            assert_eq!(context["node_name"], "bad");
            assert_eq!(context["error_type"], "ValueError");
            assert!(cause.is_some());
        }
        other => panic!("{other:?}"),
    }
    let cp = store.load(&ThreadRef::new("f", "u")).await.unwrap().unwrap();
    assert_eq!(cp.state["execution_meta"]["status"], "error");
    assert_eq!(cp.state["execution_meta"]["current_node"], "bad");
    // Retrying re-runs the failed node, not the one before it.
    let host2 = TestHost::new(&[("a", Behave::Say), ("bad", Behave::Say)], &[]);
    run(&g, &store, &host2, &cfg("f"), RESUME).await.unwrap();
    assert_eq!(host2.calls(), ["bad"]);
}

#[tokio::test]
async fn unknown_route_target_is_a_graph_error() {
    let store = MemoryStore::new(false);
    let g = linear(&["a"]);
    let host = TestHost::new(&[("a", Behave::Goto("nowhere"))], &["x"]);
    let err = run(&g, &store, &host, &cfg("r"), NEW).await.unwrap_err();
    assert!(matches!(err, EngineError::Graph { code: "GRAPH_ROUTING_002", .. }), "{err:?}");
}

#[tokio::test]
async fn node_timeout_cancels_the_node() {
    let store = MemoryStore::new(false);
    let g = linear(&["slow"]);
    let host = TestHost::new(&[("slow", Behave::Hang)], &["x"]);
    let mut c = cfg("to");
    c.node_timeout = Some(Duration::from_millis(100));
    let err = run(&g, &store, &host, &c, NEW).await.unwrap_err();
    assert!(matches!(err, EngineError::NodeTimeout { .. }), "{err:?}");
    assert!(host.hang_dropped.load(Ordering::SeqCst), "the node's future must be dropped");
}

#[tokio::test]
async fn stop_ends_a_hung_node_quickly_and_resume_reruns_it() {
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryStore::new(false));
    let g = linear(&["a", "hang", "c"]);
    let host = Arc::new(TestHost::new(&[("a", Behave::Say), ("hang", Behave::Hang), ("c", Behave::Say)], &["x"]));
    let mut c = cfg("stop");
    c.node_timeout = None;
    c.stop_poll = Duration::from_secs(30); // the in-process signal must do it, not the poll
    let (s2, h2, c2, g2) = (store.clone(), host.clone(), c.clone(), g.clone());
    let task = tokio::spawn(async move { run(&g2, &*s2, &*h2, &c2, NEW).await });
    while host.calls().len() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t0 = Instant::now();
    let key = stop_key("stop", "u");
    store.cache_put(STOP_NAMESPACE, &key, &json!(true), Some(3600.0)).await.unwrap();
    StopSignals::global().signal(&key);
    let out = task.await.unwrap().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "stop took {:?}", t0.elapsed());
    assert!(out.stopped);
    assert_eq!(out.exec.status, ExecStatus::InterruptedAfter);
    assert_eq!(out.exec.interrupt_reason.as_deref(), Some("stop_requested"));
    assert!(host.hang_dropped.load(Ordering::SeqCst));
    assert_eq!(store.cache_get(STOP_NAMESPACE, &key).await.unwrap(), None, "the request is consumed");
    let host2 = TestHost::new(&[("a", Behave::Say), ("hang", Behave::Say), ("c", Behave::Say)], &[]);
    let out = run(&g, &*store, &host2, &c, RESUME).await.unwrap();
    assert_eq!(host2.calls(), ["hang", "c"]);
    assert_eq!(out.exec.status, ExecStatus::Completed);
}

#[tokio::test]
async fn a_shared_run_dropped_mid_node_releases_its_lease_once_its_host_is_done() {
    for store in stores().await {
        let g = linear(&["a", "b"]);
        let host = TestHost::new(&[("a", Behave::Say), ("b", Behave::Hang)], &["x"]);
        // Dropped while "b" is in flight, as a caller's cancel drops it.
        let c = cfg("shared");
        let r = tokio::time::timeout(Duration::from_millis(200), run_shared(&g, &store, &host, &c, NEW)).await;
        assert!(r.is_err());
        // Parked until the host has written what the run left (its late ledger rows).
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!store.lease_get("shared").await.unwrap().expect("the run took the lease").released);
        release_abandoned("shared", &c.run_id, None);
        let deadline = Instant::now() + Duration::from_secs(10); // the lease's 30 s are far off
        loop {
            let lease = store.lease_get("shared").await.unwrap().expect("the run took the lease");
            if lease.released {
                break;
            }
            assert!(Instant::now() < deadline, "the dropped run's lease is still held: {lease:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A caller that lends the store cannot hand it to a task: the lease waits for its expiry.
        // (Other node names: a node's message ids are its name and a count, unique per store.)
        let lent = linear(&["p", "q"]);
        let host = TestHost::new(&[("p", Behave::Say), ("q", Behave::Hang)], &["y"]);
        let r = tokio::time::timeout(Duration::from_millis(200), run(&lent, &*store, &host, &cfg("lent"), NEW)).await;
        assert!(r.is_err(), "{:?}", r.as_ref().map(|o| o.as_ref().map(|o| o.exec.status).ok()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!store.lease_get("lent").await.unwrap().expect("the run took the lease").released);
        // The released thread resumes at the node in flight.
        let host2 = TestHost::new(&[("a", Behave::Say), ("b", Behave::Say)], &[]);
        let out = run_shared(&g, &store, &host2, &cfg("shared"), RESUME).await.unwrap();
        assert_eq!(host2.calls(), ["b"]);
        assert_eq!(out.exec.status, ExecStatus::Completed);
    }
}

/// A dropped run's parked lease is renewed as its run renewed it while its host writes: unrenewed,
/// it expired under the late writes (the default `lease_ttl` is 5 s, the host's unwinding up to
/// 5 s) and another process took the thread before them.
#[tokio::test]
async fn a_parked_lease_is_kept_renewed_until_its_host_is_done() {
    for store in stores().await {
        let g = linear(&["a", "b"]);
        let host = TestHost::new(&[("a", Behave::Say), ("b", Behave::Hang)], &["x"]);
        let mut c = cfg("renewed");
        c.lease.ttl = Duration::from_millis(1500);
        let r = tokio::time::timeout(Duration::from_millis(200), run_shared(&g, &store, &host, &c, NEW)).await;
        assert!(r.is_err());
        // Over two of its lifetimes: renewed every 0.5 s, it has a second left at any moment.
        tokio::time::sleep(Duration::from_millis(3200)).await;
        let lease = store.lease_get("renewed").await.unwrap().expect("the run took the lease");
        assert!(lease.is_live(), "the parked lease expired under its host's late writes: {lease:?}");
        release_abandoned("renewed", &c.run_id, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !store.lease_get("renewed").await.unwrap().expect("the lease row").released {
            assert!(Instant::now() < deadline, "the released parked lease is still held");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A run dropped after the store granted its lease but before it held a `Lease` (here: held at
/// the `after_lease` failpoint) leaves no lease to park: the row was held for every other process
/// until it expired. It is released within a few seconds.
#[tokio::test]
async fn a_run_dropped_while_taking_its_lease_does_not_leave_it_held() {
    use tenxgraph::failpoints::{Armed, Failpoints};
    for store in stores().await {
        let g = linear(&["a"]);
        let host = TestHost::new(&[("a", Behave::Say)], &["x"]);
        let mut c = cfg("taking");
        c.lease.ttl = Duration::from_secs(120);
        c.failpoints = Armed::new(None, Some(Arc::new(Failpoints::parse("after_lease=delay(60000)").unwrap())));
        // Driven until the store has granted the lease, then dropped (a fixed 300 ms failed on a
        // loaded machine before the grant). Boxed: dropping a pinned local does not drop it.
        let mut run = Box::pin(run_shared(&g, &store, &host, &c, NEW));
        let granted = Instant::now() + Duration::from_secs(20);
        loop {
            tokio::select! {
                _ = &mut run => panic!("the run ended inside its failpoint's 60 s delay"),
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            if store.lease_get("taking").await.unwrap().is_some_and(|l| l.is_live()) {
                break;
            }
            assert!(Instant::now() < granted, "the store never granted the lease");
        }
        drop(run);
        let deadline = Instant::now() + Duration::from_secs(20); // the lease's 120 s are far off
        // (A thread with nothing written loses its released row.)
        while store.lease_get("taking").await.unwrap().is_some_and(|l| l.is_live()) {
            assert!(Instant::now() < deadline, "the lease of a run dropped while taking it is still held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The caller's own retry, started the moment its cancel returned (`on_busy` "reject", the
/// default), waits for the dropped run's host rather than be refused by it, and does not start
/// before it: the host is still writing the results of tools that returned before the drop.
#[tokio::test]
async fn a_retry_in_the_same_process_waits_for_a_dropped_runs_host() {
    for store in stores().await {
        let g = linear(&["a", "b"]);
        let host = TestHost::new(&[("a", Behave::Say), ("b", Behave::Hang)], &["x"]);
        let c = cfg("settle");
        let r = tokio::time::timeout(Duration::from_millis(200), run_shared(&g, &store, &host, &c, NEW)).await;
        assert!(r.is_err());
        let host2 = TestHost::new(&[("a", Behave::Say), ("b", Behave::Say)], &[]);
        let retry_cfg = cfg("settle");
        let retry = run_shared(&g, &store, &host2, &retry_cfg, RESUME);
        tokio::pin!(retry);
        let early = tokio::time::timeout(Duration::from_millis(300), &mut retry).await;
        assert!(early.is_err(), "the retry did not wait for the dropped run's host");
        assert!(host2.calls().is_empty());
        release_abandoned("settle", &c.run_id, None);
        let out = tokio::time::timeout(Duration::from_secs(20), retry)
            .await
            .expect("the retry went on once the host was done");
        assert_eq!(out.unwrap().exec.status, ExecStatus::Completed);
        assert_eq!(host2.calls(), ["b"]);
    }
}

#[tokio::test]
async fn a_run_dropped_mid_node_resumes_at_that_node() {
    for store in stores().await {
        let g = linear(&["a", "b", "c"]);
        let host = TestHost::new(&[("a", Behave::Say), ("b", Behave::Hang), ("c", Behave::Say)], &["x"]);
        // Simulates a crash: the run future is dropped while "b" is in flight.
        let r = tokio::time::timeout(Duration::from_millis(200), run(&g, &*store, &host, &cfg("crash"), NEW)).await;
        assert!(r.is_err());
        let cp = store.load(&ThreadRef::new("crash", "u")).await.unwrap().unwrap();
        assert_eq!(cp.state["execution_meta"]["current_node"], "b");
        assert_eq!(cp.state["execution_meta"]["status"], "running");
        let host2 = TestHost::new(&[("a", Behave::Say), ("b", Behave::Say), ("c", Behave::Say)], &[]);
        let out = run(&g, &*store, &host2, &cfg("crash"), RESUME).await.unwrap();
        assert_eq!(host2.calls(), ["b", "c"], "completed node 'a' must not run again");
        assert_eq!(out.exec.status, ExecStatus::Completed);
        assert_eq!(out.exec.step, 3);
    }
}

#[tokio::test]
async fn interrupt_before_and_after_pause_and_resume_once() {
    let store = MemoryStore::new(false);
    let mut g = linear(&["a", "b", "c"]);
    g.interrupt_before = vec!["b".into()];
    g.interrupt_after = vec!["c".into()];
    let host = TestHost::new(&[("a", Behave::Say), ("b", Behave::Say), ("c", Behave::Say)], &["x"]);
    let out = run(&g, &store, &host, &cfg("hitl"), NEW).await.unwrap();
    assert_eq!(out.exec.status, ExecStatus::InterruptedBefore);
    assert_eq!(out.exec.current_node, "b");
    assert_eq!(host.calls(), ["a"]);
    let host2 = TestHost::new(&[("a", Behave::Say), ("b", Behave::Say), ("c", Behave::Say)], &[]);
    let out = run(&g, &store, &host2, &cfg("hitl"), RESUME).await.unwrap();
    assert_eq!(host2.calls(), ["b", "c"]);
    assert_eq!(out.exec.status, ExecStatus::InterruptedAfter);
    assert_eq!(out.exec.current_node, END);
    let host3 = TestHost::new(&[("a", Behave::Say), ("b", Behave::Say), ("c", Behave::Say)], &[]);
    let out = run(&g, &store, &host3, &cfg("hitl"), RESUME).await.unwrap();
    assert!(host3.calls().is_empty());
    assert_eq!(out.exec.status, ExecStatus::Completed);
    // Completed by the reviewer's "go on" without running anything: still the node that paused.
    assert_eq!(out.exec.current_node, "c");
    let stored = store.load(&ThreadRef::new("hitl", "u")).await.unwrap().unwrap();
    assert_eq!(stored.state["execution_meta"]["current_node"], "c");
}

#[tokio::test]
async fn new_input_while_a_run_is_unfinished_is_rejected_and_writes_nothing() {
    for store in stores().await {
        let g = linear(&["a"]);
        run(&g, &*store, &TestHost::new(&[("a", Behave::Say)], &["x"]), &cfg("two"), NEW).await.unwrap();
        let slow = TestHost::new(&[("a", Behave::Sleep(300))], &["slow"]);
        let fast = TestHost::new(&[("a", Behave::Say)], &["fast"]);
        let c = cfg("two");
        let (r_slow, r_fast) = tokio::join!(run(&g, &*store, &slow, &c, NEW), async {
            until_held(&*store, "two").await;
            run(&g, &*store, &fast, &c, NEW).await
        });
        r_slow.unwrap();
        let err = r_fast.unwrap_err();
        assert!(matches!(err, EngineError::LeaseBusy { waited, .. } if waited == 0.0), "{err:?}");
        assert!(fast.calls().is_empty(), "no node of the rejected run ran");
        let cp = store.load(&ThreadRef::new("two", "u")).await.unwrap().unwrap();
        let msgs = cp.message_values().unwrap();
        let ids: Vec<&str> = msgs.iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert!(ids.contains(&"in-slow") && !ids.contains(&"in-fast"), "{ids:?}");
        assert_eq!(cp.state["execution_meta"]["status"], "completed");
    }
}

#[tokio::test]
async fn on_busy_wait_runs_the_second_turn_after_the_first_and_times_out_when_asked() {
    for store in stores().await {
        let g = linear(&["a"]);
        let slow = TestHost::new(&[("a", Behave::Sleep(300))], &["slow"]);
        let fast = TestHost::new(&[("a", Behave::Say)], &["fast"]);
        let mut c = cfg("wait");
        c.lease.on_busy = OnBusy::Wait;
        let (r_slow, r_fast) = tokio::join!(run(&g, &*store, &slow, &c, NEW), async {
            until_held(&*store, "wait").await;
            run(&g, &*store, &fast, &c, NEW).await
        });
        let (v_slow, v_fast) = (r_slow.unwrap().version, r_fast.unwrap().version);
        assert!(v_fast > v_slow, "the waiting turn commits after the holder: {v_slow} {v_fast}");
        let cp = store.load(&ThreadRef::new("wait", "u")).await.unwrap().unwrap();
        let msgs = cp.message_values().unwrap();
        let ids: Vec<&str> = msgs.iter().map(|m| m["id"].as_str().unwrap()).collect();
        let (i_slow, i_fast) = (ids.iter().position(|i| *i == "in-slow"), ids.iter().position(|i| *i == "in-fast"));
        assert!(i_slow.unwrap() < i_fast.unwrap(), "{ids:?}");
        // A bounded wait gives up with the holder named and nothing run.
        let slow = TestHost::new(&[("a", Behave::Sleep(600))], &["slow2"]);
        let late = TestHost::new(&[("a", Behave::Say)], &["late"]);
        c.lease.busy_timeout = Duration::from_millis(150);
        let (r_slow, r_late) = tokio::join!(run(&g, &*store, &slow, &c, NEW), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            run(&g, &*store, &late, &c, NEW).await
        });
        r_slow.unwrap();
        let err = r_late.unwrap_err();
        assert!(matches!(err, EngineError::LeaseBusy { waited, .. } if waited >= 0.1), "{err:?}");
        assert!(late.calls().is_empty());
    }
}

#[tokio::test]
async fn graph_validation_codes() {
    let mut g = linear(&["a"]);
    g.entry = None;
    assert!(matches!(g.validate(), Err(EngineError::Graph { code: "GRAPH_002", .. })));
    let mut g = linear(&["a"]);
    g.nodes.push("orphan".into());
    assert!(matches!(g.validate(), Err(EngineError::Graph { code: "GRAPH_003", .. })));
    let mut g = linear(&["a"]);
    g.edges.push(EdgeSpec::fixed("a", "missing"));
    assert!(matches!(g.validate(), Err(EngineError::Graph { code: "GRAPH_004", .. })));
    let mut g = linear(&["a"]);
    g.interrupt_after = vec!["zzz".into()];
    assert!(matches!(g.validate(), Err(EngineError::Graph { code: "GRAPH_004", .. })));
    assert!(linear(&["a", "b"]).validate().is_ok());
}

#[tokio::test]
async fn a_node_that_pauses_is_committed_and_the_resume_routes_past_it() {
    for store in stores().await {
        let g = linear(&["a", "b", "c"]);
        let nodes = [("a", Behave::Say), ("b", Behave::Pause), ("c", Behave::Say)];
        let host = TestHost::new(&nodes, &["x"]);
        let out = run(&g, &*store, &host, &cfg("pause"), NEW).await.unwrap();
        assert_eq!(host.calls(), ["a", "b"]);
        assert_eq!(out.exec.status, ExecStatus::InterruptedAfter);
        assert_eq!(out.exec.current_node, "b"); // the next node is worked out on resume
        assert_eq!(out.exec.interrupt_reason.as_deref(), Some("remote_tool_call"));
        let stored = store.load(&ThreadRef::new("pause", "u")).await.unwrap().unwrap();
        assert_eq!(stored.state["counter"], 2); // b's step is committed with the pause
        let host2 = TestHost::new(&nodes, &["result"]);
        let out = run(&g, &*store, &host2, &cfg("pause"), NEW).await.unwrap();
        assert_eq!(host2.calls(), ["c"]); // b does not run again
        assert_eq!(out.exec.status, ExecStatus::Completed);
    }
}
