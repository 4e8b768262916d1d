//! Failpoints: exact crash points for crash-replay tests (ours and users'). Off unless armed by
//! the `TENXGRAPH_FAILPOINTS` environment variable or a run's `failpoints` config; when off, a
//! check is one `Option` test.
//!
//! Syntax: `point[:target][@n]=action`, several separated by `;`.
//! Points: `before_tool`, `after_tool` (returned, ledger row not yet committed), `after_record`
//! (ledger row committed, step not yet committed), `after_step`, `in_step_tx` (inside the step's
//! transaction, before COMMIT), `mid_stream`, `lease_renew` (before each lease renewal; `raise`
//! skips that renewal, as a network partition would, so the lease can expire under a live run),
//! `after_lease` (the run's lease is committed; the run has not loaded the thread yet; a run with
//! it armed takes its lease before it loads), `before_input_tx` (the run loaded the thread without
//! its lease and is about to take the lease and commit its input in one transaction).
//! Target: a tool name for the tool points, the thread id for the lease points, a node name for the
//! others. `@n`: the n-th matching hit (default 1). Actions: `kill`, `raise`, `delay(MS)`.
//! The intent window of an at-most-once tool is `after_tool` (it ran; only its intent record is
//! in the ledger); `before_tool` fires after the intent record, before the tool is called.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Every failpoint name a spec may use.
pub const POINTS: &[&str] = &[
    "before_tool",
    "after_tool",
    "after_record",
    "after_step",
    "in_step_tx",
    "mid_stream",
    "lease_renew",
    "after_lease",
    "before_input_tx",
];

/// What a failpoint does when it fires.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// SIGKILL this process: no destructor, flush or atexit runs.
    Kill,
    /// Fail with `Fired` (Python: `FailpointError` FAILPOINT_001).
    Raise,
    /// Sleep this long, then go on.
    Delay(Duration),
}

#[derive(Debug)]
struct Entry {
    point: String,
    target: Option<String>,
    nth: u32,
    action: Action,
    hits: AtomicU32,
}

/// A parsed set of failpoints with their hit counters.
#[derive(Debug, Default)]
pub struct Failpoints {
    entries: Vec<Entry>,
}

/// A `raise` failpoint fired.
#[derive(Debug, Clone, thiserror::Error)]
#[error("failpoint {point} fired{}", target.as_ref().map(|t| format!(" at {t}")).unwrap_or_default())]
pub struct Fired {
    /// The failpoint that fired.
    pub point: String,
    /// The tool, node or thread it fired at.
    pub target: Option<String>,
}

impl Failpoints {
    /// Parses `point[:target][@n]=action;...`; an unknown point, a bad `@n` or action is an error
    /// naming the entry.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut entries = vec![];
        for raw in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (lhs, action) =
                raw.split_once('=').ok_or_else(|| format!("failpoint {raw:?}: expected point=action"))?;
            let action = match action.trim() {
                "kill" => Action::Kill,
                "raise" => Action::Raise,
                a if a.starts_with("delay(") && a.ends_with(')') => {
                    let ms: u64 =
                        a[6..a.len() - 1].trim().parse().map_err(|_| format!("failpoint {raw:?}: bad delay"))?;
                    Action::Delay(Duration::from_millis(ms))
                }
                other => return Err(format!("failpoint {raw:?}: unknown action {other:?} (kill, raise, delay(MS))")),
            };
            let (lhs, nth) = match lhs.split_once('@') {
                Some((l, n)) => (
                    l,
                    n.trim()
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| format!("failpoint {raw:?}: bad @n"))?,
                ),
                None => (lhs, 1),
            };
            let (point, target) = match lhs.split_once(':') {
                Some((p, t)) => (p.trim(), Some(t.trim().to_owned())),
                None => (lhs.trim(), None),
            };
            if !POINTS.contains(&point) {
                return Err(format!("failpoint {raw:?}: unknown point {point:?} (one of {POINTS:?})"));
            }
            entries.push(Entry { point: point.to_owned(), target, nth, action, hits: AtomicU32::new(0) });
        }
        Ok(Failpoints { entries })
    }

    /// The process-wide set from `TENXGRAPH_FAILPOINTS`, parsed once; None when unset or empty.
    pub fn from_env() -> Option<Arc<Failpoints>> {
        static ENV: OnceLock<Option<Arc<Failpoints>>> = OnceLock::new();
        ENV.get_or_init(|| {
            let spec = std::env::var("TENXGRAPH_FAILPOINTS").ok()?;
            match Failpoints::parse(&spec) {
                Ok(f) if !f.entries.is_empty() => {
                    tracing::warn!("failpoints armed from TENXGRAPH_FAILPOINTS: {spec}");
                    Some(Arc::new(f))
                }
                Ok(_) => None,
                Err(e) => {
                    tracing::error!("ignoring TENXGRAPH_FAILPOINTS: {e}");
                    None
                }
            }
        })
        .clone()
    }

    /// Whether an entry names `point` for `target` (or for every target).
    fn arms(&self, point: &str, target: &str) -> bool {
        self.entries.iter().any(|e| e.point == point && e.target.as_deref().is_none_or(|t| t == target))
    }

    /// Fires the matching entries: kills the process, returns `Err(Fired)`, or sleeps.
    pub async fn hit(&self, point: &str, target: &str) -> Result<(), Fired> {
        for e in &self.entries {
            if e.point != point || e.target.as_deref().is_some_and(|t| t != target) {
                continue;
            }
            if e.hits.fetch_add(1, Ordering::SeqCst) + 1 != e.nth {
                continue;
            }
            tracing::warn!(point, target, "failpoint fired: {:?}", e.action);
            match &e.action {
                Action::Kill => kill_self(),
                Action::Raise => return Err(Fired { point: point.to_owned(), target: Some(target.to_owned()) }),
                Action::Delay(d) => tokio::time::sleep(*d).await,
            }
        }
        Ok(())
    }
}

/// The failpoints in force for one run: the environment's and the run's own.
#[derive(Debug, Clone, Default)]
pub struct Armed {
    sets: Vec<Arc<Failpoints>>,
}

impl Armed {
    /// The environment's set and the run's, checked in that order.
    pub fn new(env: Option<Arc<Failpoints>>, run: Option<Arc<Failpoints>>) -> Self {
        Armed { sets: env.into_iter().chain(run).collect() }
    }

    /// No failpoint is armed (every `hit` returns at once).
    pub fn is_off(&self) -> bool {
        self.sets.is_empty()
    }

    /// Whether `point` is armed for `target` in any set.
    pub fn arms(&self, point: &str, target: &str) -> bool {
        self.sets.iter().any(|s| s.arms(point, target))
    }

    /// Fires every matching armed entry: `kill` ends the process with SIGKILL, `raise` returns
    /// `Fired`, `delay` sleeps.
    pub async fn hit(&self, point: &str, target: &str) -> Result<(), Fired> {
        for s in &self.sets {
            s.hit(point, target).await?;
        }
        Ok(())
    }
}

fn kill_self() -> ! {
    // SIGKILL: no destructor, no flush, no atexit: exactly what a crash looks like.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let f =
            Failpoints::parse("after_tool:charge_card@2=kill; before_tool=delay(5);in_step_tx:model=raise").unwrap();
        assert_eq!(f.entries.len(), 3);
        assert_eq!(f.entries[0].nth, 2);
        assert_eq!(f.entries[1].action, Action::Delay(Duration::from_millis(5)));
        for bad in ["nowhere=kill", "after_tool=explode", "after_tool@0=kill", "after_tool", "before_tool=delay(x)"] {
            assert!(Failpoints::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn fires_on_the_nth_matching_hit_only() {
        let f = Failpoints::parse("after_step:b@2=raise").unwrap();
        assert!(f.hit("after_step", "a").await.is_ok());
        assert!(f.hit("after_step", "b").await.is_ok());
        assert!(f.hit("after_tool", "b").await.is_ok());
        let e = f.hit("after_step", "b").await.unwrap_err();
        assert_eq!(e.point, "after_step");
        assert!(f.hit("after_step", "b").await.is_ok());
    }
}
