//! A server that refuses writes as read-only (SQLSTATE 25006): a standby after a failover, or a
//! database an operator (or a managed service, on a full disk) set to
//! `default_transaction_read_only`.
//!
//! Such a setting is read when a session starts, so a connection opened while it held stays
//! read-only for its whole life: with the pool's connections kept for minutes, a process failed
//! every write long after the server took them again (until a restart). So such sessions are
//! retired: they are closed when they next pass through the pool (out of it or back into it) or
//! the spare list, and the next statement opens a session that reads the server's setting afresh.
//! Retired: every session opened before a refused write, and, once a write was refused, every
//! session found read-only when it opened (`after_connect`), which is then used for the one
//! statement it was opened for. A session opened before the server turned read-only keeps
//! writing (the setting does not reach it), so it is left alone until a write is refused.
//!
//! Process-wide, not per store: `errors::map_err`, where every failure of every store passes,
//! does not know its store. What that costs another store of the process on another server: one
//! reconnect per connection, only after a refusal or a read-only session.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The process's reference instant, and the instant before which every session opened is retired,
/// as nanoseconds after it (0: none).
static BASE: OnceLock<Instant> = OnceLock::new();
static RETIRE_BEFORE: AtomicU64 = AtomicU64::new(0);

/// How far past a read-only session's opening the retirement mark is set: the pool stamps a
/// connection's birth after `after_connect` returns, so a mark set at that moment would fall
/// just before it. Sessions that open within this margin (writable ones too) are retired as well,
/// which costs them a reconnect.
const OPENING_MARGIN: Duration = Duration::from_secs(1);

fn base() -> Instant {
    *BASE.get_or_init(Instant::now)
}

fn retire_before(until: Instant) {
    let nanos = until.saturating_duration_since(base()).as_nanos().clamp(1, u64::MAX as u128) as u64;
    RETIRE_BEFORE.fetch_max(nanos, Ordering::AcqRel);
}

/// A write was refused as read-only: every session opened before now is retired.
pub(super) fn note_refusal() {
    retire_before(Instant::now());
}

/// A session was read-only when it opened: it is retired after the statement it was opened for,
/// once a write of the process has been refused. Before that, nothing here expects to write: a
/// store kept for reads on a read-only server (a replica behind a dashboard) keeps its sessions
/// instead of opening one per statement.
pub(super) fn note_read_only_session() {
    if RETIRE_BEFORE.load(Ordering::Acquire) != 0 {
        retire_before(Instant::now() + OPENING_MARGIN);
    }
}

/// Whether something that began at `start` began before the retirement mark (for a connection:
/// its session may be read-only).
pub(super) fn before_retirement(start: Instant) -> bool {
    match RETIRE_BEFORE.load(Ordering::Acquire) {
        0 => false,
        nanos => start < base() + Duration::from_nanos(nanos),
    }
}

/// Whether a connection opened `age` ago is retired.
pub(super) fn retired(age: Duration) -> bool {
    Instant::now().checked_sub(age).is_some_and(before_retirement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_opened_before_a_refusal_or_read_only_are_retired() {
        if RETIRE_BEFORE.load(Ordering::Acquire) == 0 {
            note_read_only_session();
            assert!(!retired(Duration::ZERO), "no write refused yet: a read-only session is kept (a replica's reader)");
        }
        let old = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        note_refusal();
        assert!(before_retirement(old), "a session from before the refusal is retired");
        std::thread::sleep(Duration::from_millis(5));
        assert!(!retired(Duration::ZERO), "one opened after it is kept");
        note_read_only_session();
        assert!(retired(Duration::ZERO), "the session that opened read-only is retired, though born after the mark");
        assert!(!before_retirement(Instant::now() + OPENING_MARGIN * 2), "and nothing opened well after");
    }
}
