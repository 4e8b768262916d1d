//! The same contract checked on every backend: versioned steps, the ledger, messages, cache.

use serde_json::json;
use std::sync::Arc;
use tenxgraph::store::{
    Checkpointer, MemoryStore, PgOptions, PgStore, SqliteStore, StepWrite, StoreError, StoredMessage, ThreadRef,
};

/// A Postgres store in a schema of its own, when TENXGRAPH_TEST_PG_DSN is set (scripts/test.sh
/// sets it); `with_redis` adds TENXGRAPH_TEST_REDIS_URL.
async fn pg(isolation: bool, with_redis: bool) -> Option<PgStore> {
    let dsn = std::env::var("TENXGRAPH_TEST_PG_DSN").ok()?;
    let redis = if with_redis { std::env::var("TENXGRAPH_TEST_REDIS_URL").ok() } else { None };
    let opts = PgOptions {
        schema: format!("r_{}", uuid::Uuid::new_v4().simple()),
        enforce_user_isolation: isolation,
        ..PgOptions::default()
    };
    Some(PgStore::connect(&dsn, redis.as_deref(), opts).await.expect("connect to the test Postgres"))
}

fn msg(id: &str, text: &str) -> StoredMessage {
    StoredMessage { id: id.into(), data: json!({"message_id": id, "role": "user", "content": [{"type": "text", "text": text}]}) }
}

async fn backends(dir: &tempfile::TempDir) -> Vec<(&'static str, Arc<dyn Checkpointer>)> {
    let path = dir.path().join("t.db");
    let sqlite = SqliteStore::open(path.to_str().unwrap(), false, false).await.unwrap();
    sqlite.setup().await.unwrap();
    let mem_sqlite = SqliteStore::open(":memory:", false, false).await.unwrap();
    mem_sqlite.setup().await.unwrap();
    let mut all: Vec<(&'static str, Arc<dyn Checkpointer>)> =
        vec![("memory", Arc::new(MemoryStore::new(false))), ("sqlite", Arc::new(sqlite)), ("sqlite-mem", Arc::new(mem_sqlite))];
    if let Some(p) = pg(false, false).await {
        all.push(("postgres", Arc::new(p)));
    }
    if let Some(p) = pg(false, true).await {
        all.push(("postgres+redis", Arc::new(p)));
    }
    all
}

fn step<'a>(expected: i64, state: &'a serde_json::Value, msgs: &'a [StoredMessage]) -> StepWrite<'a> {
    StepWrite { expected_version: expected, state, new_messages: msgs, replace_messages: false, fence: None, in_tx: None }
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
        let ids: Vec<&str> = cp.messages.iter().map(|m| m["message_id"].as_str().unwrap()).collect();
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
        s.put_messages(&t, &[msg("a", "1-edited"), msg("c", "3")]).await.unwrap();
        let texts: Vec<String> = s
            .list_messages(&t, None, None, None)
            .await
            .unwrap()
            .iter()
            .map(|m| m["content"][0]["text"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(texts, ["1-edited", "2", "3"], "{name}");
        let w = StepWrite { expected_version: 1, state: &st, new_messages: &[msg("z", "only")], replace_messages: true, fence: None, in_tx: None };
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
    for (name, s) in backends(&dir).await {
        s.cache_put("ns", "k1", &json!(true), Some(0.2)).await.unwrap();
        s.cache_put("ns", "k2", &json!({"a": 1}), None).await.unwrap();
        s.cache_put("other", "k3", &json!(1), None).await.unwrap();
        assert_eq!(s.cache_keys("ns", None).await.unwrap(), ["k1", "k2"], "{name}");
        assert_eq!(s.cache_keys("ns", Some("k2")).await.unwrap(), ["k2"], "{name}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(s.cache_get("ns", "k1").await.unwrap(), None, "{name}: expired");
        assert_eq!(s.cache_get("ns", "k2").await.unwrap(), Some(json!({"a": 1})), "{name}");
        s.cache_clear("ns", "k2").await.unwrap();
        assert_eq!(s.cache_get("ns", "k2").await.unwrap(), None, "{name}");
    }
}

#[tokio::test]
async fn user_isolation_rejects_other_users_when_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("iso.db").to_str().unwrap(), true, false).await.unwrap();
    sqlite.setup().await.unwrap();
    let mut stores: Vec<(&str, Arc<dyn Checkpointer>)> = vec![("memory", Arc::new(MemoryStore::new(true))), ("sqlite", Arc::new(sqlite))];
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
        assert_eq!(s.ledger_put_many(&t, &batch, None).await.unwrap(), 1, "{name}");
        let got = s.ledger_get(&t, &["m:a".into(), "m:b".into()]).await.unwrap();
        assert_eq!((got["m:a"]["value"].as_str(), got["m:b"]["value"].as_str()), (Some("old"), Some("b1")), "{name}");
    }
}
