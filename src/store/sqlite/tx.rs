//! Transactions on a pooled connection, ended by hand: `BEGIN IMMEDIATE` for a write, a deferred
//! `BEGIN` for a read that must see one snapshot.

use super::*;

/// How long a write waits for the database (SQLite's busy handler) and, before that, for this
/// process's other writers.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// A transaction on a pooled connection, ended by hand. sqlx's own Transaction
/// keeps counting a transaction whose COMMIT failed (e.g. disk full), and that connection then
/// refuses every later BEGIN, so a thread could never be resumed after the disk was freed. Here a
/// transaction that did not commit is rolled back before its connection is reused, and a
/// connection that cannot even roll back is closed.
pub(super) struct Tx {
    conn: Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>,
    // Held until commit or drop. SQLite admits one writer at a time anyway; queueing this
    // process's writers here, first come first served, leaves SQLite's busy handler (sleep and
    // retry, no order) to arbitrate between processes only. Without it, 64 concurrent runs on
    // 4 connections starved one writer past the 10 s busy timeout ("database is locked").
    // None for a read, which queues behind nobody.
    _gate: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Tx {
    /// A write transaction (`BEGIN IMMEDIATE`), after this process's earlier writers.
    pub(super) async fn write(
        pool: &SqlitePool,
        gate: &Arc<tokio::sync::Mutex<()>>,
        op: &'static str,
    ) -> StoreResult<Self> {
        // Bounded like SQLite's own busy wait, so a writer queued behind many others (each of
        // which may wait out another process's lock) gives up instead of hanging.
        let gate = tokio::time::timeout(BUSY_TIMEOUT, gate.clone().lock_owned())
            .await
            .map_err(|_| locked(op, "database is locked: queued behind this process's other writers".into()))?;
        Self::open(pool, Some(gate), "BEGIN IMMEDIATE", op).await
    }

    /// A read transaction: every statement in it sees the database as of its first read (WAL
    /// snapshot), so reads made in two statements cannot straddle another connection's commit.
    pub(super) async fn read(pool: &SqlitePool, op: &'static str) -> StoreResult<Self> {
        Self::open(pool, None, "BEGIN", op).await
    }

    async fn open(
        pool: &SqlitePool,
        gate: Option<tokio::sync::OwnedMutexGuard<()>>,
        begin: &'static str,
        op: &'static str,
    ) -> StoreResult<Self> {
        let conn = pool.acquire().await.map_err(be(op))?;
        // The transaction owns the connection before BEGIN is sent: sqlx's worker thread runs a
        // statement it was sent even when the future awaiting it is dropped (a client cancelling
        // its run while BEGIN waits for the lock), so a connection handed back to the pool here
        // would keep that transaction open (every later BEGIN on it: "cannot start a transaction
        // within a transaction"; every other connection, and process: "database is locked").
        // Dropped or failed, `Drop` rolls back first (a no-op when BEGIN did not happen).
        let mut tx = Tx { conn: Some(conn), _gate: gate };
        sqlx::query(begin).execute(tx.conn()).await.map_err(be(op))?;
        Ok(tx)
    }

    pub(super) fn conn(&mut self) -> &mut SqliteConnection {
        self.conn.as_mut().expect("present until commit or drop")
    }

    pub(super) async fn commit(mut self, op: &'static str) -> StoreResult<()> {
        // The connection stays in `self` while COMMIT is in flight: dropped then, `Drop` rolls
        // back before the connection is reused (a no-op after a COMMIT that went through).
        match sqlx::query("COMMIT").execute(self.conn()).await {
            Ok(_) => {
                drop(self.conn.take());
                Ok(())
            }
            Err(e) => {
                let conn = self.conn.take().expect("present until commit or drop");
                // On the runtime, awaited: the rollback is done before the error goes on, and a
                // caller dropped meanwhile does not leave it half done.
                match tokio::runtime::Handle::try_current() {
                    Ok(h) => {
                        let _ = h.spawn(finish_failed(conn)).await;
                    }
                    Err(_) => finish_failed(conn).await,
                }
                Err(be(op)(e))
            }
        }
    }
}

/// SQLITE_BUSY ("database is locked").
pub(super) fn is_locked(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("5"))
}

/// Rolls back an unfinished transaction; closes the connection when even that fails.
async fn finish_failed(mut conn: sqlx::pool::PoolConnection<sqlx::Sqlite>) {
    if sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err() {
        // No transaction left (SQLite already rolled it back) is fine; anything else: close.
        if sqlx::query("SELECT 1").execute(&mut *conn).await.is_err() {
            conn.close_on_drop();
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        // An error return or a cancelled future: roll back before the connection is reused. The
        // connection stays out of the pool until then, so nobody sees the open transaction.
        if let Some(mut conn) = self.conn.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn(finish_failed(conn));
                }
                Err(_) => conn.close_on_drop(),
            }
        }
    }
}
