//! What the CLI reads, on every backend: the ledger listing, the state versions and the schema
//! version; a non-owner under isolation reads nothing.

mod common;

use serde_json::json;
use std::sync::Arc;
use tenxgraph::store::{Checkpointer, MemoryStore, PgOptions, PgStore, SqliteStore, StepWrite, ThreadRef};

async fn pg(isolation: bool) -> Option<PgStore> {
    let dsn = common::pg_dsn()?;
    let opts = PgOptions {
        schema: format!("i_{}", uuid::Uuid::new_v4().simple()),
        enforce_user_isolation: isolation,
        ..PgOptions::default()
    };
    Some(PgStore::connect(&dsn, None, opts).await.expect("connect to the test Postgres"))
}

async fn backends(dir: &tempfile::TempDir, isolation: bool) -> Vec<(&'static str, Arc<dyn Checkpointer>)> {
    let sqlite = SqliteStore::open(dir.path().join(format!("i{isolation}.db")).to_str().unwrap(), isolation, false)
        .await
        .unwrap();
    sqlite.setup().await.unwrap();
    let mut all: Vec<(&'static str, Arc<dyn Checkpointer>)> =
        vec![("memory", Arc::new(MemoryStore::new(isolation))), ("sqlite", Arc::new(sqlite))];
    if let Some(p) = pg(isolation).await {
        all.push(("postgres", Arc::new(p)));
    }
    all
}

// The one place that builds a StepWrite in this file.
fn step(expected: i64, state: &serde_json::Value) -> StepWrite<'_> {
    let (state_text, mark) = common::state_text(state);
    StepWrite {
        expected_version: expected,
        state: state_text,
        mark,
        new_messages: &[],
        replace_messages: false,
        fence: None,
        release_lease: false,
        in_tx: None,
        previous_mark: None,
        expected_mark: None,
    }
}

#[tokio::test]
async fn ledger_list_returns_every_row_oldest_first_with_its_time() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let t = ThreadRef::new("th", "u");
        assert!(s.ledger_list(&t).await.unwrap().is_empty(), "{name}: unknown thread");
        s.ledger_put(&t, "m1:c1", &json!({"__kind__": "raw", "value": 1})).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        s.ledger_put(&t, "m1:c2", &json!({"__kind__": "started", "tool": "email"})).await.unwrap();
        s.ledger_put(&ThreadRef::new("other", "u"), "m9:c9", &json!({"__kind__": "raw", "value": 9})).await.unwrap();
        let rows = s.ledger_list(&t).await.unwrap();
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["m1:c1", "m1:c2"], "{name}");
        assert_eq!(rows[1].result, Some(json!({"__kind__": "started", "tool": "email"})), "{name}");
        // The durable stores record when; the in-memory one may not.
        if name != "memory" {
            assert!(rows.iter().all(|r| r.created_at.is_some()), "{name}");
        }
        if let (Some(a), Some(b)) = (rows[0].created_at, rows[1].created_at) {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
            assert!(a <= b && (now - b).abs() < 60.0, "{name}: {a} {b} {now}");
        }
    }
}

#[tokio::test]
async fn state_versions_are_newest_first_without_messages() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let t = ThreadRef::new("th", "u");
        assert!(s.state_versions(&t).await.unwrap().is_empty(), "{name}");
        for v in 0..3 {
            let st = json!({"execution_meta": {"step": v, "status": "running"}});
            s.put_step(&t, step(v, &st)).await.unwrap();
        }
        let versions = s.state_versions(&t).await.unwrap();
        let got: Vec<(i64, i64)> =
            versions.iter().map(|v| (v.version, v.state["execution_meta"]["step"].as_i64().unwrap())).collect();
        assert_eq!(got, [(3, 2), (2, 1), (1, 0)], "{name}");
        assert_eq!(versions.iter().all(|v| v.created_at.is_some()), name != "memory", "{name}");
    }
}

#[tokio::test]
async fn a_non_owner_reads_nothing_under_isolation() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, true).await {
        let owner = ThreadRef::new("th", "alice");
        let st = json!({});
        s.put_step(&owner, step(0, &st)).await.unwrap();
        s.ledger_put(&owner, "m:c", &json!({"__kind__": "raw", "value": 1})).await.unwrap();
        let other = ThreadRef::new("th", "mallory");
        assert!(s.ledger_list(&other).await.unwrap().is_empty(), "{name}");
        assert!(s.state_versions(&other).await.unwrap().is_empty(), "{name}");
        assert_eq!(s.ledger_list(&owner).await.unwrap().len(), 1, "{name}");
        assert_eq!(s.state_versions(&owner).await.unwrap().len(), 1, "{name}");
    }
}

#[tokio::test]
async fn schema_version_is_reported_by_durable_stores() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let v = s.schema_version().await.unwrap();
        match name {
            "memory" => assert_eq!(v, None),
            "postgres" => assert_eq!(v, Some(i64::from(tenxgraph::store::postgres::CURRENT_VERSION)), "{name}"),
            _ => assert!(v.is_some_and(|v| v >= 1), "{name}: {v:?}"),
        }
    }
}
