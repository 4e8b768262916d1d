//! Thread leases on PostgreSQL (`tenx_leases`, `tenx_lease_acquire`): take, renew, free, read.

use super::{Casts, PgStore, Stmt, map_err};
use crate::store::{LeaseAttempt, LeaseInfo, LeaseRequest, StoreError, StoreResult};
use sqlx::Row;
use std::time::Duration;

pub(super) struct Stmts {
    acquire: Stmt,
    renew: Stmt,
    release: Stmt,
    get: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let (t, u) = (c.id, c.user);
        Stmts {
            // $8: the run's user when isolation is on (NULL otherwise). The owner check is a scalar
            // subquery, so it becomes a one-time filter evaluated before the function scan: for
            // another user's thread the function never runs (no row back, and the lease row is
            // untouched). One round trip, like the take itself. A thread created by its owner
            // between this statement's snapshot and the take is caught by the run's first write.
            acquire: Stmt::new(format!(
                "SELECT * FROM {s}.tenx_lease_acquire($1, $2, $3, $4, $5, $6, $7) \
                 WHERE (SELECT $8::text IS NULL OR NOT EXISTS \
                   (SELECT 1 FROM {s}.threads th WHERE th.thread_id = $1{t} AND th.user_id <> $8{u}))"
            )),
            renew: Stmt::new(format!(
                "UPDATE {s}.tenx_leases SET expires_at = clock_timestamp() + make_interval(secs => $3) \
                 WHERE thread_id = $1 AND token = $2 AND NOT released"
            )),
            // A thread deleted while this run held its lease: the row goes (nothing else would
            // ever delete it; tokens come from the sequence, so a reused id is still fenced).
            // Both branches test the same snapshot, so exactly one of them touches the row.
            release: Stmt::new(format!(
                "WITH gone AS (DELETE FROM {s}.tenx_leases WHERE thread_id = $1 AND token = $2                    AND NOT EXISTS (SELECT 1 FROM {s}.threads th WHERE th.thread_id = $1{t}))                  UPDATE {s}.tenx_leases SET released = TRUE, expires_at = clock_timestamp()                  WHERE thread_id = $1 AND token = $2                    AND EXISTS (SELECT 1 FROM {s}.threads th WHERE th.thread_id = $1{t})"
            )),
            get: Stmt::new(format!(
                "SELECT TRUE AS acquired, token, holder, host, pid, pid_start, \
                 EXTRACT(EPOCH FROM expires_at - clock_timestamp())::FLOAT8 AS expires_in, released \
                 FROM {s}.tenx_leases WHERE thread_id = $1 AND token > 0"
            )),
        }
    }
}

pub(super) fn lease_info(r: &sqlx::postgres::PgRow) -> LeaseInfo {
    LeaseInfo {
        token: r.get("token"),
        holder: r.get("holder"),
        host: r.get("host"),
        pid: r.get("pid"),
        pid_start: r.get("pid_start"),
        expires_in: r.get("expires_in"),
        released: r.get("released"),
    }
}

pub(super) async fn lease_acquire(s: &PgStore, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
    let user = req.user_id.as_deref().filter(|_| s.opts.enforce_user_isolation || req.owner_scoped);
    let row = sqlx::query(s.sql.lease.acquire.q())
        .bind(thread_id)
        .bind(&req.holder)
        .bind(&req.host)
        .bind(req.pid)
        .bind(req.pid_start)
        .bind(req.ttl.as_secs_f64())
        .bind(req.steal)
        .bind(user)
        .fetch_optional(&s.conns)
        .await
        .map_err(|e| map_err("acquire lease", e, None))?;
    // No row: the owner check refused the take (the function returns one row whenever it runs).
    let Some(row) = row else { return Err(StoreError::Forbidden { thread_id: thread_id.to_owned() }) };
    let info = lease_info(&row);
    Ok(if row.get::<bool, _>("acquired") {
        LeaseAttempt::Acquired { token: info.token }
    } else {
        LeaseAttempt::Held(info)
    })
}

pub(super) async fn lease_renew(s: &PgStore, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
    let r = sqlx::query(s.sql.lease.renew.q())
        .bind(thread_id)
        .bind(token)
        .bind(ttl.as_secs_f64())
        .execute(&s.conns)
        .await
        .map_err(|e| map_err("renew lease", e, None))?;
    Ok(r.rows_affected() > 0)
}

pub(super) async fn lease_release(s: &PgStore, thread_id: &str, token: i64) -> StoreResult<()> {
    sqlx::query(s.sql.lease.release.q())
        .bind(thread_id)
        .bind(token)
        .execute(&s.conns)
        .await
        .map_err(|e| map_err("release lease", e, None))?;
    Ok(())
}

pub(super) async fn lease_get(s: &PgStore, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
    let row = sqlx::query(s.sql.lease.get.q())
        .bind(thread_id)
        .fetch_optional(&s.conns)
        .await
        .map_err(|e| map_err("read lease", e, None))?;
    Ok(row.as_ref().map(lease_info))
}
