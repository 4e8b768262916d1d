//! `LazyStore`: opens its backend on first use; a failed open is retried by the next call; closing
//! a store that never opened opens nothing.

mod common;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tenxgraph::store::{Checkpointer, LazyStore, MemoryStore, Opener, StepWrite, StoreError, ThreadRef};

fn flaky_opener(fail_first: usize, opened: Arc<AtomicUsize>) -> Opener {
    Box::new(move || {
        let opened = opened.clone();
        Box::pin(async move {
            let n = opened.fetch_add(1, Ordering::SeqCst);
            if n < fail_first {
                return Err(StoreError::Transient { op: "connect", message: "refused".into() });
            }
            Ok(Arc::new(MemoryStore::new(false)) as Arc<dyn Checkpointer>)
        })
    })
}

#[tokio::test]
async fn nothing_opens_until_first_use_and_a_failed_open_is_retried() {
    let opened = Arc::new(AtomicUsize::new(0));
    let store = LazyStore::new(false, flaky_opener(1, opened.clone()));
    assert_eq!(opened.load(Ordering::SeqCst), 0);
    assert!(!store.is_open());
    store.release().await.unwrap();
    assert_eq!(opened.load(Ordering::SeqCst), 0, "release must not connect");

    let t = ThreadRef::new("t", "u");
    let err = store.load(&t).await.unwrap_err();
    assert!(matches!(err, StoreError::Transient { .. }), "{err}");
    assert!(!store.is_open());

    // The next call opens again (the database came up) and works.
    assert!(store.load(&t).await.unwrap().is_none());
    assert!(store.is_open());
    let state = serde_json::json!({"x": 1});
    let (state_text, mark) = common::state_text(&state);
    let w = StepWrite {
        expected_version: 0,
        state: state_text,
        mark,
        new_messages: &[],
        replace_messages: false,
        fence: None,
        release_lease: false,
        in_tx: None,
        previous_mark: None,
        expected_mark: None,
    };
    assert_eq!(store.put_step(&t, w).await.unwrap(), 1);
    assert_eq!(store.load(&t).await.unwrap().unwrap().version, 1);
    assert_eq!(opened.load(Ordering::SeqCst), 2, "opened once more, then kept");
}

#[tokio::test]
async fn concurrent_first_users_share_one_open() {
    let opened = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(LazyStore::new(true, flaky_opener(0, opened.clone())));
    assert!(store.isolates_users(), "known without connecting");
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = store.clone();
            tokio::spawn(async move { s.load(&ThreadRef::new(format!("t{i}"), "u")).await.map(|c| c.is_none()) })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap().unwrap());
    }
    assert_eq!(opened.load(Ordering::SeqCst), 1);
}
