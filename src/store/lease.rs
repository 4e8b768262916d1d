//! Thread leases and fencing: the storage half. One row per thread holds the current holder, its
//! expiry and a fencing token that rises with every new holder. Every durable write of a run (a
//! step, a ledger record, an intent record) names the token it holds and is refused once the row
//! carries a newer one, so a worker that was paused past its lease cannot write anything.
//!
//! Tokens come from one counter for the whole store, not from the row: a row nobody holds goes
//! with its thread (`clean_thread`, `prune`), and a thread id used again still never gets back a
//! token that a stalled run of its earlier life may hold. A write whose row is gone is refused.
//!
//! The backends store and compare; deciding whether a holder is dead (its process is gone on this
//! machine) is the engine's job (`engine::lease`), which then asks to `steal` a specific token.

use serde::Serialize;
use std::time::Duration;

/// Who asks for a lease. `host` identifies the machine and PID namespace, so a holder on this
/// machine can be checked for liveness by `pid` and `pid_start` (its start time in clock ticks).
#[derive(Debug, Clone)]
pub struct LeaseRequest {
    /// Who holds it: the run's id, shown to the thread's owner when the thread is busy.
    pub holder: String,
    /// The machine and PID namespace of the holder's process.
    pub host: String,
    /// The holder's process id on `host`.
    pub pid: i64,
    /// The holder's process start time (clock ticks), so a reused pid is not taken for it.
    pub pid_start: i64,
    /// How long the lease lasts unless renewed.
    pub ttl: Duration,
    /// Take the lease even though it has not expired, if its token is still this one (the engine
    /// found its holder dead).
    pub steal: Option<i64>,
    /// The run's user. Under user isolation a thread another user owns is refused
    /// (`StoreError::Forbidden`) in the same transaction as the take, and its lease row is left
    /// as it was: a non-owner's run must not move the owner's fencing token or holder. None:
    /// no owner check (a caller outside a run, or tests of the lease itself).
    pub user_id: Option<String>,
    /// The run carries a `config["authz"]` owner scope (`ThreadRef::owner_scoped`): `user_id` is
    /// checked as under user isolation, whatever the store's setting.
    pub owner_scoped: bool,
}

/// The lease row as seen now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseInfo {
    /// The fencing token: rises with every new holder. Tokens come from one counter for the whole
    /// store, so a thread deleted with its lease row and used again never gets back a token of its
    /// earlier life.
    pub token: i64,
    /// The holder's id (`LeaseRequest::holder`).
    pub holder: String,
    /// The holder's machine (`LeaseRequest::host`).
    pub host: String,
    /// The holder's process id.
    pub pid: i64,
    /// The holder's process start time (clock ticks).
    pub pid_start: i64,
    /// Seconds until expiry (negative once expired).
    pub expires_in: f64,
    /// Freed by its holder (the run ended); a released lease is free at once.
    pub released: bool,
}

impl LeaseInfo {
    /// Held by somebody: neither released nor expired.
    pub fn is_live(&self) -> bool {
        !self.released && self.expires_in > 0.0
    }
}

/// The answer to `lease_acquire`: taken, with the new token, or held by somebody else.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseAttempt {
    /// The lease is the caller's until it expires; every write of the run carries `token`.
    Acquired {
        /// The new fencing token: greater than every earlier one of the thread.
        token: i64,
    },
    /// Somebody else holds it (live and not stolen): nothing changed.
    Held(LeaseInfo),
}

/// Whether `req` may take over the lease currently described by `cur`.
pub fn may_take(cur: Option<&LeaseInfo>, req: &LeaseRequest) -> bool {
    match cur {
        None => true,
        Some(c) => !c.is_live() || req.steal == Some(c.token),
    }
}

/// The fencing rule, for backends that compare in Rust: a write carrying `fence` is allowed only
/// while the thread's lease row still has that token. No fence: a write from outside a run.
pub fn fence_ok(current_token: Option<i64>, fence: Option<i64>) -> bool {
    match fence {
        None | Some(THREAD_MUST_EXIST) => true,
        Some(f) => current_token == Some(f),
    }
}

/// A ledger write's fence that checks no token but, like every fenced ledger write, needs its
/// thread: a result a run records after it stopped waiting (a sync tool past its deadline, a
/// result recorded as its run is cancelled). Whoever holds the thread now, the side effect
/// happened; but a thread deleted meanwhile must stay deleted. Tokens start at 1.
pub const THREAD_MUST_EXIST: i64 = 0;

/// What `prune` may remove. Nothing a pending interrupt, an unfinished run or a held lease needs is
/// ever removed: only threads whose latest state is `completed` lose ledger rows or the thread.
#[derive(Debug, Clone, Default)]
pub struct PruneRules {
    /// Keep at most this many state versions per thread (at least 1: the latest always stays).
    pub keep_versions: Option<i64>,
    /// Delete completed threads (with their messages and ledger) not updated for this many seconds.
    pub finished_older_than: Option<f64>,
    /// Delete ledger rows of completed threads recorded more than this many seconds ago.
    pub ledger_ttl: Option<f64>,
    /// Count what would go, change nothing.
    pub dry_run: bool,
}

/// What `prune` removed or, with `dry_run`, would remove: exactly the same numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PruneReport {
    /// State rows deleted by `keep_versions`.
    pub state_versions: u64,
    /// Threads deleted by `finished_older_than` (with their states, messages and ledger).
    pub threads: u64,
    /// Ledger rows deleted, by either rule, each counted once.
    pub ledger_rows: u64,
    /// Expired cache entries deleted (every prune; reads already skipped them).
    pub cache_entries: u64,
    /// True when nothing was deleted (the rules' `dry_run`).
    pub dry_run: bool,
    /// True when `finished_older_than` or `ledger_ttl` left a completed thread whose latest state
    /// 10xGraph wrote because its Redis was not given or did not answer (PostgreSQL; its entry
    /// may hold a run under way that the rows do not show).
    pub legacy_unchecked: bool,
}

/// The `__kind__` of a ledger row written before its tool runs (an intent record). A row of this
/// kind is not a result: completing the call replaces it, and a replay that finds it knows the call
/// started but cannot know whether it took effect.
pub const INTENT_KIND: &str = "started";

/// True for an intent record (`__kind__` is `INTENT_KIND`): a call that started and has no result.
pub fn is_intent(v: &serde_json::Value) -> bool {
    v.get("__kind__").and_then(serde_json::Value::as_str) == Some(INTENT_KIND)
}

/// `is_intent` of a row kept as text: only its `__kind__` is read (the rest is skipped, not
/// built). A text that is not an object is not an intent.
pub fn is_intent_text(raw: &serde_json::value::RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "__kind__", borrow, default)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    // A derived struct also reads a JSON array (by position): only an object may be a record.
    raw.get().trim_start().starts_with('{')
        && serde_json::from_str::<Kind<'_>>(raw.get()).is_ok_and(|k| k.kind.as_deref() == Some(INTENT_KIND))
}

/// An intent record of a call that reached `interrupt()` and paused cleanly with its run: a pause,
/// not a crash. The resumed run marks it started again before running the call.
pub fn is_paused(v: &serde_json::Value) -> bool {
    is_intent(v) && v.get("paused").and_then(serde_json::Value::as_bool) == Some(true)
}

/// Whether a stored state says its run completed: the only state `prune` may clear around.
pub fn is_completed_state(state: &serde_json::Value) -> bool {
    state.pointer("/execution_meta/status").and_then(serde_json::Value::as_str) == Some("completed")
}

/// Whether a stored state says a run is under way: what `running_threads` lists (recovery's
/// candidates; whether the run is alive is the lease's question).
pub fn is_running_state(state: &serde_json::Value) -> bool {
    state.pointer("/execution_meta/status").and_then(serde_json::Value::as_str) == Some("running")
}

#[cfg(test)]
mod tests {
    use super::{INTENT_KIND, is_intent, is_intent_text};
    use serde_json::json;

    #[test]
    fn an_intent_read_from_text_agrees_with_one_read_from_a_value() {
        for v in [
            json!({"__kind__": INTENT_KIND, "tool": "pay"}),
            json!({"tool": "pay", "__kind__": INTENT_KIND, "paused": true}),
            json!({"__kind__": "message", "value": {"__kind__": INTENT_KIND}}),
            json!({"__kind__": "raw", "value": 1}),
            json!([INTENT_KIND]),
            json!(INTENT_KIND),
            json!({}),
        ] {
            let raw = serde_json::value::to_raw_value(&v).unwrap();
            assert_eq!(is_intent_text(&raw), is_intent(&v), "{v}");
        }
        let escaped = serde_json::value::RawValue::from_string(r#"{"__kind__": "started"}"#.into()).unwrap();
        assert!(is_intent_text(&escaped));
    }
}
