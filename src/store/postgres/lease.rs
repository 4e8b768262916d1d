//! Thread leases on PostgreSQL (`tenx_leases`, `tenx_lease_acquire`): take, renew, free, read.

use super::{PgStore, map_err};
use crate::store::{LeaseAttempt, LeaseInfo, LeaseRequest, StoreError, StoreResult};
use sqlx::{AssertSqlSafe, Row};
use std::time::Duration;

fn lease_info(r: &sqlx::postgres::PgRow) -> LeaseInfo {
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

impl PgStore {
    pub(super) async fn lease_take(&self, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
        let user = req.user_id.as_deref().filter(|_| self.opts.enforce_user_isolation);
        let row = sqlx::query(AssertSqlSafe(self.sql.lease_acquire.clone()))
            .bind(thread_id)
            .bind(&req.holder)
            .bind(&req.host)
            .bind(req.pid)
            .bind(req.pid_start)
            .bind(req.ttl.as_secs_f64())
            .bind(req.steal)
            .bind(user)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| map_err("acquire lease", e, None))?;
        // No row: the owner check refused the take (the function returns one row whenever it runs).
        let Some(row) = row else { return Err(StoreError::Forbidden { thread_id: thread_id.to_owned() }) };
        let info = lease_info(&row);
        Ok(if row.get::<bool, _>("acquired") { LeaseAttempt::Acquired { token: info.token } } else { LeaseAttempt::Held(info) })
    }

    pub(super) async fn lease_extend(&self, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
        let r = sqlx::query(AssertSqlSafe(self.sql.lease_renew.clone()))
            .bind(thread_id)
            .bind(token)
            .bind(ttl.as_secs_f64())
            .execute(&self.pool)
            .await
            .map_err(|e| map_err("renew lease", e, None))?;
        Ok(r.rows_affected() > 0)
    }

    pub(super) async fn lease_free(&self, thread_id: &str, token: i64) -> StoreResult<()> {
        sqlx::query(AssertSqlSafe(self.sql.lease_release.clone()))
            .bind(thread_id)
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(|e| map_err("release lease", e, None))?;
        Ok(())
    }

    pub(super) async fn lease_read(&self, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
        let row = sqlx::query(AssertSqlSafe(self.sql.lease_get.clone()))
            .bind(thread_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| map_err("read lease", e, None))?;
        Ok(row.as_ref().map(lease_info))
    }
}
