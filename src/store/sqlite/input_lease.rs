//! A run's first commit on SQLite: the lease take, the input step and the stop-key clear in one
//! `BEGIN IMMEDIATE` transaction (see `store::input_lease`). Every refusal returns before COMMIT,
//! and dropping the transaction rolls the take back.

use super::*;
use crate::store::{LeasedInput, StopKey};

pub(super) async fn put_input_leased(
    s: &SqliteStore,
    t: &ThreadRef,
    req: &LeaseRequest,
    w: StepWrite<'_>,
    stop: Option<StopKey<'_>>,
) -> StoreResult<LeasedInput> {
    let mut tx = s.write_tx("begin input").await?;
    let token = match super::lease::take_in(s, tx.conn(), &t.thread_id, req).await? {
        LeaseAttempt::Acquired { token } => token,
        LeaseAttempt::Held(info) => return Ok(LeasedInput::Held(info)),
    };
    // Stale, fenced or another user's thread: an error here drops `tx`, undoing the take.
    let version =
        super::steps::step_in(s, tx.conn(), t, StepWrite { fence: Some(token), release_lease: false, ..w }).await?;
    if let Some(k) = stop {
        sqlx::query("DELETE FROM cache WHERE namespace = ? AND key = ?")
            .bind(k.namespace)
            .bind(k.key)
            .execute(tx.conn())
            .await
            .map_err(be("clear stop request"))?;
    }
    if let Some(h) = w.in_tx {
        h.in_transaction().await.map_err(StoreError::Failpoint)?;
    }
    tx.commit("commit input").await?;
    Ok(LeasedInput::Committed { token, version })
}
