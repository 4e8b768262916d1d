//! A run's first commit on PostgreSQL: `tenx_put_input` (migrations 0008, 0011) takes the lease, writes
//! the input step fenced by the new token and clears the run's old stop request, in one
//! statement, so one round trip and one commit (see `store::input_lease`). The step's RAISEs
//! (stale version, another user's thread, a message id of another thread) abort the statement,
//! undoing the take.

use super::{PgStore, Stmt, map_err};
use crate::store::{LeaseInfo, LeaseRequest, LeasedInput, StepWrite, StopKey, StoreError, StoreResult, ThreadRef};
use sqlx::Row;

pub(super) struct Stmts {
    put_input: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str) -> Self {
        Stmts {
            put_input: Stmt::new(format!(
                "SELECT * FROM {s}.tenx_put_input($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
            )),
        }
    }
}

/// `on_head`: the run did not read the thread (`Checkpointer::put_input_on_head`), so a latest
/// row that is not the commit `w` names is refused as stale rather than written unmarked.
pub(super) async fn put_input(
    s: &PgStore,
    t: &ThreadRef,
    req: &LeaseRequest,
    w: StepWrite<'_>,
    stop: Option<StopKey<'_>>,
    on_head: bool,
) -> StoreResult<LeasedInput> {
    s.check_thread(t)?;
    s.check_messages(w.new_messages)?;
    let q = || {
        super::steps::step_head(s, &s.sql.input_lease.put_input, t, &w)
            .bind(w.previous_mark)
            .bind(&req.holder)
            .bind(&req.host)
            .bind(req.pid)
            .bind(req.pid_start)
            .bind(req.ttl.as_secs_f64())
            .bind(req.steal)
            .bind(stop.map(|k| k.namespace))
            .bind(stop.map(|k| k.key))
            .bind(on_head)
    };
    let r = match w.in_tx {
        None => super::errors::sent_again_if_aborted("an input commit", t, || q().fetch_one(&s.conns)).await,
        // Armed failpoint: an explicit transaction, so the hook runs before COMMIT.
        Some(h) => {
            let mut tx = s.conns.begin().await.map_err(|e| map_err("write input", e, Some(t)))?;
            let row = q().fetch_one(&mut *tx).await;
            if row.as_ref().is_ok_and(|r| r.get::<bool, _>("acquired")) {
                h.in_transaction().await.map_err(StoreError::Failpoint)?;
                tx.commit().await.map_err(|e| map_err("write input", e, Some(t)))?;
            }
            row
        }
    };
    let row = match r {
        Ok(row) => row,
        Err(e) => {
            let err = super::messages::name_taken_id(s, t, w.new_messages, map_err("write input", e, Some(t))).await;
            if matches!(err, StoreError::Stale { .. })
                && let Some(r) = s.redis()
            {
                r.clear_state_cache(t).await; // a conflicting writer's cache must not be trusted
            }
            return Err(err);
        }
    };
    let token: i64 = row.get("token");
    if !row.get::<bool, _>("acquired") {
        return Ok(LeasedInput::Held(LeaseInfo {
            token,
            holder: row.get("holder"),
            host: row.get("host"),
            pid: row.get("pid"),
            pid_start: row.get("pid_start"),
            expires_in: row.get("expires_in"),
            released: row.get("released"),
        }));
    }
    // A stop request left from an earlier run went in the same transaction (the generic cache
    // is the table alone).
    Ok(LeasedInput::Committed { token, version: row.get("version") })
}
