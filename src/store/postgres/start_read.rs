//! The read at the start of a run that takes its lease with its input commit: the thread's lease
//! row and the thread (the load statement of `steps`, unchanged, as a subquery) in one statement,
//! one round trip, one snapshot. Before, they were two statements sent at once on two pooled
//! connections: no latency between them, but the server and the client paid for both.

use super::{PgStore, Stmt, lease, map_err, steps};
use crate::store::{Checkpoint, KnownHead, LeaseInfo, StoreResult, ThreadRef};
use sqlx::Row;

pub(super) struct Stmts {
    start: Stmt,
}

impl Stmts {
    /// `load`: the load statement (parameters $1-$5); the lease row is matched on $1 as text,
    /// as `lease_get` matches it (lease rows key every id type by its text).
    pub(super) fn new(s: &str, load: &Stmt) -> Self {
        Stmts {
            start: Stmt::new(format!(
                "SELECT l.token, l.holder, l.host, l.pid, l.pid_start, \
                   EXTRACT(EPOCH FROM l.expires_at - clock_timestamp())::FLOAT8 AS expires_in, l.released, ld.* \
                 FROM (SELECT 1) one \
                 LEFT JOIN {s}.tenx_leases l ON l.thread_id = $1::text AND l.token > 0 \
                 LEFT JOIN ({load}) ld ON true",
                load = &*load.0
            )),
        }
    }
}

/// The lease row as `lease_get` returns it and the thread as `load_with` returns it. A failed
/// statement fails both.
pub(super) async fn lease_and_load(
    s: &PgStore,
    t: &ThreadRef,
    known: Option<KnownHead<'_>>,
) -> (StoreResult<Option<LeaseInfo>>, StoreResult<Option<Checkpoint>>) {
    let row = sqlx::query(s.sql.start_read.start.q())
        .bind(&t.thread_id)
        .bind(t.isolated(s.opts.enforce_user_isolation))
        .bind(&t.user_id)
        .bind(known.map(|k| k.version))
        .bind(known.map(|k| k.mark))
        .fetch_one(&s.conns)
        .await;
    let row = match row {
        Ok(row) => row,
        Err(e) => return (Err(map_err("read lease", clone_err(&e), None)), Err(map_err("load", e, Some(t)))),
    };
    let held = row.get::<Option<i64>, _>("token").map(|_| lease::lease_info(&row));
    // No state row (a new thread, or another user's under isolation): the load's columns are NULL.
    let loaded = match row.get::<Option<i64>, _>("version") {
        None => Ok(None),
        Some(_) => steps::checkpoint_of(&row).map(Some),
    };
    (Ok(held), loaded)
}

/// sqlx errors are not `Clone`; the lease side only needs to fail too (the run treats a lease it
/// could not read as not held and goes on to the load's error).
fn clone_err(e: &sqlx::Error) -> sqlx::Error {
    sqlx::Error::Protocol(e.to_string())
}
