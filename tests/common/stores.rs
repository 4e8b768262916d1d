//! Every backend the store tests run on: memory, SQLite (file and `:memory:`), memory behind
//! `LazyStore`, and PostgreSQL with and without Redis when the test database is there.

#![allow(dead_code)] // each test binary uses part of it

use futures::FutureExt;
use std::sync::Arc;
use tenxgraph::store::{Checkpointer, LazyStore, MemoryStore, PgOptions, PgStore, SqliteStore};

pub async fn pg(isolation: bool, with_redis: bool) -> Option<PgStore> {
    let dsn = super::pg_dsn()?;
    let redis = if with_redis { std::env::var("TENXGRAPH_TEST_REDIS_URL").ok() } else { None };
    let opts = PgOptions {
        schema: format!("r_{}", uuid::Uuid::new_v4().simple()),
        enforce_user_isolation: isolation,
        ..PgOptions::default()
    };
    Some(PgStore::connect(&dsn, redis.as_deref(), opts).await.expect("connect to the test Postgres"))
}

pub async fn backends(dir: &tempfile::TempDir, isolation: bool) -> Vec<(&'static str, Arc<dyn Checkpointer>)> {
    let path = dir.path().join(format!("t-{isolation}.db"));
    let sqlite = SqliteStore::open(path.to_str().unwrap(), isolation, false).await.unwrap();
    sqlite.setup().await.unwrap();
    let mem_sqlite = SqliteStore::open(":memory:", isolation, false).await.unwrap();
    mem_sqlite.setup().await.unwrap();
    let lazy = LazyStore::new(
        isolation,
        Box::new(move || async move { Ok(Arc::new(MemoryStore::new(isolation)) as Arc<dyn Checkpointer>) }.boxed()),
    );
    let mut all: Vec<(&'static str, Arc<dyn Checkpointer>)> = vec![
        ("memory", Arc::new(MemoryStore::new(isolation))),
        ("sqlite", Arc::new(sqlite)),
        ("sqlite-mem", Arc::new(mem_sqlite)),
        ("lazy(memory)", Arc::new(lazy)),
    ];
    if let Some(p) = pg(isolation, false).await {
        all.push(("postgres", Arc::new(p)));
    }
    if let Some(p) = pg(isolation, true).await {
        all.push(("postgres+redis", Arc::new(p)));
    }
    all
}
