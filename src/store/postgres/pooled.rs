//! A connection out of the store's pool, and its way back there, bounded; the store's
//! transactions, built on one.
//!
//! Why not sqlx's own way back: a `PoolConnection` dropped is returned by a task sqlx spawns,
//! which runs the store's `after_release` (a ping bounded by the deadline, `connect.rs`) and then
//! pings once more itself, with no deadline. A network that went dark between the two pings held
//! the pool's slot until TCP gave up (minutes to hours; with one slot, every later call failed:
//! met by chance in two fresh-clone CI runs of session 24, reproduced at that exact point in
//! test_pg_pool_after_blackhole.py). Here the whole way back runs in a task of ours under a
//! deadline: dropping sqlx's return future drops the connection and frees its slot. sqlx's
//! `Transaction` owns its connection and gives it back the same unbounded way when it ends, so the
//! store's transactions are [`Tx`], which owns a [`Pooled`] instead.

use sqlx::pool::PoolConnection;
use sqlx::{Executor, PgConnection, Postgres};
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

/// Where a connection goes back to: the runtime that runs its way back, and how long one
/// exchange with the server may take (`Conns::deadline`).
#[derive(Clone)]
pub(super) struct Home {
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) deadline: Duration,
}

impl Home {
    /// Gives `conn` back to the pool in a task of its own, bounded: a ROLLBACK first when a
    /// transaction may be open on it (else the pool's next user would run inside it), then the
    /// pool's return (the store's ping, sqlx's ping) within twice the deadline. A connection
    /// that does not make it is dropped, which frees its slot.
    fn give_back(&self, mut conn: PoolConnection<Postgres>, rollback: bool) {
        let deadline = self.deadline;
        // A runtime shut down drops the task, and with it the connection: nothing to give back to.
        drop(self.runtime.spawn(async move {
            if rollback {
                let rolled_back = tokio::time::timeout(deadline, conn.execute("ROLLBACK")).await;
                if !matches!(rolled_back, Ok(Ok(_))) {
                    // sqlx closes it (bounded by its close-on-drop timeout).
                    conn.close_on_drop();
                    return;
                }
            }
            if tokio::time::timeout(deadline * 2, conn.return_to_pool()).await.is_err() {
                tracing::warn!(
                    "a connection given back to the pool got no answer within {:.1} s (the server, or the network \
                     to it, stopped answering): closed, and its pool slot freed",
                    (deadline * 2).as_secs_f64()
                );
            }
        }));
    }
}

/// A connection out of the pool, and since when; dropped, it goes back by [`Home::give_back`].
pub(super) struct Pooled {
    conn: Option<PoolConnection<Postgres>>,
    pub(super) since: Instant,
    home: Home,
}

impl Pooled {
    pub(super) fn new(conn: PoolConnection<Postgres>, home: &Home) -> Self {
        Pooled { conn: Some(conn), since: Instant::now(), home: home.clone() }
    }

    pub(super) fn conn(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("a pooled connection holds its connection until dropped")
    }

    /// Closed instead of given back (its statement got no answer in time): sqlx closes it,
    /// bounded by its close-on-drop timeout.
    pub(super) fn close(mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
            let _in_runtime = self.home.runtime.enter();
            drop(conn);
        }
    }

    fn give_back(&mut self, rollback: bool) {
        if let Some(conn) = self.conn.take() {
            self.home.give_back(conn, rollback);
        }
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.give_back(false);
    }
}

/// Where a transaction is: a dropped one whose end was never sent is rolled back on the way back
/// to the pool; one whose COMMIT or ROLLBACK was sent is not (the return's ping waits for that
/// answer).
#[derive(Clone, Copy, PartialEq)]
enum TxState {
    Open,
    Ending,
}

/// One transaction of the store on a connection of its own (what `sqlx::Transaction` was, with
/// the connection's way back bounded). Used as the connection (`&mut *tx`); ended by
/// [`Tx::commit`] or [`Tx::rollback`]; dropped before, it is rolled back.
pub(super) struct Tx {
    conn: Pooled,
    state: TxState,
}

impl Tx {
    /// BEGIN on `conn`, within the deadline. A BEGIN cut off (a timeout, the caller's cancel)
    /// counts as open: its answer may still come, and the connection must not go back to the
    /// pool inside a transaction.
    pub(super) async fn begin(conn: Pooled) -> Result<Tx, sqlx::Error> {
        Self::begin_as(conn, "BEGIN").await
    }

    /// `begin` with the transaction's own BEGIN statement (its isolation level, READ ONLY).
    pub(super) async fn begin_as(conn: Pooled, begin: &'static str) -> Result<Tx, sqlx::Error> {
        let deadline = conn.home.deadline;
        let mut tx = Tx { conn, state: TxState::Open };
        match tokio::time::timeout(deadline, tx.conn.conn().execute(begin)).await {
            Ok(r) => r.map(|_| tx),
            Err(_) => Err(super::conns::timed_out(deadline)),
        }
    }

    pub(super) async fn commit(self) -> Result<(), sqlx::Error> {
        self.end("COMMIT").await
    }

    pub(super) async fn rollback(self) -> Result<(), sqlx::Error> {
        self.end("ROLLBACK").await
    }

    async fn end(mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        self.state = TxState::Ending;
        self.conn.conn().execute(sql).await.map(|_| ())
    }
}

impl Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.conn.as_ref().expect("a transaction holds its connection until dropped")
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.conn()
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        self.conn.give_back(self.state == TxState::Open);
    }
}
