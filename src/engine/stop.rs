//! Stop requests. A request is stored in the checkpointer's cache (so another process sees it on
//! its next poll) and signalled in-process at once, so a run in this process stops without waiting
//! for a poll, and a run that nobody signalled asks the store at most once per poll interval.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::Notify;

/// The cache namespace stop requests are stored under (10xGraph's).
pub const STOP_NAMESPACE: &str = "stop_request";

/// The key of a stop request: `"<thread_id>:<user_id>"`, as 10xGraph writes it, for ids without
/// `:` or `%`. 10xGraph's key is ambiguous: thread `a` of user `b:c` and thread `a:b` of user `c`
/// shared `a:b:c`, so one user's stop stopped the other's run. An id holding `:` or `%` has them
/// percent-encoded (`%3A`, `%25`), which makes the key name one (thread, user) pair only and
/// keeps 10xGraph's key, so its stop requests in a shared cache, for every other id.
pub fn stop_key(thread_id: &str, user_id: &str) -> String {
    crate::store::pair_key(thread_id, user_id)
}

/// The in-process half of a stop request for one `thread_id:user_id`.
#[derive(Default)]
pub struct StopSignal {
    /// Woken by `StopSignals::signal`.
    pub notify: Notify,
    raised: AtomicBool,
}

impl StopSignal {
    /// True once after `signal()`; the caller then confirms against the store.
    pub fn take_raised(&self) -> bool {
        self.raised.swap(false, Ordering::AcqRel)
    }
}

/// Process-wide registry of running runs' stop signals, keyed `thread_id:user_id`.
#[derive(Default)]
pub struct StopSignals {
    map: Mutex<HashMap<String, Arc<StopSignal>>>,
}

impl StopSignals {
    /// The registry of this process.
    pub fn global() -> &'static StopSignals {
        static G: OnceLock<StopSignals> = OnceLock::new();
        G.get_or_init(StopSignals::default)
    }

    /// The signal a run on `key` waits on; runs on the same key share one. The entry goes when
    /// the last `Subscription` of the key is dropped: when its run ends, and also when the run's
    /// future is dropped mid-way (a caller's `wait_for`, `task.cancel()`, a closed stream), which
    /// never reaches the code after its last await. Released only at the end of the run, every
    /// cancelled run left its key in this map for the life of the process.
    pub fn subscribe(&'static self, key: &str) -> Subscription {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let signal = m.entry(key.to_owned()).or_default().clone();
        Subscription { signals: self, key: key.to_owned(), signal: Some(signal) }
    }

    /// Wakes a run of this process on `key`.
    pub fn signal(&self, key: &str) {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.get(key) {
            s.raised.store(true, Ordering::Release);
            s.notify.notify_waiters();
        }
    }

    /// A run on `key` ended (or was dropped); the entry goes when no other run still holds it.
    /// The run's own reference is dropped under the map's lock, where every subscribe and release
    /// happens, so the count is exact: two runs of one key ending at once could both see the
    /// other's reference before (and neither removed the entry).
    fn release(&self, key: &str, s: Arc<StopSignal>) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        drop(s);
        if m.get(key).is_some_and(|e| Arc::strong_count(e) == 1) {
            m.remove(key);
        }
    }
}

/// A run's hold on its key's [`StopSignal`]; released on drop.
pub struct Subscription {
    signals: &'static StopSignals,
    key: String,
    signal: Option<Arc<StopSignal>>,
}

impl Subscription {
    /// The signal the run waits on.
    pub fn signal(&self) -> &Arc<StopSignal> {
        self.signal.as_ref().expect("held until dropped")
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(s) = self.signal.take() {
            self.signals.release(&self.key, s);
        }
    }
}

#[cfg(test)]
mod key_tests {
    use super::stop_key;

    #[test]
    fn ids_without_colons_keep_10xgraphs_key() {
        assert_eq!(stop_key("t1", "alice"), "t1:alice");
    }

    #[test]
    fn a_colon_in_either_id_cannot_make_two_pairs_share_a_key() {
        assert_ne!(stop_key("a", "b:c"), stop_key("a:b", "c"));
        assert_eq!(stop_key("a:b", "c"), "a%3Ab:c");
        assert_ne!(stop_key("a%3Ab", "c"), stop_key("a:b", "c"));
    }
}

#[cfg(test)]
mod subscription_tests {
    use super::StopSignals;

    fn held(key: &str) -> bool {
        StopSignals::global().map.lock().unwrap().contains_key(key)
    }

    #[test]
    fn the_entry_lives_while_any_run_of_the_key_holds_it() {
        let a = StopSignals::global().subscribe("sub-test-two");
        let b = StopSignals::global().subscribe("sub-test-two");
        assert!(std::sync::Arc::ptr_eq(a.signal(), b.signal()));
        drop(a);
        assert!(held("sub-test-two"));
        drop(b);
        assert!(!held("sub-test-two"));
    }

    #[test]
    fn a_run_future_dropped_mid_await_releases_its_key() {
        // A caller's cancel drops the run's future where it waits: the code after that await
        // never runs, so the release must be the subscription's drop.
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let run = async {
                let _sub = StopSignals::global().subscribe("sub-test-cancel");
                std::future::pending::<()>().await;
            };
            let timed_out = tokio::time::timeout(std::time::Duration::from_millis(5), run).await;
            assert!(timed_out.is_err());
        });
        assert!(!held("sub-test-cancel"));
    }
}
