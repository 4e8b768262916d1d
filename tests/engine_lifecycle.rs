//! The loop's lifecycle points (10xGraph's graph lifecycle hooks), in the order the engine calls
//! them, with a Rust host that records them: the order is the engine's, on every path.

use async_trait::async_trait;
use serde_json::json;
use std::sync::Mutex;
use tenxgraph::engine::{
    BoxError, END, EdgeSpec, EngineError, ExecMeta, ExecStatus, GraphSpec, HostFailure, Lifecycle, MsgCursor, NodeHost,
    NodeOutput, RouteValue, RunConfig, RunInput, START, Snapshot, Stored, run,
};
use tenxgraph::store::{Checkpointer, MemoryStore, StoredMessage, ThreadRef};

#[derive(Debug)]
struct Boom;
impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ValueError: boom")
    }
}
impl std::error::Error for Boom {}

#[derive(Default)]
struct Host {
    messages: Mutex<Vec<StoredMessage>>,
    points: Mutex<Vec<String>>,
    fail: Option<&'static str>,
    /// What the host answers at `Lifecycle::Error` (a hook's replacement error message).
    error_message: Option<&'static str>,
}

impl Host {
    fn points(&self) -> Vec<String> {
        self.points.lock().unwrap().clone()
    }
}

#[async_trait]
impl NodeHost for Host {
    async fn prepare(&self, _stored: Stored<'_>, _exec: &ExecMeta) -> Result<MsgCursor, EngineError> {
        self.messages.lock().unwrap().push(StoredMessage::new("in", &json!({"id": "in"})));
        Ok(MsgCursor::default())
    }

    async fn run_node(&self, node: &str, exec: &ExecMeta) -> Result<NodeOutput, HostFailure> {
        if self.fail == Some(node) {
            return Err(HostFailure::Raised {
                error_type: "ValueError".into(),
                message: "boom".into(),
                cause: Box::new(Boom),
            });
        }
        let id = format!("{node}-{}", exec.step);
        self.messages.lock().unwrap().push(StoredMessage::new(id.clone(), &json!({"id": id})));
        Ok(NodeOutput::default())
    }

    fn eval_condition(&self, _index: usize) -> Result<RouteValue, BoxError> {
        Ok(RouteValue::Str(END.into()))
    }

    fn snapshot(&self, exec: &ExecMeta, cursor: &MsgCursor) -> Result<Snapshot, EngineError> {
        let messages = self.messages.lock().unwrap();
        Ok(Snapshot {
            state: json!({"execution_meta": exec}).to_string(),
            new_messages: messages[cursor.len..].to_vec(),
            replace_messages: false,
            cursor: MsgCursor { len: messages.len(), last_id: messages.last().map(|m| m.id.clone()) },
        })
    }

    async fn lifecycle(&self, point: Lifecycle<'_>, _exec: &ExecMeta) -> Option<String> {
        let (name, node, kind) = point.parts();
        let entry = [Some(name), node, kind].into_iter().flatten().collect::<Vec<_>>().join(":");
        self.points.lock().unwrap().push(entry);
        if point == Lifecycle::Error { self.error_message.map(str::to_owned) } else { None }
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

const NEW: RunInput = RunInput { has_messages: true, has_state_update: false, start_node: None, resume_only: false };
const RESUME: RunInput =
    RunInput { has_messages: false, has_state_update: false, start_node: None, resume_only: false };

fn cfg(thread: &str) -> RunConfig {
    RunConfig::new(ThreadRef::new(thread, "u"))
}

#[tokio::test]
async fn a_completed_run_calls_start_each_node_end_and_a_checkpoint_before_each_commit() {
    let store = MemoryStore::new(false);
    let host = Host::default();
    let out = run(&linear(&["a", "b"]), &store, &host, &cfg("t"), NEW).await.unwrap();
    assert_eq!(out.exec.status, ExecStatus::Completed);
    assert_eq!(host.points(), ["start", "checkpoint", "node_done:a", "checkpoint", "node_done:b", "end", "checkpoint"]);
}

#[tokio::test]
async fn pauses_call_interrupt_with_their_kind_before_the_pause_is_committed() {
    let store = MemoryStore::new(false);
    let mut g = linear(&["a", "b", "c"]);
    g.interrupt_before = vec!["b".into()];
    g.interrupt_after = vec!["c".into()];
    let host = Host::default();
    run(&g, &store, &host, &cfg("p"), NEW).await.unwrap();
    assert_eq!(host.points(), ["start", "checkpoint", "node_done:a", "checkpoint", "interrupt:b:before", "checkpoint"]);
    let host = Host::default();
    run(&g, &store, &host, &cfg("p"), RESUME).await.unwrap();
    assert_eq!(
        host.points(),
        ["start", "checkpoint", "node_done:b", "checkpoint", "node_done:c", "interrupt:c:after", "checkpoint"]
    );
}

#[tokio::test]
async fn a_failure_calls_error_and_the_message_it_returns_is_persisted() {
    let store = MemoryStore::new(false);
    let host = Host { fail: Some("b"), error_message: Some("hooked"), ..Default::default() };
    let err = run(&linear(&["a", "b"]), &store, &host, &cfg("f"), NEW).await.unwrap_err();
    // The caller still gets the node's error; the stored error text is the hook's.
    assert!(matches!(err, EngineError::Node { code: "NODE_001", .. }), "{err:?}");
    assert_eq!(host.points(), ["start", "checkpoint", "node_done:a", "checkpoint", "error", "checkpoint"]);
    let cp = store.load(&ThreadRef::new("f", "u")).await.unwrap().unwrap();
    assert_eq!(cp.state["execution_meta"]["status"], "error");
    assert_eq!(cp.state["execution_meta"]["error"], "hooked");
}
