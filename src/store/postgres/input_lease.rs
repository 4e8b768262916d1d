//! A run's first commit on PostgreSQL: `tenx_put_input` (schema v8) takes the lease, writes the
//! input step fenced by the new token and clears the run's old stop request, in one statement,
//! so one round trip and one commit (see `store::input_lease`). The step's RAISEs (stale version,
//! another user's thread, a message id of another thread) abort the statement, undoing the take.

use super::{PgStore, map_err, message_rows, strip_nul};
use crate::store::{LeaseInfo, LeaseRequest, LeasedInput, StepWrite, StopKey, StoreError, StoreResult, ThreadRef};
use sqlx::{AssertSqlSafe, Row};

/// Schema v8: `tenx_put_input`, the take and the step as the v5 and v6 functions do them, nested:
/// the take refused returns the holder and writes nothing.
pub(super) fn v8(s: &str) -> String {
    format!(
        r#"
CREATE OR REPLACE FUNCTION {s}.tenx_put_input(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN, p_prev_mark TEXT,
  p_holder TEXT, p_host TEXT, p_pid BIGINT, p_pid_start BIGINT, p_ttl FLOAT8, p_steal BIGINT,
  p_stop_ns TEXT, p_stop_key TEXT
) RETURNS TABLE (acquired BOOLEAN, token BIGINT, holder TEXT, host TEXT, pid BIGINT, pid_start BIGINT,
                 expires_in FLOAT8, released BOOLEAN, version BIGINT)
LANGUAGE plpgsql AS $fn$
DECLARE l RECORD; v_new BIGINT;
BEGIN
  SELECT * INTO l FROM {s}.tenx_lease_acquire(p_thread, p_holder, p_host, p_pid, p_pid_start, p_ttl, p_steal);
  IF l.acquired THEN
    v_new := {s}.tenx_put_step(p_thread, p_user, p_expected, p_state, p_messages, p_replace, p_history,
                               p_isolate, l.token, FALSE, p_prev_mark);
    IF p_stop_key IS NOT NULL THEN
      DELETE FROM {s}.tenx_cache c WHERE c.namespace = p_stop_ns AND c.key = p_stop_key;
    END IF;
  END IF;
  RETURN QUERY SELECT l.acquired, l.token, l.holder, l.host, l.pid, l.pid_start, l.expires_in, l.released, v_new;
END $fn$;
"#
    )
}

impl PgStore {
    pub(super) async fn input_leased(
        &self,
        t: &ThreadRef,
        req: &LeaseRequest,
        w: StepWrite<'_>,
        stop: Option<StopKey<'_>>,
    ) -> StoreResult<LeasedInput> {
        let mut state = w.state.clone();
        strip_nul(&mut state);
        let sql = format!(
            "SELECT * FROM {}.tenx_put_input($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
            self.sql.s
        );
        let q = sqlx::query(AssertSqlSafe(sql))
            .bind(&t.thread_id)
            .bind(&t.user_id)
            .bind(w.expected_version)
            .bind(&state)
            .bind(message_rows(w.new_messages))
            .bind(w.replace_messages)
            .bind(self.opts.state_history_limit)
            .bind(self.opts.enforce_user_isolation)
            .bind(w.previous_mark)
            .bind(&req.holder)
            .bind(&req.host)
            .bind(req.pid)
            .bind(req.pid_start)
            .bind(req.ttl.as_secs_f64())
            .bind(req.steal)
            .bind(stop.map(|k| k.namespace))
            .bind(stop.map(|k| k.key));
        let r = match w.in_tx {
            None => q.fetch_one(&self.pool).await,
            // Armed failpoint: an explicit transaction, so the hook runs before COMMIT.
            Some(h) => {
                let mut tx = self.pool.begin().await.map_err(|e| map_err("write input", e, Some(t)))?;
                let row = q.fetch_one(&mut *tx).await;
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
                let err = map_err("write input", e, Some(t));
                if matches!(err, StoreError::Stale { .. }) {
                    if let Some(r) = self.redis() {
                        r.clear_state_cache(t).await; // a conflicting writer's cache must not be trusted
                    }
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
        // The table's entry went in the transaction; a Redis copy is cleared after it.
        if let (Some(k), Some(r)) = (stop, self.redis()) {
            r.clear(k.namespace, k.key).await;
        }
        Ok(LeasedInput::Committed { token, version: row.get("version") })
    }
}
