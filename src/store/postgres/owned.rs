//! A thread's owner checked where the work it allows is done. Checked in a statement of its own
//! and then read or deleted in others, a thread another user created between the two was read,
//! cleared or deleted for them, and the call said it had done nothing wrong (red-team, session
//! 39: about one try in ten when the two calls raced). A read now runs in the snapshot the check
//! was made in; a change holds the thread's row (as every writer does first) and checks the
//! owner of the row it holds.

use super::{PgStore, map_err};
use crate::store::{StoreError, StoreResult, ThreadRef};
use sqlx::PgConnection;

/// What a change found when it took the thread's row.
#[derive(PartialEq)]
pub(super) enum Held {
    /// The row is held, and the caller may change the thread (it owns it, or users are not
    /// isolated).
    Thread,
    /// Users are isolated and no thread row exists: nothing of the thread is the caller's to
    /// change, and rows a creator commits after this are not seen by a later statement that
    /// would not look for an owner.
    Nothing,
}

impl PgStore {
    /// `read` in one REPEATABLE READ, READ ONLY transaction after the owner check, when users
    /// are isolated (`denied` when the caller may not read the thread); as one statement, with
    /// no transaction around it, otherwise.
    pub(super) async fn read_owned<T>(
        &self,
        t: &ThreadRef,
        op: &'static str,
        denied: T,
        read: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> StoreResult<T> {
        if !t.isolated(self.opts.enforce_user_isolation) {
            return self.conns.on_lent(read).await.map_err(|e| map_err(op, e, Some(t)));
        }
        self.bounded(op, async {
            let mut tx = self.conns.begin_snapshot().await.map_err(|e| map_err(op, e, Some(t)))?;
            if !owns(self, &mut tx, t, op).await? {
                tx.rollback().await.map_err(|e| map_err(op, e, Some(t)))?;
                return Ok(denied);
            }
            let v = read(&mut tx).await.map_err(|e| map_err(op, e, Some(t)))?;
            tx.commit().await.map_err(|e| map_err(op, e, Some(t)))?;
            Ok(v)
        })
        .await
    }
}

/// Takes the thread's row for update in `tx` (creating nothing) and checks its owner:
/// `STORAGE_FORBIDDEN_001` for another user's thread. Taken first, before the thread's other
/// rows, in the order every writer takes them (a message delete and a clear next to each other
/// deadlocked otherwise; red-team, session 38).
pub(super) async fn hold_thread(
    s: &PgStore,
    tx: &mut PgConnection,
    t: &ThreadRef,
    op: &'static str,
) -> StoreResult<Held> {
    let owner: Option<String> = sqlx::query_scalar(s.sql.threads.hold_thread.q())
        .bind(&t.thread_id)
        .fetch_optional(tx)
        .await
        .map_err(|e| map_err(op, e, Some(t)))?;
    let isolated = t.isolated(s.opts.enforce_user_isolation);
    match owner {
        Some(o) if isolated && o != t.user_id => Err(StoreError::Forbidden { thread_id: t.thread_id.clone() }),
        None if isolated => Ok(Held::Nothing),
        _ => Ok(Held::Thread),
    }
}

/// Whether `t.user_id` may read the thread, as seen by `tx`: it has no row, or the user owns it.
async fn owns(s: &PgStore, tx: &mut PgConnection, t: &ThreadRef, op: &'static str) -> StoreResult<bool> {
    let owner: Option<String> = sqlx::query_scalar(s.sql.threads.owner.q())
        .bind(&t.thread_id)
        .fetch_optional(tx)
        .await
        .map_err(|e| map_err(op, e, Some(t)))?;
    Ok(owner.is_none_or(|o| o == t.user_id))
}
