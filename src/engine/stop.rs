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

    /// The signal a run on `key` waits on; runs on the same key share one.
    pub fn subscribe(&self, key: &str) -> Arc<StopSignal> {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(key.to_owned()).or_default().clone()
    }

    /// Wakes a run of this process on `key`.
    pub fn signal(&self, key: &str) {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.get(key) {
            s.raised.store(true, Ordering::Release);
            s.notify.notify_waiters();
        }
    }

    /// A run on `key` ended; the entry goes when no other run still holds it.
    pub fn release(&self, key: &str, s: &Arc<StopSignal>) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        // Only drop the entry if no other run of the same key still holds it.
        if Arc::strong_count(s) <= 2 {
            m.remove(key);
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
