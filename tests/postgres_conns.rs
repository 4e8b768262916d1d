//! The store's connections (src/store/postgres/conns.rs): a connection kept aside between
//! statements belongs to the store's runtime, and the store may be dropped anywhere.

mod common;

use tenxgraph::store::{Checkpointer, PgOptions, PgStore, ThreadRef};

/// Python's garbage collector drops a checkpointer on whatever thread it runs, outside any
/// runtime: dropping the store's spare connections there must not panic (sqlx spawns a task to
/// return each one to its pool; a panic in that drop aborted the interpreter).
#[test]
fn a_store_with_spare_connections_drops_outside_its_runtime() {
    let Some(dsn) = common::pg_dsn() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let schema = format!("conns_{}", uuid::Uuid::new_v4().simple());
    let store = rt.block_on(async {
        let opts = PgOptions { schema, ..PgOptions::default() };
        let store = PgStore::connect(&dsn, None, opts).await.expect("connect to the test Postgres");
        let t = ThreadRef { thread_id: "spare".into(), user_id: "u".into(), owner_scoped: false };
        // Two statements at once leave two connections spare.
        let (a, b) = tokio::join!(store.load(&t), store.load(&t));
        assert!(a.unwrap().is_none() && b.unwrap().is_none());
        store
    });
    assert!(tokio::runtime::Handle::try_current().is_err(), "this drop must happen outside the runtime");
    drop(store);
    // The runtime still takes the connections back and ends cleanly.
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
}
