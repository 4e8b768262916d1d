//! How many statements a store has at the server at once: a limit that follows their latency.
//!
//! Why: on a server with few cores, more busy connections than cores send the commits into a
//! convoy (a backend holding the WAL write lock is preempted, the others queue behind it). On the
//! 2-core benchmark machine, 64 concurrent threads ran 600-850 turns/s on 2-6 connections and
//! ~250 on 8-10, with the server's CPU per turn doubled (docs/benchmark-profile.md, session 20).
//! Where the knee lies depends on the server, which a client cannot see, and a fixed cap below the
//! pool would hold back a far or a large server; so the limit is adapted.
//!
//! Each window of [`WINDOW`] statements compares their mean time with the least window mean seen
//! lately (`base`, which drifts up slowly so it can follow a server that got slower for good). A
//! window at least [`QUEUEING`] times the base lowers the limit by one, down to half the pool (at
//! least [`MIN_LIMIT`]); windows close to the base in which most statements found every permit
//! taken raise it by one, up to the pool's size. A raise followed by a lowering within
//! [`VERDICT`] windows was a mistake (the step up was a convoy), and the next raise needs twice
//! as many such windows in a row (up to [`MAX_ROOMY_NEEDED`]); a raise that holds keeps the pace.
//! At 64 threads on two cores the limit was raised 4-24 times and lowered 9-29 times per 3-round
//! benchmark child, most steps up a window of convoy; with the doubling 1-7 and 6-12 (six A/B
//! pairs of release builds, docs/benchmark-profile.md, session 22; the turns/s moved within the
//! noise: medians 747 against 723).
//!
//! A statement that waited [`PATIENCE`] for a permit goes on without one. Not lower than half: a
//! statement can be slow for its own reasons (a row lock it waits for, up to the statement
//! deadline), and the statements of other threads must still find connections beside a few of
//! those. A single caller never meets the limit; statements to a far server, slow but not
//! queueing, keep the whole pool. Only single statements pass through here: a transaction
//! holds its connection across several statements and takes none of these permits, so no caller
//! ever waits for a permit while holding one.

use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The limit never goes below this, nor below half the pool.
pub(super) const MIN_LIMIT: usize = 2;
/// Statements per judgement.
const WINDOW: u32 = 32;
/// A window this many times slower than the base is queueing at the server.
const QUEUEING: f64 = 2.0;
/// A window within this factor of the base has room for one statement more.
const ROOM: f64 = 1.3;
/// How much the base rises per window when no quicker window comes.
const BASE_DRIFT: f64 = 1.002;
/// A lowering this many windows after a raise or sooner undoes it.
const VERDICT: u32 = 2;
/// The most roomy windows in a row a raise can need: one probe per 2,048 statements at worst.
const MAX_ROOMY_NEEDED: u32 = 64;
/// The longest a statement waits for a permit; then it goes on to the pool without one. Most
/// waits in the queue the gate keeps are a few milliseconds (64 threads on 5 permits: ~6 ms); a
/// wait this long means the permits are held by statements slow for their own reasons (row locks
/// they wait for, up to the statement deadline), or a burst. Without it, half the pool's
/// statements waiting on locks kept every other thread off the idle half of the pool until
/// `acquire_timeout` (red-team, session 21). A pass does not raise the limit: measured at 64
/// threads (release build, 2 x 3 rounds each), raising it on each pass gave 249-833 turns/s
/// against 649-1,025 without, the raises undoing the gate.
pub(super) const PATIENCE: Duration = Duration::from_millis(50);

pub(super) struct Gate {
    sem: Semaphore,
    max: usize,
    min: usize,
    state: Mutex<State>,
}

struct State {
    limit: usize,
    /// Permits to keep back as they come in: the limit was lowered while they were in use.
    owed: usize,
    /// The current window: statements, their total time, and how many found no permit free.
    n: u32,
    total: Duration,
    crowded: u32,
    /// The least window mean lately, in seconds.
    base: Option<f64>,
    /// Roomy, crowded windows in a row, how many a raise needs, and windows since the last raise.
    roomy: u32,
    needed: u32,
    since_raise: u32,
}

impl State {
    /// The limit one higher; returns whether a permit must be made for it (a permit still owed
    /// is simply not kept back instead).
    fn raise(&mut self) -> bool {
        self.limit += 1;
        self.roomy = 0;
        self.since_raise = 0;
        if self.owed > 0 {
            self.owed -= 1;
            false
        } else {
            true
        }
    }
}

/// One statement's permit: returned (or kept back) and its time counted when dropped.
pub(super) struct Ticket<'a> {
    gate: &'a Gate,
    permit: Option<SemaphorePermit<'a>>,
    started: std::time::Instant,
    crowded: bool,
}

impl Gate {
    pub(super) fn new(max: usize) -> Self {
        let max = max.max(1);
        Gate {
            sem: Semaphore::new(max),
            max,
            min: (max / 2).max(MIN_LIMIT).min(max),
            state: Mutex::new(State {
                limit: max,
                owed: 0,
                n: 0,
                total: Duration::ZERO,
                crowded: 0,
                base: None,
                roomy: 0,
                needed: 1,
                since_raise: u32::MAX,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a permit, at most `patience`: then the statement passes without one (its ticket
    /// counts nothing; see [`PATIENCE`]). Cancel-safe: a dropped wait takes nothing.
    pub(super) async fn enter(&self, patience: Duration) -> Ticket<'_> {
        let crowded = self.sem.available_permits() == 0;
        let m = crate::metrics::metrics();
        if crowded {
            crate::metrics::inc(&m.gate_waits);
        }
        let permit = match tokio::time::timeout(patience, self.sem.acquire()).await {
            Ok(p) => Some(p.expect("the gate's semaphore is never closed")),
            Err(_) => {
                crate::metrics::inc(&m.gate_bypasses);
                None
            }
        };
        Ticket { gate: self, permit, started: std::time::Instant::now(), crowded }
    }

    /// The current limit.
    #[cfg(test)]
    fn limit(&self) -> usize {
        self.lock().limit
    }

    /// Counts one statement; returns whether its permit is kept back (the limit went down).
    fn finish(&self, took: Duration, crowded: bool) -> bool {
        let mut grow = false;
        let keep_back = {
            let mut st = self.lock();
            st.n += 1;
            st.total += took;
            st.crowded += u32::from(crowded);
            if st.n >= WINDOW {
                let mean = st.total.as_secs_f64() / f64::from(st.n);
                let before = st.limit;
                let base = st.base.map_or(mean, |b| (b * BASE_DRIFT).min(mean));
                st.base = Some(base);
                st.since_raise = st.since_raise.saturating_add(1);
                if mean >= base * QUEUEING && st.limit > self.min {
                    st.limit -= 1;
                    st.owed += 1;
                    st.roomy = 0;
                    if st.since_raise <= VERDICT {
                        st.needed = (st.needed * 2).min(MAX_ROOMY_NEEDED);
                    }
                } else if mean <= base * ROOM && st.crowded * 2 >= st.n && st.limit < self.max {
                    st.roomy += 1;
                    if st.roomy >= st.needed {
                        grow = st.raise();
                    }
                } else {
                    st.roomy = 0;
                }
                if st.limit != before {
                    let m = crate::metrics::metrics();
                    crate::metrics::inc(if st.limit < before { &m.gate_lowered } else { &m.gate_raised });
                    tracing::debug!(
                        limit = st.limit,
                        mean_ms = mean * 1e3,
                        base_ms = base * 1e3,
                        "statement limit changed"
                    );
                }
                (st.n, st.total, st.crowded) = (0, Duration::ZERO, 0);
            }
            if st.owed > 0 {
                st.owed -= 1;
                true
            } else {
                false
            }
        };
        if grow {
            self.sem.add_permits(1);
        }
        keep_back
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else { return };
        if self.gate.finish(self.started.elapsed(), self.crowded) {
            permit.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `n` statements of `took` each, `crowded` or not, through the gate's accounting.
    fn run(g: &Gate, n: u32, took: Duration, crowded: bool) {
        for _ in 0..n {
            let kept_back = g.finish(took, crowded);
            if kept_back {
                // What Ticket::drop does: that permit is not returned.
                g.sem.forget_permits(1);
            }
        }
    }

    #[test]
    fn queueing_lowers_the_limit_to_its_floor_and_a_quick_crowded_window_raises_it_to_the_pool() {
        let g = Gate::new(10);
        run(&g, WINDOW, Duration::from_millis(1), true); // the base: 1 ms
        assert_eq!(g.limit(), 10, "at the pool's size already");
        for expect in (5..10).rev() {
            run(&g, WINDOW, Duration::from_millis(5), true);
            assert_eq!(g.limit(), expect);
        }
        run(&g, 10 * WINDOW, Duration::from_millis(5), true);
        assert_eq!(g.limit(), 5, "never below half the pool");
        assert_eq!(g.sem.available_permits(), 5, "the permits follow the limit");
        for expect in 6..=10 {
            run(&g, WINDOW, Duration::from_millis(1), true);
            assert_eq!(g.limit(), expect);
        }
        run(&g, 5 * WINDOW, Duration::from_millis(1), true);
        assert_eq!((g.limit(), g.sem.available_permits()), (10, 10), "never above the pool");
    }

    #[test]
    fn a_raise_that_queueing_undoes_makes_the_next_raise_wait_twice_as_long() {
        let g = Gate::new(10);
        run(&g, WINDOW, Duration::from_millis(1), true); // the base: 1 ms
        run(&g, 5 * WINDOW, Duration::from_millis(5), true);
        assert_eq!(g.limit(), 5, "lowered to its floor (no raise before: no verdict)");
        run(&g, WINDOW, Duration::from_millis(1), true);
        assert_eq!(g.limit(), 6, "one quick crowded window raises it");
        let mut needed = 1;
        // Each round: the raise brings a convoy (a slow window), the limit goes back to 5, and
        // the next raise takes twice the quick windows, up to the cap.
        for _ in 0..9 {
            run(&g, WINDOW, Duration::from_millis(5), true);
            assert_eq!(g.limit(), 5);
            needed = (needed * 2).min(MAX_ROOMY_NEEDED);
            run(&g, (needed - 1) * WINDOW, Duration::from_millis(1), true);
            assert_eq!(g.limit(), 5, "{} quick windows are not enough after the raise to {needed}", needed - 1);
            run(&g, WINDOW, Duration::from_millis(1), true);
            assert_eq!(g.limit(), 6, "{needed} quick windows raise it");
        }
        assert_eq!(needed, MAX_ROOMY_NEEDED);
        // A window between roomy and queueing breaks the run of quick ones.
        run(&g, (MAX_ROOMY_NEEDED - 1) * WINDOW, Duration::from_millis(1), true);
        run(&g, WINDOW, Duration::from_micros(1600), true);
        run(&g, WINDOW, Duration::from_millis(1), true);
        assert_eq!(g.limit(), 6, "the run of quick windows starts again");
        run(&g, (MAX_ROOMY_NEEDED - 1) * WINDOW, Duration::from_millis(1), true);
        assert_eq!(g.limit(), 7);
    }

    #[test]
    fn queueing_long_after_a_raise_does_not_slow_the_next_one() {
        let g = Gate::new(10);
        run(&g, WINDOW, Duration::from_millis(1), true);
        run(&g, 2 * WINDOW, Duration::from_millis(5), true);
        assert_eq!(g.limit(), 8);
        run(&g, WINDOW, Duration::from_millis(1), true);
        assert_eq!(g.limit(), 9, "a raise");
        run(&g, 3 * WINDOW, Duration::from_micros(1500), false); // neither: no verdict on the raise
        run(&g, WINDOW, Duration::from_millis(5), true); // the server got busy, later
        assert_eq!(g.limit(), 8);
        run(&g, WINDOW, Duration::from_millis(1), true);
        assert_eq!(g.limit(), 9, "one quick window still raises it");
    }

    #[test]
    fn a_slow_but_steady_server_or_a_lone_caller_keeps_the_whole_pool() {
        let g = Gate::new(10);
        // A far server: every statement 40 ms, no queueing; then a caller that is never crowded.
        run(&g, 20 * WINDOW, Duration::from_millis(40), true);
        assert_eq!(g.limit(), 10);
        let g = Gate::new(10);
        run(&g, WINDOW, Duration::from_millis(1), false);
        run(&g, 20 * WINDOW, Duration::from_micros(1500), false);
        assert_eq!(g.limit(), 10);
    }

    #[test]
    fn a_quick_window_without_crowding_does_not_raise_a_lowered_limit() {
        let g = Gate::new(10);
        run(&g, WINDOW, Duration::from_millis(1), true);
        run(&g, 3 * WINDOW, Duration::from_millis(5), true);
        assert_eq!(g.limit(), 7);
        run(&g, 5 * WINDOW, Duration::from_millis(1), false);
        assert_eq!(g.limit(), 7, "nobody waited: no reason to allow more");
    }

    #[test]
    fn a_small_pool_keeps_the_absolute_floor() {
        let g = Gate::new(3);
        run(&g, WINDOW, Duration::from_millis(1), true);
        run(&g, 5 * WINDOW, Duration::from_millis(9), true);
        assert_eq!(g.limit(), MIN_LIMIT);
        let one = Gate::new(1);
        run(&one, 5 * WINDOW, Duration::from_millis(9), true);
        assert_eq!(one.limit(), 1, "a pool of one is never below one");
    }

    #[tokio::test]
    async fn permits_held_while_the_limit_drops_are_kept_back_and_a_dropped_wait_takes_none() {
        let g = Gate::new(3);
        let held: Vec<_> = vec![g.enter(PATIENCE).await, g.enter(PATIENCE).await, g.enter(PATIENCE).await];
        assert_eq!(g.sem.available_permits(), 0);
        // A wait that is given up takes nothing.
        assert!(tokio::time::timeout(Duration::from_millis(20), g.enter(PATIENCE)).await.is_err());
        {
            let mut st = g.lock();
            st.limit = 2;
            st.owed = 1;
        }
        drop(held);
        assert_eq!(g.sem.available_permits(), 2, "one of the three was kept back");
        let (a, b) = (g.enter(PATIENCE).await, g.enter(PATIENCE).await);
        assert!(tokio::time::timeout(Duration::from_millis(20), g.enter(PATIENCE)).await.is_err(), "the limit is 2");
        drop((a, b));
        assert_eq!(g.sem.available_permits(), 2);
    }

    /// Permits held by statements that wait on row locks must not keep the others off the rest of
    /// the pool: past its patience a statement goes on without a permit.
    #[tokio::test]
    async fn a_statement_waits_at_most_its_patience_then_goes_on_without_a_permit() {
        let g = Gate::new(10);
        run(&g, WINDOW, Duration::from_millis(1), true);
        run(&g, 5 * WINDOW, Duration::from_millis(9), true);
        assert_eq!(g.limit(), 5, "lowered to its floor");
        let held: Vec<_> = futures::future::join_all((0..5).map(|_| g.enter(PATIENCE))).await;
        assert!(held.iter().all(|t| t.permit.is_some()) && g.sem.available_permits() == 0);
        let started = std::time::Instant::now();
        let through = tokio::time::timeout(Duration::from_secs(30), g.enter(Duration::from_millis(30))).await;
        let through = through.expect("a statement is never held past its patience");
        assert!(through.permit.is_none() && started.elapsed() >= Duration::from_millis(30));
        assert_eq!(g.limit(), 5, "a pass changes no limit");
        drop(through);
        assert_eq!(g.sem.available_permits(), 0, "a ticket without a permit gives none back");
        drop(held);
        assert_eq!(g.sem.available_permits(), 5);
    }
}
