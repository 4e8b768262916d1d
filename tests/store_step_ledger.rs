//! `put_step_with_ledger` on every backend: a tool node's last ledger rows and its step in one
//! transaction. Both or neither: a refused step (stale version, superseded lease, another user's
//! thread) leaves no row either; the rows keep the ledger's rules (first result wins, a result
//! replaces an intent).

mod common;

use common::stores::backends;
use serde_json::{Value, json};
use tenxgraph::store::{
    LeaseAttempt, LeaseRequest, LedgerRow, StepWrite, StoreError, StoredMessage, ThreadRef, shared_json,
};

fn msg(id: &str) -> StoredMessage {
    StoredMessage::new(id, &json!({"message_id": id, "role": "tool", "content": [{"type": "text", "text": id}]}))
}

fn step<'a>(expected: i64, state: &'a Value, msgs: &'a [StoredMessage]) -> StepWrite<'a> {
    let (state_text, mark) = common::state_text(state);
    StepWrite {
        expected_version: expected,
        state: state_text,
        mark,
        new_messages: msgs,
        replace_messages: false,
        fence: None,
        release_lease: false,
        in_tx: None,
        previous_mark: None,
        expected_mark: None,
    }
}

/// Ledger rows as the stores take them (the values as shared text).
fn ledger_rows(r: &[(String, Value)]) -> Vec<LedgerRow> {
    r.iter().map(|(k, v)| (k.clone(), shared_json(v))).collect()
}

fn result(v: &str) -> Value {
    json!({"__kind__": "raw", "value": v})
}

fn lease(holder: &str, steal: Option<i64>) -> LeaseRequest {
    LeaseRequest {
        holder: holder.into(),
        host: "h".into(),
        pid: 1,
        pid_start: 0,
        ttl: std::time::Duration::from_secs(60),
        steal,
        user_id: None,
        owner_scoped: false,
    }
}

fn token(a: LeaseAttempt) -> i64 {
    match a {
        LeaseAttempt::Acquired { token } => token,
        other => panic!("lease not acquired: {other:?}"),
    }
}

#[tokio::test]
async fn rows_and_step_commit_together_and_keep_the_ledger_rules() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let t = ThreadRef::new(format!("sl:{name}"), "u");
        let st = json!({"n": 1});
        s.put_step(&t, step(0, &st, &[msg(&format!("{name}-a"))])).await.unwrap();
        // (LazyStore answers for its backend once that is open.)
        assert!(s.joins_ledger_to_step(), "{name}: a native backend joins the rows to the step");
        // An intent of an earlier attempt, and a result already recorded: the step's rows replace
        // the first and leave the second.
        let started = json!({"__kind__": "started", "tool": "t"});
        s.ledger_put_many(&t, &ledger_rows(&[("m:1".into(), started), ("m:2".into(), result("first"))]), None)
            .await
            .unwrap();
        let rows = vec![
            ("m:1".to_owned(), result("one")),
            ("m:2".to_owned(), result("second")),
            ("m:3".to_owned(), result("three")),
        ];
        let st2 = json!({"n": 2});
        let ms = [msg(&format!("{name}-b"))];
        assert_eq!(s.put_step_with_ledger(&t, step(1, &st2, &ms), &ledger_rows(&rows)).await.unwrap(), 2, "{name}");
        let got = s.ledger_get(&t, &["m:1".into(), "m:2".into(), "m:3".into()]).await.unwrap();
        assert_eq!(got["m:1"], result("one"), "{name}");
        assert_eq!(got["m:2"], result("first"), "{name}: the first result wins");
        assert_eq!(got["m:3"], result("three"), "{name}");
        let cp = s.load(&t).await.unwrap().unwrap();
        assert_eq!((cp.version, &cp.state), (2, &st2), "{name}");
        assert_eq!(s.list_messages(&t, None, None, None).await.unwrap().len(), 2, "{name}");
    }
}

#[tokio::test]
async fn a_stale_step_writes_none_of_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let t = ThreadRef::new(format!("stale:{name}"), "u");
        let st = json!({"n": 1});
        s.put_step(&t, step(0, &st, &[])).await.unwrap();
        s.put_step(&t, step(1, &st, &[])).await.unwrap();
        let rows = vec![("m:x".to_owned(), result("x"))];
        let ms = [msg(&format!("{name}-stale"))];
        match s.put_step_with_ledger(&t, step(1, &st, &ms), &ledger_rows(&rows)).await {
            Err(StoreError::Stale { expected: 1, current: 2, .. }) => {}
            other => panic!("{name}: expected Stale, got {other:?}"),
        }
        assert!(s.ledger_get(&t, &["m:x".into()]).await.unwrap().is_empty(), "{name}: a row of a refused step");
        assert!(s.list_messages(&t, None, None, None).await.unwrap().is_empty(), "{name}");
        assert_eq!(s.load(&t).await.unwrap().unwrap().version, 2, "{name}");
    }
}

#[tokio::test]
async fn a_superseded_lease_writes_neither_and_the_last_step_releases_after_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let tid = format!("fence:{name}");
        let t = ThreadRef::new(&tid, "u");
        let st = json!({"n": 1});
        let old = token(s.lease_acquire(&tid, &lease("old", None)).await.unwrap());
        s.put_step(&t, StepWrite { fence: Some(old), ..step(0, &st, &[]) }).await.unwrap();
        let new = token(s.lease_acquire(&tid, &lease("new", Some(old))).await.unwrap());
        let rows = vec![("m:f".to_owned(), result("late"))];
        let w = StepWrite { fence: Some(old), ..step(1, &st, &[]) };
        assert!(
            matches!(s.put_step_with_ledger(&t, w, &ledger_rows(&rows)).await, Err(StoreError::Fenced { .. })),
            "{name}"
        );
        assert!(s.ledger_get(&t, &["m:f".into()]).await.unwrap().is_empty(), "{name}");
        // The holder's last commit: its rows go in although the same transaction frees the lease.
        let w = StepWrite { fence: Some(new), release_lease: true, ..step(1, &st, &[]) };
        assert_eq!(s.put_step_with_ledger(&t, w, &ledger_rows(&rows)).await.unwrap(), 2, "{name}");
        assert_eq!(s.ledger_get(&t, &["m:f".into()]).await.unwrap()["m:f"], result("late"), "{name}");
        assert!(s.lease_get(&tid).await.unwrap().unwrap().released, "{name}");
    }
}

#[tokio::test]
async fn another_users_thread_gets_neither_under_isolation() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, true).await {
        let alice = ThreadRef::new(format!("iso:{name}"), "alice");
        let st = json!({"n": 1});
        s.put_step(&alice, step(0, &st, &[])).await.unwrap();
        let mallory = ThreadRef::new(format!("iso:{name}"), "mallory");
        let rows = vec![("m:i".to_owned(), result("m"))];
        let err = s.put_step_with_ledger(&mallory, step(1, &st, &[]), &ledger_rows(&rows)).await.unwrap_err();
        assert!(matches!(err, StoreError::Forbidden { .. }), "{name}: {err:?}");
        assert!(s.ledger_get(&alice, &["m:i".into()]).await.unwrap().is_empty(), "{name}");
        assert_eq!(s.load(&alice).await.unwrap().unwrap().version, 1, "{name}");
    }
}
