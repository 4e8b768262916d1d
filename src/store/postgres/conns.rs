//! The store's connections: sqlx's pool, with the connections that just finished a statement
//! kept aside for the next one.
//!
//! Why: sqlx's pool pings a connection (a `Sync` message and its `ReadyForQuery`, one round trip)
//! when it hands an idle one out (`test_before_acquire`) and again when one comes back (to flush
//! a rollback left by a dropped transaction). A statement run on `&PgPool` cost three round trips,
//! one of them on the caller's path: 14 pings in a turn of 7 statements, each a wake of a tokio
//! worker in this process and of a backend in the server.
//!
//! A connection that completed its statement cleanly has nothing to flush and was alive a moment
//! ago: it goes straight to the oldest statement waiting for a connection, or else on the
//! `spare` list, and the next statement takes it without a ping. Everything else goes back
//! through the pool as before, and so keeps sqlx's checks:
//! - a statement that failed, or whose future was dropped mid-flight (a stop, a timeout): its
//!   connection may be broken or have a response in flight, and the pool's ping on return sorts
//!   it out (or closes it);
//! - a spare connection idle for more than [`SPARE_FOR`] (50 ms): the server may have restarted
//!   or ended the session since, so it goes back to the pool, whose ping on hand-out finds that
//!   out and connects anew (what every statement did before);
//! - after a statement fails with connection trouble (the server restarted, or ended sessions),
//!   every spare connection goes back too: they are likely dead for the same reason, and the
//!   statements after the failed one get checked connections;
//! - a connection out of the pool for [`BACK_TO_POOL_AFTER`], so the pool's lifetime rules see
//!   it again;
//! - every connection once `close` has begun.
//!
//! Transactions (thread, message and prune writes, armed failpoints) take their connection the
//! same way; it goes back to the pool when the transaction ends. Every way back to the pool is
//! bounded (`pooled.rs`).
//!
//! Single statements first pass the store's [`Gate`]: at most its limit of them are at the server
//! at once, a limit that follows their latency (see `gate.rs`: a convoy of more busy connections
//! than the server has cores). Transactions do not pass it.

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Either, Execute, Executor, PgPool, Postgres, SqlStr};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

use super::gate::{self, Gate, Ticket};
use super::pooled::{Home, Pooled, Tx};
use super::read_only;

/// How long a spare connection is trusted without a ping. The one case the pool's ping handled
/// and this does not: the server ends the session, and the connection is used again less than
/// this after its previous statement; that statement fails (a transient storage error) instead
/// of going to a new connection. A restart does not fit in it (`pg_ctl restart` alone
/// waits 100 ms between its checks; the test suite's restarts took under 250 ms end to end), and
/// `pg_terminate_backend` of a session in use costs its statement with or without the ping.
/// The statements of a turn whose nodes take no time follow each other well within it, which is
/// where the round trip mattered; a node that takes longer pays one ping, as before.
pub(super) const SPARE_FOR: Duration = Duration::from_millis(50);

/// How long a connection stays out of the pool, kept and handed from statement to statement,
/// before it goes back: the pool's own rules (`max_lifetime`, its idle reaper) see a connection
/// only when it is in the pool.
const BACK_TO_POOL_AFTER: Duration = Duration::from_secs(300);

pub(super) struct Conns {
    pool: PgPool,
    /// How long one statement (or one transaction's statement, BEGIN or COMMIT) may wait for the
    /// server's answer (`PgOptions::statement_deadline`). Past it the statement fails with
    /// `sqlx::Error::Io(TimedOut)` (a `StoreError::Transient`: STORAGE_TRANSIENT_001) and its
    /// connection is closed, not returned to the pool.
    pub(super) deadline: Duration,
    /// The runtime the store was opened in, which gives connections back (the store may be
    /// dropped by Python's garbage collector on any thread), and the deadline.
    home: Home,
    spare: Mutex<Spare>,
    gate: Gate,
}

#[derive(Default)]
struct Spare {
    /// Connections out of the pool that finished a statement cleanly, the most recent last.
    conns: Vec<(Pooled, Instant)>,
    /// Statements waiting for a connection, oldest first. A connection that finishes cleanly goes
    /// to the first of them that still waits, and to `conns` only when none does: kept aside
    /// while others wait in the pool, it left them there until `acquire_timeout` while the rest
    /// took turns on the kept ones (what 16 threads on 10 connections did). Each also waits in
    /// the pool, which may open a connection or get one back from elsewhere. Under the same lock
    /// as `conns`, so a finished connection is either found by a statement about to wait or
    /// handed to one that waits.
    waiters: VecDeque<oneshot::Sender<Pooled>>,
    /// `close` has begun: nothing is kept aside any more (the pool waits for every connection).
    closed: bool,
}

impl std::fmt::Debug for Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns").field("pool", &self.pool).finish_non_exhaustive()
    }
}

/// A connection lent to one statement: back on the spare list when [`Lease::keep`] was called,
/// back to the pool (ping, or close when broken) otherwise.
struct Lease<'a> {
    conns: &'a Conns,
    conn: Option<Pooled>,
    keep: bool,
    /// The statement's pass through the gate: counted and given back after the connection is.
    _ticket: Ticket<'a>,
}

/// The statement got no answer within the deadline (see `Conns::deadline`).
pub(super) fn timed_out(deadline: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no answer from PostgreSQL within {} s (the server, or the network to it, stopped answering)",
            deadline.as_secs_f64()
        ),
    ))
}

impl Lease<'_> {
    fn conn(&mut self) -> &mut sqlx::PgConnection {
        self.conn.as_mut().expect("a lease holds its connection until dropped").conn()
    }

    fn keep(mut self) {
        self.keep = true;
    }

    /// The statement timed out: the connection is closed (bounded by sqlx's close-on-drop
    /// timeout), not pinged back into the pool.
    fn abandon(mut self) {
        if let Some(conn) = self.conn.take() {
            conn.close();
        }
        self.conns.return_spares();
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else { return };
        if self.keep && conn.since.elapsed() <= BACK_TO_POOL_AFTER {
            let mut spare = self.conns.lock();
            if !spare.closed {
                while let Some(waiter) = spare.waiters.pop_front() {
                    match waiter.send(conn) {
                        Ok(()) => return,
                        Err(back) => conn = back, // that one stopped waiting
                    }
                }
                spare.conns.push((conn, Instant::now()));
                return;
            }
        }
        // Back to the pool (pinged, or closed).
        drop(conn);
    }
}

impl Drop for Conns {
    fn drop(&mut self) {
        self.return_spares();
    }
}

impl Conns {
    /// Called inside the runtime (the store is opened there).
    pub(super) fn new(pool: PgPool, deadline: Duration) -> Self {
        let gate = Gate::new(pool.options().get_max_connections() as usize);
        let home = Home { runtime: tokio::runtime::Handle::current(), deadline };
        Conns { pool, deadline, home, spare: Mutex::new(Spare::default()), gate }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Spare> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used spare connection when it is fresh; else the first of a connection
    /// that finishes its statement and one from the pool.
    async fn take(&self) -> Result<Pooled, sqlx::Error> {
        let (stale, handed) = {
            let mut spare = self.lock();
            let stale = match spare.conns.pop() {
                Some((conn, since)) if since.elapsed() <= SPARE_FOR && !read_only::before_retirement(since) => {
                    return Ok(conn);
                }
                // Stale (or kept since before the server refused a write as read-only), and every
                // one below it is older: all go back to the pool (outside the lock), which pings
                // them when it hands them out, or closes them (read_only.rs).
                Some((stale, _)) => {
                    let mut all: Vec<_> = std::mem::take(&mut spare.conns).into_iter().map(|(c, _)| c).collect();
                    all.push(stale);
                    all
                }
                None => Vec::new(),
            };
            if spare.closed {
                (stale, None)
            } else {
                let (tx, rx) = oneshot::channel();
                spare.waiters.push_back(tx);
                (stale, Some(rx))
            }
        };
        drop(stale); // back to the pool, which pings them when it hands them out
        let from_pool = |r: Result<_, sqlx::Error>| r.map(|conn| Pooled::new(conn, &self.home));
        let Some(mut rx) = handed else { return from_pool(self.pool.acquire().await) };
        let acquired = tokio::select! {
            biased;
            Ok(out) = &mut rx => return Ok(out),
            r = self.pool.acquire() => r,
        };
        // A connection handed over meanwhile goes back to the pool; closing the receiver first
        // makes any later hand-over fail and go to the next waiter.
        rx.close();
        drop(rx.try_recv());
        from_pool(acquired)
    }

    async fn lease(&self) -> Result<Lease<'_>, sqlx::Error> {
        // At most the gate's patience, never longer than a wait in the pool may take.
        let ticket = self.gate.enter(gate::PATIENCE.min(self.pool.options().get_acquire_timeout())).await;
        Ok(Lease { conns: self, conn: Some(self.take().await?), keep: false, _ticket: ticket })
    }

    /// Every spare connection back to the pool (before the pool is closed, or lent to a caller
    /// that uses it directly).
    pub(super) fn return_spares(&self) {
        let spare = std::mem::take(&mut self.lock().conns);
        drop(spare);
    }

    /// The pool, for callers that use it directly: the spare connections are given back first,
    /// so the pool can hand them out.
    pub(super) fn pool(&self) -> &PgPool {
        self.return_spares();
        &self.pool
    }

    /// A transaction on a connection taken as a statement takes one; it goes back to the pool
    /// when the transaction ends (rolled back first when it ended without COMMIT or ROLLBACK).
    pub(super) async fn begin(&self) -> Result<Tx, sqlx::Error> {
        Tx::begin(self.take().await?).await
    }

    /// A read-only transaction whose statements all see one snapshot (REPEATABLE READ): a
    /// check and the read it allows agree (see `owned::read_owned`).
    pub(super) async fn begin_snapshot(&self) -> Result<Tx, sqlx::Error> {
        Tx::begin_as(self.take().await?, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY").await
    }

    /// The outcome of a statement; connection trouble sends every spare back to the pool.
    fn checked<T>(&self, r: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if let Err(e) = &r
            && connection_lost(e)
        {
            self.return_spares();
        }
        r
    }

    pub(super) async fn close(&self) {
        self.lock().closed = true;
        self.return_spares();
        self.pool.close().await;
    }
}

/// The server or the network dropped the connection (as `errors::map_err` counts it transient).
fn connection_lost(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_))
        || e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c.starts_with("08") || c.starts_with("57P"))
}

/// One statement on a lent connection: `$run` is awaited with `$c` bound to the connection; the
/// connection is kept when it succeeds, checked for connection trouble when it fails.
macro_rules! on_lease {
    ($conns:ident, |$c:ident| $run:expr) => {
        Box::pin(async move {
            let mut lease = $conns.lease().await?;
            let $c = lease.conn();
            let out = match tokio::time::timeout($conns.deadline, $run).await {
                Ok(r) => $conns.checked(r)?,
                Err(_) => {
                    lease.abandon();
                    return Err(timed_out($conns.deadline));
                }
            };
            lease.keep();
            Ok(out)
        })
    };
}

impl Conns {
    /// `run` (one statement) on a lent connection, as `.fetch_*(&conns)` runs one: for a caller
    /// that takes the connection itself (`owned::read_owned` without isolation).
    pub(super) async fn on_lent<T>(
        &self,
        run: impl AsyncFnOnce(&mut sqlx::PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, sqlx::Error> {
        let conns = self;
        on_lease!(conns, |c| run(c)).await
    }
}

/// Single statements run on a lent connection (`.fetch_one(&s.conns)`), with the pool's own
/// behaviour otherwise.
impl<'c> Executor<'c> for &'c Conns {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        // Collected before it is handed on: the lease must see the end of the results to know
        // the connection is clean. No statement of the store streams a large result.
        futures::stream::once(async move {
            let mut lease = self.lease().await?;
            let all: Vec<_> =
                match tokio::time::timeout(self.deadline, lease.conn().fetch_many(query).try_collect()).await {
                    Ok(r) => self.checked(r)?,
                    Err(_) => {
                        lease.abandon();
                        return Err(timed_out(self.deadline));
                    }
                };
            lease.keep();
            Ok::<_, sqlx::Error>(futures::stream::iter(all.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        on_lease!(self, |c| c.fetch_optional(query))
    }

    fn fetch_all<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Vec<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        on_lease!(self, |c| c.fetch_all(query))
    }

    fn execute<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<PgQueryResult, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        on_lease!(self, |c| c.execute(query))
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        on_lease!(self, |c| c.prepare_with(sql, parameters))
    }
    // No `describe`: the trait has it only with sqlx's compile-time query macros, not built here.
}
