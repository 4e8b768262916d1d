//! The same contract checked on every backend: versioned steps, the ledger, messages, cache.

mod common;

use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tenxgraph::store::{
    ChangeMark, Checkpointer, KnownHead, LeaseAttempt, LeaseRequest, LedgerRow, MESSAGES_CHANGED, MemoryStore,
    PgOptions, PgStore, PruneRules, SqliteStore, StepWrite, StoreError, StoredMessage, ThreadRef, is_intent,
    set_write_mark, shared_json, write_mark,
};

use common::stores::pg;

/// Ledger rows as the stores take them (the values as shared text).
fn ledger_rows(r: &[(String, serde_json::Value)]) -> Vec<LedgerRow> {
    r.iter().map(|(k, v)| (k.clone(), shared_json(v))).collect()
}

fn msg(id: &str, text: &str) -> StoredMessage {
    StoredMessage::new(id, &json!({"message_id": id, "role": "user", "content": [{"type": "text", "text": text}]}))
}

async fn backends(dir: &tempfile::TempDir) -> Vec<(&'static str, Arc<dyn Checkpointer>)> {
    let path = dir.path().join("t.db");
    // The ttl rule as every backend has it; SQLite's grace past it is checked on its own below.
    let sqlite =
        SqliteStore::open(path.to_str().unwrap(), false, false).await.unwrap().with_lease_grace(Duration::ZERO);
    sqlite.setup().await.unwrap();
    let mem_sqlite = SqliteStore::open(":memory:", false, false).await.unwrap().with_lease_grace(Duration::ZERO);
    mem_sqlite.setup().await.unwrap();
    let mut all: Vec<(&'static str, Arc<dyn Checkpointer>)> = vec![
        ("memory", Arc::new(MemoryStore::new(false))),
        ("sqlite", Arc::new(sqlite)),
        ("sqlite-mem", Arc::new(mem_sqlite)),
    ];
    if let Some(p) = pg(false, false).await {
        all.push(("postgres", Arc::new(p)));
    }
    if let Some(p) = pg(false, true).await {
        all.push(("postgres+redis", Arc::new(p)));
    }
    all
}

fn step<'a>(expected: i64, state: &'a serde_json::Value, msgs: &'a [StoredMessage]) -> StepWrite<'a> {
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

#[tokio::test]
async fn versioned_steps_reject_a_stale_writer_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new("th", "u");
        let st1 = json!({"n": 1});
        assert_eq!(s.put_step(&t, step(0, &st1, &[msg("m1", "a")])).await.unwrap(), 1, "{name}");
        // Two writers both read version 1; the first commits, the second is stale.
        let st2 = json!({"n": 2});
        assert_eq!(s.put_step(&t, step(1, &st2, &[msg("m2", "b")])).await.unwrap(), 2, "{name}");
        let st3 = json!({"n": 3});
        let err = s.put_step(&t, step(1, &st3, &[msg("m3", "c")])).await.unwrap_err();
        match err {
            StoreError::Stale { expected, current, .. } => assert_eq!((expected, current), (1, 2), "{name}"),
            other => panic!("{name}: expected Stale, got {other:?}"),
        }
        let cp = s.load(&t).await.unwrap().unwrap();
        assert_eq!(cp.version, 2, "{name}");
        assert_eq!(cp.state, st2, "{name}");
        let msgs = cp.message_values().unwrap();
        let ids: Vec<&str> = msgs.iter().map(|m| m["message_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["m1", "m2"], "{name}: the stale step's message must not be stored");
    }
}

#[tokio::test]
async fn a_first_write_on_a_new_thread_is_versioned_too() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new("fresh", "u");
        let st = json!({});
        s.put_step(&t, step(0, &st, &[])).await.unwrap();
        assert!(matches!(s.put_step(&t, step(0, &st, &[])).await, Err(StoreError::Stale { .. })), "{name}");
    }
}

#[tokio::test]
async fn concurrent_writers_from_one_version_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new("race", "u");
        let st = json!({"n": 0});
        s.put_step(&t, step(0, &st, &[])).await.unwrap();
        let mut handles = vec![];
        for i in 0..8 {
            let s = s.clone();
            let t = t.clone();
            handles.push(tokio::spawn(async move {
                let st = json!({"writer": i});
                let m = [msg(&format!("w{i}"), "x")];
                s.put_step(&t, step(1, &st, &m)).await
            }));
        }
        let mut ok = 0;
        for h in handles {
            match h.await.unwrap() {
                Ok(v) => {
                    assert_eq!(v, 2);
                    ok += 1
                }
                Err(StoreError::Stale { .. }) => {}
                Err(e) => panic!("{name}: {e}"),
            }
        }
        assert_eq!(ok, 1, "{name}");
        assert_eq!(s.load(&t).await.unwrap().unwrap().messages.len(), 1, "{name}");
    }
}

#[tokio::test]
async fn replace_messages_rewrites_the_list_and_upserts_keep_order() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new("rw", "u");
        let st = json!({});
        s.put_step(&t, step(0, &st, &[msg("a", "1"), msg("b", "2")])).await.unwrap();
        // Upsert of an existing id keeps its position and takes the new content.
        s.put_messages(&t, &[msg("a", "1-edited"), msg("c", "3")], None).await.unwrap();
        let texts: Vec<String> = s
            .list_messages(&t, None, None, None)
            .await
            .unwrap()
            .iter()
            .map(|m| {
                serde_json::from_str::<serde_json::Value>(m.get()).unwrap()["content"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(texts, ["1-edited", "2", "3"], "{name}");
        let (state_text, mark) = common::state_text(&st);
        let w = StepWrite {
            expected_version: 1,
            state: state_text,
            mark,
            new_messages: &[msg("z", "only")],
            replace_messages: true,
            fence: None,
            release_lease: false,
            in_tx: None,
            previous_mark: None,
            expected_mark: None,
        };
        s.put_step(&t, w).await.unwrap();
        let cp = s.load(&t).await.unwrap().unwrap();
        assert_eq!(cp.messages.len(), 1, "{name}");
        assert_eq!(s.list_messages(&t, Some("only"), None, None).await.unwrap().len(), 1, "{name}");
        assert!(s.list_messages(&t, Some("absent"), None, None).await.unwrap().is_empty(), "{name}");
        assert_eq!(s.list_messages(&t, None, Some(0), Some(0)).await.unwrap().len(), 0, "{name}");
    }
}

#[tokio::test]
async fn ledger_keeps_the_first_result_and_goes_with_its_thread() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new("led", "u");
        let other = ThreadRef::new("other", "u");
        assert!(s.ledger_put(&t, "m1:call_1", &json!({"__kind__": "raw", "value": 1})).await.unwrap(), "{name}");
        assert!(!s.ledger_put(&t, "m1:call_1", &json!({"__kind__": "raw", "value": 2})).await.unwrap(), "{name}");
        let keys = vec!["m1:call_1".to_owned(), "m1:call_2".to_owned()];
        let got = s.ledger_get(&t, &keys).await.unwrap();
        assert_eq!(got.len(), 1, "{name}");
        assert_eq!(got["m1:call_1"]["value"], 1, "{name}: first result wins");
        assert!(s.ledger_get(&other, &keys).await.unwrap().is_empty(), "{name}: scoped to the thread");
        s.clean_thread(&t).await.unwrap();
        assert!(s.ledger_get(&t, &keys).await.unwrap().is_empty(), "{name}: rows go with the thread");
        assert!(s.get_thread(&t).await.unwrap().is_none(), "{name}");
    }
}

#[tokio::test]
async fn cache_expires_and_lists_keys() {
    let dir = tempfile::tempdir().unwrap();
    // A namespace of this run's own: the Redis cache is the test server's, shared with anything
    // else that ran against it (a key "k" of another run's "ns" failed the listing).
    let ns = format!("ns-{}", uuid::Uuid::new_v4().simple());
    let ns = ns.as_str();
    for (name, s) in backends(&dir).await {
        s.cache_put(ns, "k1", &json!(true), Some(0.2)).await.unwrap();
        s.cache_put(ns, "k2", &json!({"a": 1}), None).await.unwrap();
        s.cache_put("other", "k3", &json!(1), None).await.unwrap();
        assert_eq!(s.cache_keys(ns, None).await.unwrap(), ["k1", "k2"], "{name}");
        assert_eq!(s.cache_keys(ns, Some("k2")).await.unwrap(), ["k2"], "{name}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(s.cache_get(ns, "k1").await.unwrap(), None, "{name}: expired");
        assert_eq!(s.cache_get(ns, "k2").await.unwrap(), Some(json!({"a": 1})), "{name}");
        s.cache_clear(ns, "k2").await.unwrap();
        assert_eq!(s.cache_get(ns, "k2").await.unwrap(), None, "{name}");
    }
}

#[tokio::test]
async fn user_isolation_rejects_other_users_when_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("iso.db").to_str().unwrap(), true, false).await.unwrap();
    sqlite.setup().await.unwrap();
    let mut stores: Vec<(&str, Arc<dyn Checkpointer>)> =
        vec![("memory", Arc::new(MemoryStore::new(true))), ("sqlite", Arc::new(sqlite))];
    if let Some(p) = pg(true, false).await {
        stores.push(("postgres", Arc::new(p)));
    }
    for (name, s) in stores {
        let owner = ThreadRef::new("iso", "alice");
        let intruder = ThreadRef::new("iso", "mallory");
        let st = json!({});
        s.put_step(&owner, step(0, &st, &[msg("a", "secret")])).await.unwrap();
        assert!(matches!(s.put_step(&intruder, step(1, &st, &[])).await, Err(StoreError::Forbidden { .. })), "{name}");
        assert!(s.list_messages(&intruder, None, None, None).await.unwrap().is_empty(), "{name}");
        assert_eq!(s.thread_owner("iso").await.unwrap().as_deref(), Some("alice"), "{name}");
        assert_eq!(s.list_threads(Some("mallory"), None, None, None).await.unwrap().len(), 0, "{name}");
    }
}

#[tokio::test]
async fn another_user_reads_no_ledger_row_and_cannot_take_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("iso.db").to_str().unwrap(), true, false).await.unwrap();
    sqlite.setup().await.unwrap();
    let mut stores: Vec<(&str, Arc<dyn Checkpointer>)> =
        vec![("memory", Arc::new(MemoryStore::new(true))), ("sqlite", Arc::new(sqlite))];
    if let Some(p) = pg(true, false).await {
        stores.push(("postgres", Arc::new(p)));
    }
    for (name, s) in stores {
        let owner = ThreadRef::new("iso-lease", "alice");
        let intruder = ThreadRef::new("iso-lease", "mallory");
        let as_user =
            |holder: &str, user: &str| LeaseRequest { user_id: Some(user.into()), ..lease_req(holder, 60_000, None) };
        let token = acquired(s.lease_acquire(&owner.thread_id, &as_user("alice-run", "alice")).await.unwrap());
        s.put_step(&owner, step(0, &json!({}), &[])).await.unwrap();
        s.ledger_put(&owner, "m:c1", &json!({"v": "secret"})).await.unwrap();
        s.lease_release(&owner.thread_id, token).await.unwrap();
        let before = s.lease_get(&owner.thread_id).await.unwrap();
        assert!(s.ledger_get(&intruder, &["m:c1".to_owned()]).await.unwrap().is_empty(), "{name}");
        assert_eq!(s.ledger_get(&owner, &["m:c1".to_owned()]).await.unwrap().len(), 1, "{name}");
        let refused = s.lease_acquire(&intruder.thread_id, &as_user("mallory-run", "mallory")).await;
        assert!(matches!(refused, Err(StoreError::Forbidden { .. })), "{name}: {refused:?}");
        let after = s.lease_get(&owner.thread_id).await.unwrap();
        let fixed = |l: Option<tenxgraph::store::LeaseInfo>| l.map(|l| (l.token, l.holder, l.released));
        assert_eq!(fixed(after), fixed(before), "{name}: the refused take moved the lease row");
        assert!(!s.is_owner(&intruder).await.unwrap() && s.is_owner(&owner).await.unwrap(), "{name}");
        // A thread nobody owns yet: anyone may take its lease (the first write decides the owner).
        let fresh = acquired(s.lease_acquire("iso-new", &as_user("mallory-run", "mallory")).await.unwrap());
        assert!(fresh > token, "{name}: {fresh} after {token}");
        assert!(!s.is_owner(&ThreadRef::new("iso-new", "mallory")).await.unwrap(), "{name}");
    }
}

#[tokio::test]
async fn state_history_is_pruned_but_the_latest_stays() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new("hist", "u");
        for v in 0..30 {
            let st = json!({"v": v});
            s.put_step(&t, step(v, &st, &[])).await.unwrap();
        }
        let cp = s.load(&t).await.unwrap().unwrap();
        assert_eq!((cp.version, cp.state["v"].as_i64()), (30, Some(29)), "{name}");
    }
}

#[tokio::test]
async fn a_file_database_is_shared_by_two_handles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a = SqliteStore::open(path.to_str().unwrap(), false, true).await.unwrap();
    a.setup().await.unwrap();
    let b = SqliteStore::open(path.to_str().unwrap(), false, true).await.unwrap();
    b.setup().await.unwrap(); // migrations are idempotent
    let t = ThreadRef::new("x", "u");
    let st = json!({"from": "a"});
    a.put_step(&t, step(0, &st, &[msg("m", "hello")])).await.unwrap();
    let cp = b.load(&t).await.unwrap().unwrap();
    assert_eq!(cp.state, st);
    assert!(matches!(b.put_step(&t, step(0, &st, &[])).await, Err(StoreError::Stale { .. })));
}

#[tokio::test]
async fn ledger_batches_keep_first_results_and_count_inserts() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new("batch", "u");
        s.ledger_put(&t, "m:a", &json!({"__kind__": "raw", "value": "old"})).await.unwrap();
        let batch = vec![
            ("m:a".to_owned(), json!({"__kind__": "raw", "value": "new"})),
            ("m:b".to_owned(), json!({"__kind__": "raw", "value": "b1"})),
            ("m:b".to_owned(), json!({"__kind__": "raw", "value": "b2"})),
        ];
        assert_eq!(s.ledger_put_many(&t, &ledger_rows(&batch), None).await.unwrap(), 1, "{name}");
        let got = s.ledger_get(&t, &["m:a".into(), "m:b".into()]).await.unwrap();
        assert_eq!((got["m:a"]["value"].as_str(), got["m:b"]["value"].as_str()), (Some("old"), Some("b1")), "{name}");
    }
}

fn lease_req(holder: &str, ttl_ms: u64, steal: Option<i64>) -> LeaseRequest {
    LeaseRequest {
        holder: holder.into(),
        host: "test-host".into(),
        pid: 1,
        pid_start: 1,
        ttl: std::time::Duration::from_millis(ttl_ms),
        steal,
        user_id: None,
        owner_scoped: false,
    }
}

fn acquired(a: LeaseAttempt) -> i64 {
    match a {
        LeaseAttempt::Acquired { token } => token,
        LeaseAttempt::Held(i) => panic!("expected to acquire, held by {i:?}"),
    }
}

/// SQLite's leases last their ttl plus the 10 s a renewal may wait for the file's write lock
/// (sqlite/lease.rs: a holder kept from renewing by another writer keeps its thread), taken or
/// renewed alike; a lapsed one (grace included) is taken over as on every backend.
#[tokio::test]
async fn sqlite_leases_last_their_ttl_plus_the_busy_wait() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path().join("grace.db").to_str().unwrap(), false, false).await.unwrap();
    s.setup().await.unwrap();
    let t1 = acquired(s.lease_acquire("g", &lease_req("run-a", 1_000, None)).await.unwrap());
    let i = s.lease_get("g").await.unwrap().unwrap();
    assert!(i.expires_in > 10.5 && i.expires_in <= 11.0, "{}", i.expires_in);
    assert!(matches!(s.lease_acquire("g", &lease_req("run-b", 1_000, None)).await.unwrap(), LeaseAttempt::Held(_)));
    assert!(s.lease_renew("g", t1, Duration::from_secs(2)).await.unwrap());
    let i = s.lease_get("g").await.unwrap().unwrap();
    assert!(i.expires_in > 11.5 && i.expires_in <= 12.0, "{}", i.expires_in);
    let short = s.with_lease_grace(Duration::from_millis(50));
    acquired(short.lease_acquire("h", &lease_req("run-a", 1, None)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(120)).await;
    acquired(short.lease_acquire("h", &lease_req("run-b", 60_000, None)).await.unwrap());
}

#[tokio::test]
async fn leases_admit_one_holder_and_tokens_rise_with_every_new_holder() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let tid = format!("lease-{name}");
        assert!(s.lease_get(&tid).await.unwrap().is_none(), "{name}");
        let t1 = acquired(s.lease_acquire(&tid, &lease_req("run-a", 60_000, None)).await.unwrap());
        // Held: a second run is told who holds it.
        match s.lease_acquire(&tid, &lease_req("run-b", 60_000, None)).await.unwrap() {
            LeaseAttempt::Held(i) => {
                assert_eq!((i.token, i.holder.as_str(), i.released), (t1, "run-a", false), "{name}");
                assert!(i.expires_in > 50.0 && i.expires_in <= 60.0, "{name}: {}", i.expires_in);
            }
            other => panic!("{name}: {other:?}"),
        }
        assert!(s.lease_renew(&tid, t1, std::time::Duration::from_secs(60)).await.unwrap(), "{name}");
        // Steal only works against the token it names.
        assert!(
            matches!(
                s.lease_acquire(&tid, &lease_req("run-b", 60_000, Some(t1 + 7))).await.unwrap(),
                LeaseAttempt::Held(_)
            ),
            "{name}"
        );
        let t2 = acquired(s.lease_acquire(&tid, &lease_req("run-b", 60_000, Some(t1))).await.unwrap());
        assert!(t2 > t1, "{name}");
        // The old holder has lost it for good: renewing fails, releasing is a no-op.
        assert!(!s.lease_renew(&tid, t1, std::time::Duration::from_secs(60)).await.unwrap(), "{name}");
        s.lease_release(&tid, t1).await.unwrap();
        assert_eq!(s.lease_get(&tid).await.unwrap().unwrap().token, t2, "{name}");
        // Released: free at once. The thread exists, so its row stays, marked released (a row
        // whose thread does not exist goes: see free_lease_rows_go_with_their_thread...).
        let completed = json!({"execution_meta": {"status": "completed"}});
        s.put_step(&ThreadRef::new(tid.clone(), "u"), StepWrite { fence: Some(t2), ..step(0, &completed, &[]) })
            .await
            .unwrap();
        s.lease_release(&tid, t2).await.unwrap();
        assert!(s.lease_get(&tid).await.unwrap().unwrap().released, "{name}");
        let t3 = acquired(s.lease_acquire(&tid, &lease_req("run-c", 200, None)).await.unwrap());
        assert!(t3 > t2, "{name}");
        // Expired: free without a release.
        tokio::time::sleep(std::time::Duration::from_millis(350)).await;
        let t4 = acquired(s.lease_acquire(&tid, &lease_req("run-d", 60_000, None)).await.unwrap());
        assert!(t4 > t3, "{name}");
    }
}

#[tokio::test]
async fn fenced_writes_are_refused_once_a_newer_holder_exists() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let tid = format!("fence-{name}");
        let t = ThreadRef::new(&tid, "u");
        let st = json!({"execution_meta": {"status": "running"}});
        let old = acquired(s.lease_acquire(&tid, &lease_req("old", 60_000, None)).await.unwrap());
        let ma = [msg("a", "1")];
        let w = StepWrite { fence: Some(old), ..step(0, &st, &ma) };
        assert_eq!(s.put_step(&t, w).await.unwrap(), 1, "{name}");
        let new = acquired(s.lease_acquire(&tid, &lease_req("new", 60_000, Some(old))).await.unwrap());
        // The old holder: a step and a ledger record, both refused, nothing written.
        let mb = [msg("b", "2")];
        let w = StepWrite { fence: Some(old), ..step(1, &st, &mb) };
        match s.put_step(&t, w).await {
            Err(StoreError::Fenced { token, current, .. }) => {
                assert_eq!(token, old, "{name}");
                assert!(current.is_none() || current == Some(new), "{name}: {current:?}");
            }
            other => panic!("{name}: {other:?}"),
        }
        let rec = [("m:x".to_owned(), json!({"__kind__": "raw", "value": 1}))];
        assert!(
            matches!(s.ledger_put_many(&t, &ledger_rows(&rec), Some(old)).await, Err(StoreError::Fenced { .. })),
            "{name}"
        );
        assert!(s.ledger_get(&t, &["m:x".into()]).await.unwrap().is_empty(), "{name}");
        assert_eq!(s.load(&t).await.unwrap().unwrap().version, 1, "{name}");
        assert_eq!(s.list_messages(&t, None, None, None).await.unwrap().len(), 1, "{name}");
        // The new holder writes; writes without a fence (outside a run) are not fenced.
        let mc = [msg("c", "3")];
        let w = StepWrite { fence: Some(new), ..step(1, &st, &mc) };
        assert_eq!(s.put_step(&t, w).await.unwrap(), 2, "{name}");
        assert_eq!(s.ledger_put_many(&t, &ledger_rows(&rec), Some(new)).await.unwrap(), 1, "{name}");
        assert_eq!(s.put_step(&t, step(2, &st, &[])).await.unwrap(), 3, "{name}");
        // A run's last commit frees the lease in the same transaction.
        let w = StepWrite { fence: Some(new), release_lease: true, ..step(3, &st, &[]) };
        assert_eq!(s.put_step(&t, w).await.unwrap(), 4, "{name}");
        let lease = s.lease_get(&tid).await.unwrap().unwrap();
        assert!(lease.released && lease.token == new, "{name}: {lease:?}");
    }
}

#[tokio::test]
async fn an_intent_record_is_replaced_by_its_result_but_never_replaces_one() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("intent-{name}"), "u");
        let intent = json!({"__kind__": "started", "tool": "charge"});
        let done = json!({"__kind__": "raw", "value": "charged"});
        assert_eq!(
            s.ledger_put_many(&t, &ledger_rows(&[("m:c".into(), intent.clone())]), None).await.unwrap(),
            1,
            "{name}"
        );
        assert!(is_intent(&s.ledger_get(&t, &["m:c".into()]).await.unwrap()["m:c"]), "{name}");
        // A second intent (a re-run after a crash) changes nothing.
        assert_eq!(
            s.ledger_put_many(&t, &ledger_rows(&[("m:c".into(), intent.clone())]), None).await.unwrap(),
            0,
            "{name}"
        );
        assert_eq!(
            s.ledger_put_many(&t, &ledger_rows(&[("m:c".into(), done.clone())]), None).await.unwrap(),
            1,
            "{name}"
        );
        assert_eq!(s.ledger_get(&t, &["m:c".into()]).await.unwrap()["m:c"], done, "{name}");
        // Completed: neither an intent nor another result replaces it.
        let other = json!({"__kind__": "raw", "value": "again"});
        assert_eq!(
            s.ledger_put_many(&t, &ledger_rows(&[("m:c".into(), intent), ("m:c".into(), other)]), None).await.unwrap(),
            0,
            "{name}"
        );
        assert_eq!(s.ledger_get(&t, &["m:c".into()]).await.unwrap()["m:c"], done, "{name}");
    }
}

#[tokio::test]
async fn prune_keeps_what_unfinished_threads_need() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let done = ThreadRef::new(format!("done-{name}"), "u");
        let paused = ThreadRef::new(format!("paused-{name}"), "u");
        let held = ThreadRef::new(format!("held-{name}"), "u");
        let completed = json!({"execution_meta": {"status": "completed"}});
        let interrupted = json!({"execution_meta": {"status": "interrupted_before"}});
        for t in [&done, &paused, &held] {
            for v in 0..4 {
                let st = if v == 3 && t != &paused { &completed } else { &interrupted };
                s.put_step(t, step(v, st, &[])).await.unwrap();
            }
            s.ledger_put(t, "m:1", &json!({"__kind__": "raw", "value": 1})).await.unwrap();
        }
        let token = acquired(s.lease_acquire(&held.thread_id, &lease_req("busy", 60_000, None)).await.unwrap());
        let dry = s
            .prune(&PruneRules { keep_versions: Some(2), ledger_ttl: Some(0.0), dry_run: true, ..Default::default() })
            .await
            .unwrap();
        let real = s
            .prune(&PruneRules { keep_versions: Some(2), ledger_ttl: Some(0.0), dry_run: false, ..Default::default() })
            .await
            .unwrap();
        assert_eq!((dry.state_versions, dry.ledger_rows), (real.state_versions, real.ledger_rows), "{name}");
        // Older versions go everywhere (the latest stays); only the finished, free thread loses its ledger.
        assert!(real.state_versions >= 6, "{name}: {real:?}");
        assert_eq!(real.ledger_rows, 1, "{name}: {real:?}");
        assert!(s.ledger_get(&done, &["m:1".into()]).await.unwrap().is_empty(), "{name}");
        for t in [&paused, &held] {
            assert_eq!(s.ledger_get(t, &["m:1".into()]).await.unwrap().len(), 1, "{name}");
            assert_eq!(s.load(t).await.unwrap().unwrap().version, 4, "{name}");
        }
        // Finished threads older than 0 s go; the paused and the held one stay.
        let gone = s.prune(&PruneRules { finished_older_than: Some(0.0), ..Default::default() }).await.unwrap();
        assert_eq!(gone.threads, 1, "{name}: {gone:?}");
        assert!(s.load(&done).await.unwrap().is_none(), "{name}");
        assert!(s.load(&paused).await.unwrap().is_some() && s.load(&held).await.unwrap().is_some(), "{name}");
        s.lease_release(&held.thread_id, token).await.unwrap();
    }
}

/// All three rules at once: the thread rule takes a finished thread with its ledger rows, and the
/// ledger rule must not count those rows again; a dry run reports the same numbers as the real
/// run and changes nothing.
#[tokio::test]
async fn prune_dry_run_reports_what_every_rule_together_removes() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let done = ThreadRef::new(format!("all-rules-done-{name}"), "u");
        let open = ThreadRef::new(format!("all-rules-open-{name}"), "u");
        let completed = json!({"execution_meta": {"status": "completed"}});
        let running = json!({"execution_meta": {"status": "running"}});
        for v in 0..3 {
            s.put_step(&done, step(v, &completed, &[])).await.unwrap();
            s.put_step(&open, step(v, &running, &[])).await.unwrap();
        }
        for k in ["m:1", "m:2"] {
            s.ledger_put(&done, k, &json!({"__kind__": "raw", "value": 1})).await.unwrap();
            s.ledger_put(&open, k, &json!({"__kind__": "raw", "value": 1})).await.unwrap();
        }
        let rules = |dry_run| PruneRules {
            keep_versions: Some(1),
            finished_older_than: Some(0.0),
            ledger_ttl: Some(0.0),
            dry_run,
        };
        let dry = s.prune(&rules(true)).await.unwrap();
        // Nothing changed: the thread, its versions and its ledger are all still there.
        assert_eq!(s.load(&done).await.unwrap().unwrap().version, 3, "{name}");
        assert_eq!(s.state_versions(&done).await.unwrap().len(), 3, "{name}");
        assert_eq!(s.ledger_get(&done, &["m:1".into(), "m:2".into()]).await.unwrap().len(), 2, "{name}");
        let real = s.prune(&rules(false)).await.unwrap();
        assert!(dry.dry_run && !real.dry_run, "{name}");
        assert_eq!(
            (dry.state_versions, dry.threads, dry.ledger_rows),
            (real.state_versions, real.threads, real.ledger_rows),
            "{name}: {dry:?} {real:?}"
        );
        // Two old versions per thread; one finished thread; its two ledger rows counted once.
        assert_eq!((real.threads, real.ledger_rows), (1, 2), "{name}: {real:?}");
        assert_eq!(real.state_versions, 4, "{name}: {real:?}");
        assert!(s.load(&done).await.unwrap().is_none(), "{name}");
        assert_eq!(s.ledger_get(&open, &["m:1".into(), "m:2".into()]).await.unwrap().len(), 2, "{name}");
        assert_eq!(s.load(&open).await.unwrap().unwrap().version, 3, "{name}");
    }
}

#[tokio::test]
async fn load_with_skips_the_messages_only_while_the_known_commit_is_the_latest() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new("known", "u");
        let mut st1 = json!({"n": 1});
        set_write_mark(&mut st1, "mark-a");
        s.put_step(&t, step(0, &st1, &[msg("m1", "a"), msg("m2", "b")])).await.unwrap();
        let known = KnownHead { version: 1, mark: "mark-a" };
        let hit = s.load_with(&t, Some(known)).await.unwrap().unwrap();
        assert!(hit.messages_known && hit.messages.is_empty(), "{name}");
        assert_eq!((hit.version, write_mark(&hit.state)), (1, Some("mark-a")), "{name}");
        // Another mark at the same version, or another version: the messages are read.
        for other in [KnownHead { version: 1, mark: "mark-b" }, KnownHead { version: 2, mark: "mark-a" }] {
            let miss = s.load_with(&t, Some(other)).await.unwrap().unwrap();
            assert!(!miss.messages_known && miss.messages.len() == 2, "{name}: {other:?}");
        }
        // A later writer (here one without a mark, like aput_state) moves the thread on.
        s.put_step(&t, step(1, &json!({"n": 2}), &[msg("m3", "c")])).await.unwrap();
        let moved = s.load_with(&t, Some(known)).await.unwrap().unwrap();
        assert!(!moved.messages_known && moved.messages.len() == 3, "{name}");
        // Deleted and written again up to the same version: the mark tells the rows apart.
        s.clear_state(&t).await.unwrap();
        let mut again = json!({"n": 9});
        set_write_mark(&mut again, "mark-c");
        s.put_step(&t, step(0, &again, &[msg("m9", "z")])).await.unwrap();
        let fresh = s.load_with(&t, Some(known)).await.unwrap().unwrap();
        assert!(!fresh.messages_known && fresh.messages.len() == 1 && fresh.version == 1, "{name}");
        assert!(s.load_with(&ThreadRef::new("nothing-here", "u"), Some(known)).await.unwrap().is_none(), "{name}");
    }
}

#[tokio::test]
async fn ledger_begin_returns_what_was_there_and_writes_intents_only_where_nothing_was() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("begin-{name}"), "u");
        let intent = |tool: &str| json!({"__kind__": "started", "tool": tool});
        let done = json!({"__kind__": "raw", "value": "charged"});
        s.ledger_put_many(
            &t,
            &ledger_rows(&[("m:done".into(), done.clone()), ("m:crashed".into(), intent("old"))]),
            None,
        )
        .await
        .unwrap();
        let wanted = [("m:done".into(), intent("a")), ("m:crashed".into(), intent("b")), ("m:new".into(), intent("c"))];
        let (found, written) = s.ledger_begin(&t, &wanted, &[], None).await.unwrap();
        assert!(written.is_ok(), "{name}");
        // The rows from before the call, not the intent it wrote for m:new.
        assert_eq!(found.len(), 2, "{name}: {found:?}");
        assert_eq!(found["m:done"], done, "{name}");
        assert_eq!(found["m:crashed"], intent("old"), "{name}");
        let now = s.ledger_get(&t, &["m:done".into(), "m:crashed".into(), "m:new".into()]).await.unwrap();
        assert_eq!(
            (now["m:done"].clone(), now["m:crashed"].clone(), now["m:new"].clone()),
            (done.clone(), intent("old"), intent("c")),
            "{name}"
        );
        // Fenced by a token that is not the lease's: refused, nothing written.
        let token = acquired(s.lease_acquire(&t.thread_id, &lease_req("run-1", 5000, None)).await.unwrap());
        let err = s.ledger_begin(&t, &[("m:late".into(), intent("d"))], &[], Some(token + 1)).await.unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{name}: {err:?}");
        assert!(s.ledger_get(&t, &["m:late".into()]).await.unwrap().is_empty(), "{name}");
        assert_eq!(
            s.ledger_begin(&t, &[("m:late".into(), intent("d"))], &[], Some(token)).await.unwrap().0.len(),
            0,
            "{name}"
        );
        assert_eq!(s.ledger_get(&t, &["m:late".into()]).await.unwrap()["m:late"], intent("d"), "{name}");
    }
}

#[tokio::test]
async fn ledger_begin_reads_the_old_format_keys_along_and_never_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("legacy-{name}"), "u");
        let done = json!({"__kind__": "raw", "value": "charged by 10xGraph"});
        s.ledger_put_many(&t, &ledger_rows(&[("m1:call_1".into(), done.clone())]), None).await.unwrap();
        let intents = [(r#"["m1","call_1"]"#.to_owned(), json!({"__kind__": "started", "tool": "a"}))];
        let old = ["m1:call_1".to_owned(), "m1:call_2".to_owned()];
        let (found, written) = s.ledger_begin(&t, &intents, &old, None).await.unwrap();
        assert!(written.is_ok(), "{name}");
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        assert_eq!(found["m1:call_1"], done, "{name}");
        assert!(s.ledger_get(&t, &["m1:call_2".into()]).await.unwrap().is_empty(), "{name}: a read key was written");
    }
}

#[tokio::test]
async fn ledger_mark_replaces_intents_with_intents_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("mark-{name}"), "u");
        let started = json!({"__kind__": "started", "tool": "charge", "run_id": "r1"});
        let paused = json!({"__kind__": "started", "tool": "charge", "run_id": "r1", "paused": true});
        let done = json!({"__kind__": "raw", "value": "ok"});
        s.ledger_put_many(&t, &ledger_rows(&[("a".into(), started.clone()), ("b".into(), done.clone())]), None)
            .await
            .unwrap();
        let marks = [("a".into(), paused.clone()), ("b".into(), paused.clone()), ("none".into(), paused.clone())];
        assert_eq!(s.ledger_mark(&t, &marks, None).await.unwrap(), 1, "{name}");
        let now = s.ledger_get(&t, &["a".into(), "b".into(), "none".into()]).await.unwrap();
        assert_eq!(now.len(), 2, "{name}: a mark created a row: {now:?}");
        assert_eq!((now["a"].clone(), now["b"].clone()), (paused.clone(), done.clone()), "{name}");
        // A result over a paused row wins, as over any intent; a mark never replaces a result.
        assert_eq!(s.ledger_mark(&t, &[("a".into(), done.clone())], None).await.unwrap(), 0, "{name}");
        s.ledger_put_many(&t, &ledger_rows(&[("a".into(), done.clone())]), None).await.unwrap();
        assert_eq!(s.ledger_get(&t, &["a".into()]).await.unwrap()["a"], done, "{name}");
        // Fenced like every ledger write.
        s.ledger_put_many(&t, &ledger_rows(&[("c".into(), started.clone())]), None).await.unwrap();
        let token = acquired(s.lease_acquire(&t.thread_id, &lease_req("run-1", 5000, None)).await.unwrap());
        let err = s.ledger_mark(&t, &[("c".into(), paused.clone())], Some(token + 1)).await.unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{name}: {err:?}");
        assert_eq!(s.ledger_get(&t, &["c".into()]).await.unwrap()["c"], started, "{name}");
        assert_eq!(s.ledger_mark(&t, &[("c".into(), paused.clone())], Some(token)).await.unwrap(), 1, "{name}");
    }
}

#[tokio::test]
async fn messages_written_or_deleted_outside_a_step_end_the_known_head() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        for (i, change) in ["put", "delete", "delete-missing"].into_iter().enumerate() {
            let t = ThreadRef::new(format!("unmark-{i}"), "u");
            let mut st = json!({"n": 1});
            set_write_mark(&mut st, "mark-x");
            let id = |m: &str| format!("{m}-{i}");
            s.put_step(&t, step(0, &st, &[msg(&id("m1"), "a"), msg(&id("m2"), "b")])).await.unwrap();
            let known = KnownHead { version: 1, mark: "mark-x" };
            assert!(s.load_with(&t, Some(known)).await.unwrap().unwrap().messages_known, "{name}");
            match change {
                "put" => s.put_messages(&t, &[msg(&id("m3"), "added by an operator")], None).await.unwrap(),
                "delete" => assert!(s.delete_message(&t, &id("m1"), None).await.unwrap(), "{name}"),
                _ => assert!(!s.delete_message(&t, "nope", None).await.unwrap(), "{name}"),
            }
            let after = s.load_with(&t, Some(known)).await.unwrap().unwrap();
            // Deleting nothing changes nothing; any real change makes the holder load again.
            assert_eq!(after.messages_known, change == "delete-missing", "{name} {change}");
            let expected = match change {
                "put" => 3,
                "delete" => 1,
                _ => 0,
            };
            assert_eq!(after.messages.len(), expected, "{name} {change}");
        }
    }
}

#[tokio::test]
async fn a_commit_keeps_its_mark_only_while_the_latest_row_carries_the_mark_the_run_saw() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("chain-{name}"), "u");
        let marked = |m: &str| {
            let mut v = json!({"n": m});
            set_write_mark(&mut v, m);
            v
        };
        let latest_mark =
            |cp: Option<tenxgraph::store::Checkpoint>| cp.and_then(|c| write_mark(&c.state).map(str::to_owned));
        let a = marked("a");
        s.put_step(&t, StepWrite { previous_mark: None, ..step(0, &a, &[msg(&format!("c1-{name}"), "x")]) })
            .await
            .unwrap();
        assert_eq!(latest_mark(s.load(&t).await.unwrap()).as_deref(), Some("a"), "{name}");
        let b = marked("b");
        s.put_step(&t, StepWrite { previous_mark: Some("a"), ..step(1, &b, &[]) }).await.unwrap();
        assert_eq!(latest_mark(s.load(&t).await.unwrap()).as_deref(), Some("b"), "{name}");
        // Messages change under the run: its next commit, naming "b", is stored unmarked...
        s.put_messages(&t, &[msg(&format!("c2-{name}"), "operator")], None).await.unwrap();
        let changed = latest_mark(s.load(&t).await.unwrap()).unwrap();
        assert!(changed.starts_with(MESSAGES_CHANGED), "{name}: {changed}");
        let c = marked("c");
        s.put_step(&t, StepWrite { previous_mark: Some("b"), ..step(2, &c, &[]) }).await.unwrap();
        assert_eq!(latest_mark(s.load(&t).await.unwrap()), None, "{name}");
        // ...and so is every later one of that run (it saw "c", the row has none).
        let d = marked("d");
        s.put_step(&t, StepWrite { previous_mark: Some("c"), ..step(3, &d, &[]) }).await.unwrap();
        assert_eq!(latest_mark(s.load(&t).await.unwrap()), None, "{name}");
        // A new run that loaded the unmarked row names None: its commits are marked again.
        let e = marked("e");
        s.put_step(&t, StepWrite { previous_mark: None, ..step(4, &e, &[]) }).await.unwrap();
        assert_eq!(latest_mark(s.load(&t).await.unwrap()).as_deref(), Some("e"), "{name}");
    }
}

#[tokio::test]
async fn a_write_naming_the_mark_it_read_is_refused_once_messages_changed_outside_a_step() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("read-mark-{name}"), "u");
        let latest_mark =
            |cp: Option<tenxgraph::store::Checkpoint>| cp.and_then(|c| write_mark(&c.state).map(str::to_owned));
        let st = json!({"n": 1});
        s.put_step(&t, step(0, &st, &[msg(&format!("rm1-{name}"), "x")])).await.unwrap();
        // Read with no mark on the row: "" names it, and the write goes through.
        assert_eq!(latest_mark(s.load(&t).await.unwrap()), None, "{name}");
        s.put_step(&t, StepWrite { expected_mark: Some(""), ..step(1, &st, &[]) }).await.unwrap();
        // A message written outside a step after the read: the write naming that read is refused
        // and writes nothing...
        s.put_messages(&t, &[msg(&format!("rm2-{name}"), "operator")], None).await.unwrap();
        let first = latest_mark(s.load(&t).await.unwrap()).unwrap();
        let late = s.put_step(&t, StepWrite { expected_mark: Some(""), ..step(2, &st, &[]) }).await;
        assert!(matches!(late, Err(StoreError::StaleMessages { version: 2, .. })), "{name}: {late:?}");
        assert_eq!(s.load(&t).await.unwrap().unwrap().version, 2, "{name}");
        // ...and every such write has a mark of its own: a read after the first one is refused
        // after the second (one constant for every write could not tell them apart).
        s.delete_message(&t, &format!("rm2-{name}"), None).await.unwrap();
        let second = latest_mark(s.load(&t).await.unwrap()).unwrap();
        assert_ne!(first, second, "{name}");
        let late = s.put_step(&t, StepWrite { expected_mark: Some(&first), ..step(2, &st, &[]) }).await;
        assert!(matches!(late, Err(StoreError::StaleMessages { .. })), "{name}: {late:?}");
        // A version moved on is still `Stale`, mark or not; the mark read last passes.
        let moved = s.put_step(&t, StepWrite { expected_mark: Some(&second), ..step(1, &st, &[]) }).await;
        assert!(matches!(moved, Err(StoreError::Stale { expected: 1, current: 2, .. })), "{name}: {moved:?}");
        s.put_step(&t, StepWrite { expected_mark: Some(&second), ..step(2, &st, &[]) }).await.unwrap();
        assert_eq!(s.load(&t).await.unwrap().unwrap().version, 3, "{name}");
    }
}

#[tokio::test]
async fn a_message_write_naming_the_callers_read_leaves_the_callers_mark_only_while_that_read_is_the_latest() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("own-mark-{name}"), "u");
        let latest_mark =
            |cp: Option<tenxgraph::store::Checkpoint>| cp.and_then(|c| write_mark(&c.state).map(str::to_owned));
        let st = json!({"n": 1});
        s.put_step(&t, step(0, &st, &[msg(&format!("om1-{name}"), "x")])).await.unwrap();
        let own = |mark: &str| ChangeMark { seen: String::new(), mark: mark.to_owned() };
        // The row still carries what the caller read (none): its own mark is left, twice in a row
        // when the second write names the first.
        s.put_messages(&t, &[msg(&format!("om2-{name}"), "mine")], Some(&own("messages-changed-a"))).await.unwrap();
        assert_eq!(latest_mark(s.load(&t).await.unwrap()).as_deref(), Some("messages-changed-a"), "{name}");
        let after_a = ChangeMark { seen: "messages-changed-a".into(), mark: "messages-changed-b".into() };
        assert!(s.delete_message(&t, &format!("om2-{name}"), Some(&after_a)).await.unwrap(), "{name}");
        assert_eq!(latest_mark(s.load(&t).await.unwrap()).as_deref(), Some("messages-changed-b"), "{name}");
        s.put_step(&t, StepWrite { expected_mark: Some("messages-changed-b"), ..step(1, &st, &[]) }).await.unwrap();
        // Another write came between: the caller's write leaves a mark it does not hold, and its
        // versioned write is refused.
        s.put_messages(&t, &[msg(&format!("om3-{name}"), "another")], None).await.unwrap();
        s.put_messages(&t, &[msg(&format!("om4-{name}"), "mine")], Some(&own("messages-changed-c"))).await.unwrap();
        let left = latest_mark(s.load(&t).await.unwrap()).unwrap();
        assert!(left.starts_with(MESSAGES_CHANGED) && left != "messages-changed-c", "{name}: {left}");
        let late = s.put_step(&t, StepWrite { expected_mark: Some("messages-changed-c"), ..step(2, &st, &[]) }).await;
        assert!(matches!(late, Err(StoreError::StaleMessages { .. })), "{name}: {late:?}");
    }
}

#[tokio::test]
async fn running_threads_lists_latest_running_states_of_every_user_in_pages() {
    let dir = tempfile::tempdir().unwrap();
    let mut stores = backends(&dir).await;
    // User isolation scopes what a user reads, not what recovery sees: every owner is listed.
    let iso_path = dir.path().join("iso.db");
    let iso = SqliteStore::open(iso_path.to_str().unwrap(), true, false).await.unwrap();
    iso.setup().await.unwrap();
    stores.push(("memory-isolated", Arc::new(MemoryStore::new(true))));
    stores.push(("sqlite-isolated", Arc::new(iso)));
    if let Some(p) = pg(true, false).await {
        stores.push(("postgres-isolated", Arc::new(p)));
    }
    let status = |s: &str| json!({"execution_meta": {"status": s, "current_node": "tools", "step": 1}});
    for (name, s) in stores {
        // (thread, owner, the statuses of its steps in order)
        let threads: [(&str, &str, &[&str]); 5] = [
            ("r-a", "u1", &["running"]),
            ("r-b", "u2", &["running", "completed"]),
            ("r-c", "u3", &["completed", "running"]),
            ("r-d", "u1", &["running", "interrupted_before"]),
            ("r-e", "u2", &["running", "error"]),
        ];
        for (id, user, statuses) in threads {
            let t = ThreadRef::new(id, user);
            for (i, st) in statuses.iter().enumerate() {
                s.put_step(&t, step(i as i64, &status(st), &[])).await.unwrap();
            }
        }
        // Many versions (past the state history limit) with the latest running: still listed once.
        let long = ThreadRef::new("r-f", "u4");
        for v in 0..25 {
            let st = if v == 24 { "running" } else { "completed" };
            s.put_step(&long, step(v, &status(st), &[])).await.unwrap();
        }
        // A thread row without any state: no run ever started there.
        s.put_thread(&ThreadRef::new("r-g", "u1"), None, &json!({})).await.unwrap();

        let all = s.running_threads(None, 100).await.unwrap();
        let got: Vec<(&str, &str)> = all.iter().map(|t| (t.thread_id.as_str(), t.user_id.as_str())).collect();
        assert_eq!(got, [("r-a", "u1"), ("r-c", "u3"), ("r-f", "u4")], "{name}");

        let first = s.running_threads(None, 1).await.unwrap();
        assert_eq!(first, [ThreadRef::new("r-a", "u1")], "{name}");
        let rest = s.running_threads(Some("r-a"), 100).await.unwrap();
        assert_eq!(rest, [ThreadRef::new("r-c", "u3"), ThreadRef::new("r-f", "u4")], "{name}");
        assert!(s.running_threads(Some("r-f"), 100).await.unwrap().is_empty(), "{name}");
        assert!(s.running_threads(None, 0).await.unwrap().is_empty(), "{name}");

        // Finishing a run takes the thread off the list; a deleted thread is gone from it.
        s.put_step(&ThreadRef::new("r-a", "u1"), step(1, &status("completed"), &[])).await.unwrap();
        s.clean_thread(&ThreadRef::new("r-c", "u3")).await.unwrap();
        assert_eq!(s.running_threads(None, 100).await.unwrap(), [ThreadRef::new("r-f", "u4")], "{name}");
    }
}

/// 10xGraph 0.10 keeps a JSON string under `state_cache:<t>:<u>`. Ours lives under the store's
/// own prefix, never mistakes 10xGraph's for an entry of ours, never fails on it (WRONGTYPE used
/// to mark Redis down for every thread), reads it only through `legacy_state_cache`, and
/// `state_cache_clear` drops both.
#[tokio::test]
async fn a_10xgraph_state_cache_entry_is_read_as_such_and_cleared_with_ours() {
    use std::sync::atomic::Ordering::Relaxed;
    use tenxgraph::store::LegacyCache;
    let (Some(s), Ok(url)) = (pg(false, true).await, std::env::var("TENXGRAPH_TEST_REDIS_URL")) else { return };
    let t = ThreadRef::new(format!("legacy-{}", uuid::Uuid::new_v4().simple()), "u1");
    let key = format!("state_cache:{}:{}", t.thread_id, t.user_id);
    let mut r = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let entry = json!({"context": [], "execution_meta": {"current_node": "tools", "status": "running"}, "__checkpoint_version__": 2});
    let _: () = redis::cmd("SET").arg(&key).arg(entry.to_string()).query_async(&mut r).await.unwrap();
    let fallbacks = tenxgraph::engine::metrics().redis_fallbacks.load(Relaxed);

    assert_eq!(s.legacy_state_cache(&t).await.unwrap(), LegacyCache::Found(entry.clone()));
    assert_eq!(s.state_cache_get(&t).await.unwrap(), None, "10xGraph's entry is not one of ours");
    let ours = json!({"execution_meta": {"current_node": "model"}});
    assert!(s.state_cache_put(&t, 3, &ours).await.unwrap());
    let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut r).await.unwrap();
    assert_eq!(kind, "string", "10xGraph's entry is left as it was");
    let mine: Vec<String> = redis::cmd("KEYS")
        .arg(format!("tenxgraph:*:state_cache:{}:u1", t.thread_id))
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(mine.len(), 1, "ours is under the store's prefix: {mine:?}");
    assert_eq!(s.state_cache_get(&t).await.unwrap(), Some((3, ours)));
    assert_eq!(s.legacy_state_cache(&t).await.unwrap(), LegacyCache::Found(entry), "ours is not 10xGraph's");

    let _: () = redis::cmd("SET").arg(&key).arg("{\"context\": [ not json").query_async(&mut r).await.unwrap();
    assert!(
        matches!(s.legacy_state_cache(&t).await.unwrap(), LegacyCache::Unreadable(why) if why.starts_with("not JSON"))
    );
    let _: () = redis::cmd("SET").arg(&key).arg("[1, 2]").query_async(&mut r).await.unwrap();
    assert!(matches!(s.legacy_state_cache(&t).await.unwrap(), LegacyCache::Unreadable(why) if why.contains("array")));
    s.state_cache_clear(&t).await.unwrap();
    let exists: i64 = redis::cmd("EXISTS").arg(&key).arg(&mine[0]).query_async(&mut r).await.unwrap();
    assert_eq!(exists, 0);
    assert_eq!(tenxgraph::engine::metrics().redis_fallbacks.load(Relaxed), fallbacks, "Redis was never marked down");
}

/// A Redis that cannot be reached is no answer about 10xGraph's entry, not "no entry": an error,
/// on every read, also once Redis is marked down (then at once, without a connect attempt).
#[tokio::test]
async fn an_unreachable_redis_is_an_error_for_10xgraphs_entry_not_an_absent_one() {
    let Some(dsn) = common::pg_dsn() else { return };
    let opts = PgOptions { schema: format!("r_{}", uuid::Uuid::new_v4().simple()), ..PgOptions::default() };
    let s = PgStore::connect(&dsn, Some("redis://127.0.0.1:1/0"), opts).await.unwrap();
    let t = ThreadRef::new("legacy-down", "u1");
    for _ in 0..2 {
        let err = s.legacy_state_cache(&t).await.unwrap_err();
        assert!(matches!(err, StoreError::Transient { op, .. } if op.contains("10xGraph")), "{err}");
    }
    assert_eq!(s.state_cache_get(&t).await.unwrap(), None, "the state cache falls back as before");
}

/// A lease row nobody holds goes with its thread (`clean_thread`, `prune`); a held one stays, so
/// its run is still fenced rather than freed. A thread id used again gets tokens above every token
/// of its earlier life, so a run of the old thread that stalled past its lease stays refused.
#[tokio::test]
async fn free_lease_rows_go_with_their_thread_and_a_reused_id_never_gets_an_old_token_back() {
    let dir = tempfile::tempdir().unwrap();
    let completed = json!({"execution_meta": {"status": "completed"}});
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("reused:{name}"), "u");
        let mut old = Vec::new();
        for v in 0..3 {
            let tok = acquired(s.lease_acquire(&t.thread_id, &lease_req("old", 60_000, None)).await.unwrap());
            s.put_step(&t, StepWrite { fence: Some(tok), ..step(v, &completed, &[]) }).await.unwrap();
            s.lease_release(&t.thread_id, tok).await.unwrap();
            old.push(tok);
        }
        // The last holder of the earlier life stalls past its lease without releasing it.
        let stalled = acquired(s.lease_acquire(&t.thread_id, &lease_req("stalled", 100, None)).await.unwrap());
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        s.clean_thread(&t).await.unwrap();
        assert!(s.lease_get(&t.thread_id).await.unwrap().is_none(), "{name}: the free row went with the thread");
        let late = s.put_step(&t, StepWrite { fence: Some(stalled), ..step(3, &completed, &[]) }).await;
        assert!(matches!(late, Err(StoreError::Fenced { .. })), "{name}: {late:?}");
        // The id used again: five new holders, none with a token of the earlier life.
        let mut new = Vec::new();
        for _ in 0..5 {
            let tok = acquired(s.lease_acquire(&t.thread_id, &lease_req("new", 60_000, None)).await.unwrap());
            s.lease_release(&t.thread_id, tok).await.unwrap();
            new.push(tok);
        }
        assert!(new.iter().all(|n| *n > stalled), "{name}: old {old:?} stalled {stalled}, new {new:?}");
        assert!(new.windows(2).all(|w| w[1] > w[0]), "{name}: {new:?}");
        let tok = acquired(s.lease_acquire(&t.thread_id, &lease_req("writer", 60_000, None)).await.unwrap());
        s.put_step(&t, StepWrite { fence: Some(tok), ..step(0, &completed, &[]) }).await.unwrap();
        let late = s.put_step(&t, StepWrite { fence: Some(stalled), ..step(1, &completed, &[]) }).await;
        assert!(matches!(late, Err(StoreError::Fenced { .. })), "{name}: {late:?}");
        assert_eq!(s.load(&t).await.unwrap().unwrap().version, 1, "{name}: the stalled write left nothing");
        s.lease_release(&t.thread_id, tok).await.unwrap();

        // Held while its thread is deleted: the row stays, with its holder's token.
        let h = ThreadRef::new(format!("held-deleted-{name}"), "u");
        let held = acquired(s.lease_acquire(&h.thread_id, &lease_req("busy", 60_000, None)).await.unwrap());
        s.put_step(&h, StepWrite { fence: Some(held), ..step(0, &completed, &[]) }).await.unwrap();
        s.clean_thread(&h).await.unwrap();
        let kept = s.lease_get(&h.thread_id).await.unwrap().expect("a held row stays");
        assert!(kept.is_live() && kept.token == held, "{name}: {kept:?}");

        // Pruned: a finished thread whose lease is free loses its row with it.
        let p = ThreadRef::new(format!("pruned-{name}"), "u");
        let tok = acquired(s.lease_acquire(&p.thread_id, &lease_req("done", 60_000, None)).await.unwrap());
        s.put_step(&p, StepWrite { fence: Some(tok), release_lease: true, ..step(0, &completed, &[]) }).await.unwrap();
        assert!(s.lease_get(&p.thread_id).await.unwrap().is_some_and(|l| l.released), "{name}");
        let dry = s.prune(&PruneRules { finished_older_than: Some(0.0), dry_run: true, ..Default::default() }).await;
        assert!(dry.unwrap().threads >= 1, "{name}");
        assert!(s.lease_get(&p.thread_id).await.unwrap().is_some(), "{name}: a dry run deletes nothing");
        let gone = s.prune(&PruneRules { finished_older_than: Some(0.0), ..Default::default() }).await.unwrap();
        assert!(gone.threads >= 1, "{name}: {gone:?}");
        assert!(s.lease_get(&p.thread_id).await.unwrap().is_none(), "{name}: the row went with its thread");
        assert!(s.lease_get(&h.thread_id).await.unwrap().is_some_and(|l| l.is_live()), "{name}: the held one stays");
        // Its holder frees it: the thread is gone, so the row goes now (nothing else would ever
        // delete it); a stale token frees nothing.
        s.lease_release(&h.thread_id, held - 1).await.unwrap();
        assert!(s.lease_get(&h.thread_id).await.unwrap().is_some_and(|l| l.is_live()), "{name}");
        s.lease_release(&h.thread_id, held).await.unwrap();
        assert!(s.lease_get(&h.thread_id).await.unwrap().is_none(), "{name}: freed after its thread went");
        // A thread that exists keeps its freed row, as before.
        let tok = acquired(s.lease_acquire(&h.thread_id, &lease_req("again", 60_000, None)).await.unwrap());
        assert!(tok > held, "{name}: {tok} after {held}");
        s.put_step(&h, StepWrite { fence: Some(tok), ..step(0, &completed, &[]) }).await.unwrap();
        s.lease_release(&h.thread_id, tok).await.unwrap();
        assert!(s.lease_get(&h.thread_id).await.unwrap().is_some_and(|l| l.released && l.token == tok), "{name}");
    }
}

/// A thread deleted while a run holds its lease (the held row stays, so the fence still passes):
/// the run's ledger writes are refused instead of creating the thread again. Until version 14
/// (Postgres) each backend brought the deleted thread back, with the tool's result and no state.
/// A write outside a run (no fence) still creates its thread, as before.
#[tokio::test]
async fn a_runs_ledger_write_never_brings_back_a_thread_deleted_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let running = json!({"execution_meta": {"status": "running"}});
    let done = json!({"__kind__": "message", "value": {"role": "tool"}});
    let started = json!({"__kind__": "started", "tool": "charge"});
    for (name, s) in backends(&dir).await {
        let t = ThreadRef::new(format!("gone-under-run:{name}"), "u");
        let tok = acquired(s.lease_acquire(&t.thread_id, &lease_req("run", 60_000, None)).await.unwrap());
        s.put_step(&t, StepWrite { fence: Some(tok), ..step(0, &running, &[]) }).await.unwrap();
        s.clean_thread(&t).await.unwrap();
        let put = s.ledger_put_many(&t, &ledger_rows(&[("m:c1".into(), done.clone())]), Some(tok)).await;
        assert!(matches!(put, Err(StoreError::Fenced { current: None, .. })), "{name}: {put:?}");
        let mark = s.ledger_mark(&t, &[("m:c1".into(), started.clone())], Some(tok)).await;
        assert!(matches!(mark, Err(StoreError::Fenced { current: None, .. })), "{name}: {mark:?}");
        let begin = s.ledger_begin(&t, &[("m:c2".into(), started.clone())], &[], Some(tok)).await;
        assert!(matches!(begin, Err(StoreError::Fenced { .. })), "{name}: {begin:?}");
        assert!(s.load(&t).await.unwrap().is_none(), "{name}");
        assert_eq!(s.thread_owner(&t.thread_id).await.unwrap(), None, "{name}: the thread came back");
        assert!(s.ledger_list(&t).await.unwrap().is_empty(), "{name}");
        s.lease_release(&t.thread_id, tok).await.unwrap();
        assert!(s.lease_get(&t.thread_id).await.unwrap().is_none(), "{name}");
        // Outside a run, a ledger write still makes its thread.
        assert_eq!(
            s.ledger_put_many(&t, &ledger_rows(&[("m:c1".into(), done.clone())]), None).await.unwrap(),
            1,
            "{name}"
        );
        assert_eq!(s.thread_owner(&t.thread_id).await.unwrap().as_deref(), Some("u"), "{name}");
    }
}

/// Every prune deletes the expired cache entries (reads already skip them; before, nothing
/// removed them from SQLite or Postgres), counts them alike in a dry run, and leaves the others.
#[tokio::test]
async fn prune_deletes_expired_cache_entries_and_only_those() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir).await {
        let ns = format!("ns-{name}");
        for i in 0..3 {
            s.cache_put(&ns, &format!("old{i}"), &json!(i), Some(0.05)).await.unwrap();
        }
        s.cache_put(&ns, "later", &json!("l"), Some(3600.0)).await.unwrap();
        s.cache_put(&ns, "kept", &json!("k"), None).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let dry = s.prune(&PruneRules { dry_run: true, ..Default::default() }).await.unwrap();
        let real = s.prune(&PruneRules::default()).await.unwrap();
        // With Redis too: the generic cache is the table on every backend.
        assert_eq!((dry.cache_entries, real.cache_entries), (3, 3), "{name}: {dry:?} {real:?}");
        let mut keys = s.cache_keys(&ns, None).await.unwrap();
        keys.sort();
        assert_eq!(keys, ["kept", "later"], "{name}");
        assert_eq!(s.cache_get(&ns, "later").await.unwrap(), Some(json!("l")), "{name}");
        assert_eq!(s.prune(&PruneRules::default()).await.unwrap().cache_entries, 0, "{name}");
    }
}
