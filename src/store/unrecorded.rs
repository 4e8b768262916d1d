//! Results of tool calls that finished in this process but could not be recorded (the ledger
//! write and the step that carried it both failed: a server that turned read-only, a disk that
//! filled, the connection lost at the commit). A store keeps them so that the next attempt of the
//! thread in this process, on this store, replays them (and records them then) instead of running
//! the call again (an idempotent call ran twice, an at-most-once one was answered "outcome
//! unknown" although its result was in memory). Another process cannot see them: there, as after
//! a crash, the call's class decides. Per store, not per process: two stores (two databases) may
//! hold threads, message and call ids that are the same.
//!
//! What the ledger holds always wins: a result kept here is used only where the ledger has no
//! result for the call (nothing, or the call's own started or paused row), and it is written with
//! the ledger's first-result-wins rule. A recorder task tries to write them while the process
//! lives, and closing the store tries once more (`engine::record_kept`), so that a resume in
//! another process finds them; a result written that way stays kept, marked recorded, because
//! the thread's next attempt here may have read the ledger before the write. Dropped once the thread's tool node commits (its calls are
//! answered in the state then) or the thread is deleted or cleared. Bounded: past [`CAPACITY`]
//! results or [`MAX_BYTES`] of them the oldest is dropped, with a warning; a process that cannot
//! write its ledger for that long has bigger trouble.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ThreadRef;

const CAPACITY: usize = 1000;
/// The kept envelopes' size as JSON text, at most (a result can be megabytes).
#[cfg(not(test))]
const MAX_BYTES: usize = 64 << 20;
#[cfg(test)]
const MAX_BYTES: usize = 1 << 20;

/// (thread id, user id, ledger key).
type Key = (String, String, String);

/// A kept result: its envelope and its tool's name (for the log lines).
#[derive(Debug, Clone)]
pub struct Unrecorded {
    /// The call's ledger envelope, as it would have been recorded.
    pub envelope: super::SharedJson,
    /// The tool's name.
    pub tool: String,
}

struct Entry {
    result: Unrecorded,
    /// Its envelope's size.
    size: usize,
    /// Written to the ledger since it was kept (see the module).
    recorded: bool,
    /// The run's call was owner-scoped (`ThreadRef::owner_scoped`): so is the write of it.
    scoped: bool,
}

#[derive(Default)]
struct Kept {
    /// Each result.
    rows: HashMap<Key, Entry>,
    /// The sum of the sizes.
    bytes: usize,
    /// Insertion order, for the bound (a key taken out may still be listed: skipped then).
    order: VecDeque<Key>,
}

/// One store's kept results (see the module).
#[derive(Default)]
pub struct UnrecordedResults {
    kept: Mutex<Kept>,
    /// How many results are kept: the tool handler's path skips the lock while it is zero.
    count: AtomicUsize,
    /// How many of them are not recorded yet.
    pending: AtomicUsize,
    /// A recorder task is running for this store (`engine::spawn_kept_recorder`).
    pub recorder: std::sync::atomic::AtomicBool,
    /// The store is closing: a recorder stops (the close makes the last try).
    pub closing: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for UnrecordedResults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UnrecordedResults({})", self.count.load(Ordering::Relaxed))
    }
}

impl Kept {
    fn remove(&mut self, k: &Key) -> Option<Unrecorded> {
        let e = self.rows.remove(k)?;
        self.bytes -= e.size;
        Some(e.result)
    }

    fn pending(&self) -> usize {
        self.rows.values().filter(|e| !e.recorded).count()
    }

    /// Keys taken out stay in `order` until here: dropped once they are most of it.
    fn compact_order(&mut self) {
        if self.order.len() > 2 * self.rows.len() + 16 {
            let rows = &self.rows;
            self.order.retain(|k| rows.contains_key(k));
        }
    }
}

fn key(t: &ThreadRef, ledger_key: &str) -> Key {
    (t.thread_id.clone(), t.user_id.clone(), ledger_key.to_owned())
}

impl UnrecordedResults {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn counted(&self, kept: &Kept) {
        self.count.store(kept.rows.len(), Ordering::Release);
        self.pending.store(kept.pending(), Ordering::Release);
    }

    /// How many kept results are not recorded yet.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Keeps the result of a call of thread `t` that completed but could not be recorded.
    pub fn keep(&self, t: &ThreadRef, ledger_key: &str, result: Unrecorded) {
        let size = result.envelope.get().len();
        let mut kept = self.lock();
        let k = key(t, ledger_key);
        kept.bytes += size;
        match kept.rows.insert(k.clone(), Entry { result, size, recorded: false, scoped: t.owner_scoped }) {
            Some(old) => kept.bytes -= old.size,
            None => kept.order.push_back(k),
        }
        while kept.rows.len() > CAPACITY || kept.bytes > MAX_BYTES {
            let Some(oldest) = kept.order.pop_front() else { break };
            // One the ledger has already (recorded since) goes without a word.
            let recorded = kept.rows.get(&oldest).is_some_and(|e| e.recorded);
            if kept.remove(&oldest).is_some() && !recorded {
                tracing::warn!(
                    thread_id = %oldest.0,
                    ledger_key = %oldest.2,
                    event = "unrecorded_result_dropped",
                    "more than {CAPACITY} tool results, or {} MiB of them, could not be recorded; the oldest is no \
                     longer kept, and a replay of its node may run the call again",
                    MAX_BYTES >> 20
                );
            }
        }
        self.counted(&kept);
    }

    /// Drops what is kept for thread `thread_id` (deleted: its ledger went with it, and a thread
    /// made again under its id must not be answered with the old one's results).
    pub fn forget_thread(&self, thread_id: &str) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut kept = self.lock();
        let gone: Vec<Key> = kept.rows.keys().filter(|k| k.0 == thread_id).cloned().collect();
        for k in &gone {
            kept.remove(k);
        }
        kept.compact_order();
        self.counted(&kept);
    }

    /// The kept results of thread `t`'s `keys` that `recorded` says the ledger has no result
    /// for, taken out.
    pub fn take(
        &self,
        t: &ThreadRef,
        keys: &[Option<String>],
        recorded: impl Fn(&str) -> bool,
    ) -> HashMap<String, Unrecorded> {
        if self.count.load(Ordering::Acquire) == 0 {
            return HashMap::new();
        }
        let mut kept = self.lock();
        let mut out = HashMap::new();
        for k in keys.iter().flatten() {
            if recorded(k) {
                continue;
            }
            if let Some(r) = kept.remove(&key(t, k)) {
                out.insert(k.clone(), r);
            }
        }
        kept.compact_order();
        self.counted(&kept);
        out
    }

    /// Drops thread `t`'s `keys` (the store refused them by its rules: the thread is gone, or is
    /// another user's).
    pub fn drop_keys<'k>(&self, t: &ThreadRef, keys: impl IntoIterator<Item = &'k str>) {
        let mut kept = self.lock();
        for k in keys {
            kept.remove(&key(t, k));
        }
        kept.compact_order();
        self.counted(&kept);
    }

    /// Copies of the results not recorded yet, by thread and user (owner-scoped where any of the
    /// runs that kept them was), oldest first.
    pub fn pending_rows(&self) -> Vec<(ThreadRef, Vec<(String, Unrecorded)>)> {
        if self.pending() == 0 {
            return Vec::new();
        }
        let kept = self.lock();
        let mut out: Vec<(ThreadRef, Vec<(String, Unrecorded)>)> = Vec::new();
        let mut index: HashMap<(&str, &str), usize> = HashMap::new();
        for k in &kept.order {
            let Some(e) = kept.rows.get(k).filter(|e| !e.recorded) else { continue };
            let at = *index.entry((k.0.as_str(), k.1.as_str())).or_insert_with(|| {
                out.push((ThreadRef::new(k.0.clone(), k.1.clone()), Vec::new()));
                out.len() - 1
            });
            out[at].0.owner_scoped |= e.scoped;
            out[at].1.push((k.2.clone(), e.result.clone()));
        }
        out
    }

    /// Marks thread `t`'s `keys` recorded, where they are still kept.
    pub fn mark_recorded<'k>(&self, t: &ThreadRef, keys: impl IntoIterator<Item = &'k str>) {
        let mut kept = self.lock();
        for k in keys {
            if let Some(e) = kept.rows.get_mut(&key(t, k)) {
                e.recorded = true;
            }
        }
        self.counted(&kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(id: &str) -> ThreadRef {
        ThreadRef::new(id, "u")
    }

    #[test]
    fn a_kept_result_is_taken_once_only_where_the_ledger_has_none_and_the_oldest_goes_first() {
        let kept = UnrecordedResults::default();
        let r = |v: i64| Unrecorded {
            envelope: crate::store::shared_json(&serde_json::Value::from(v)),
            tool: "pay".into(),
        };
        kept.keep(&thread("t"), "k1", r(1));
        kept.keep(&thread("t"), "k2", r(2));
        let keys = [Some("k1".to_owned()), Some("k2".to_owned()), None];
        let got = kept.take(&thread("t"), &keys, |k| k == "k2");
        assert_eq!(got.keys().collect::<Vec<_>>(), ["k1"]);
        assert!(kept.take(&thread("t"), &keys, |_| false).contains_key("k2"), "k2 stayed while the ledger had it");
        assert!(kept.take(&thread("t"), &keys, |_| false).is_empty(), "taken once");
        assert!(kept.take(&thread("other"), &keys, |_| false).is_empty());
        for i in 0..CAPACITY + 5 {
            kept.keep(&thread("t"), &format!("n{i}"), r(i as i64));
        }
        let first = [Some("n0".to_owned()), Some(format!("n{}", CAPACITY + 4))];
        let got = kept.take(&thread("t"), &first, |_| false);
        assert!(!got.contains_key("n0") && got.contains_key(&format!("n{}", CAPACITY + 4)));
        let big = |n: usize| Unrecorded {
            envelope: crate::store::shared_json(&serde_json::Value::from("x".repeat(n))),
            tool: "pay".into(),
        };
        let by_size = UnrecordedResults::default();
        for i in 0..3 {
            by_size.keep(&thread("t"), &format!("b{i}"), big(MAX_BYTES / 3 + 10));
        }
        let all: Vec<_> = (0..3).map(|i| Some(format!("b{i}"))).collect();
        let got = by_size.take(&thread("t"), &all, |_| false);
        assert!(!got.contains_key("b0") && got.contains_key("b1") && got.contains_key("b2"), "bounded by bytes");
        kept.keep(&thread("gone"), "k", r(1));
        kept.forget_thread("gone");
        assert!(kept.take(&thread("gone"), &[Some("k".to_owned())], |_| false).is_empty());
        assert!(!kept.take(&thread("t"), &[Some("n10".to_owned())], |_| false).is_empty(), "other threads kept");
    }

    #[test]
    fn pending_rows_group_by_thread_and_user_oldest_first_until_marked_recorded() {
        let kept = UnrecordedResults::default();
        let r =
            |v: i64| Unrecorded { envelope: crate::store::shared_json(&serde_json::Value::from(v)), tool: "t".into() };
        kept.keep(&thread("a"), "k1", r(1));
        kept.keep(&ThreadRef::new("a", "other"), "k1", r(2));
        kept.keep(&thread("b"), "k2", r(3));
        kept.keep(&thread("a"), "k3", r(4));
        kept.take(&thread("b"), &[Some("k2".to_owned())], |_| false);
        let shape = |k: &UnrecordedResults| -> Vec<(String, String, Vec<String>)> {
            k.pending_rows()
                .into_iter()
                .map(|(t, rows)| (t.thread_id, t.user_id, rows.into_iter().map(|(k, _)| k).collect()))
                .collect()
        };
        let s = |x: &str| x.to_owned();
        assert_eq!(shape(&kept), [(s("a"), s("u"), vec![s("k1"), s("k3")]), (s("a"), s("other"), vec![s("k1")])]);
        assert_eq!(kept.pending(), 3);
        kept.mark_recorded(&thread("a"), ["k1", "k3", "missing"]);
        assert_eq!(shape(&kept), [(s("a"), s("other"), vec![s("k1")])]);
        assert_eq!(kept.pending(), 1);
        let got = kept.take(&thread("a"), &[Some("k1".to_owned())], |_| false);
        assert!(
            got.contains_key("k1"),
            "a recorded result stays kept for an attempt that read the ledger before the write"
        );
        kept.keep(&thread("a"), "k3", r(5));
        assert_eq!(kept.pending(), 2, "kept again: pending again");
        kept.keep(&thread("s").scoped(true), "k4", r(6));
        let scoped: Vec<_> = kept.pending_rows().into_iter().map(|(t, _)| (t.thread_id, t.owner_scoped)).collect();
        assert_eq!(scoped, [(s("a"), false), (s("a"), false), (s("s"), true)]);
        kept.drop_keys(&thread("a"), ["k3"]);
        kept.drop_keys(&ThreadRef::new("a", "other"), ["k1"]);
        assert_eq!(kept.pending(), 1, "only the keys named went");
        assert!(kept.take(&thread("s"), &[Some("k4".to_owned())], |_| false).contains_key("k4"), "other keys stay");
    }
}
