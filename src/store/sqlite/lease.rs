//! Thread leases with fencing tokens, and the fence check every write makes in its transaction.

use super::*;

/// Refuses the write when the thread's lease has moved on from `fence` (inside the write's
/// transaction: BEGIN IMMEDIATE already excludes a concurrent takeover).
pub(super) async fn check_fence(c: &mut SqliteConnection, thread_id: &str, fence: Option<i64>) -> StoreResult<()> {
    if fence.is_none() {
        return Ok(());
    }
    let current: Option<i64> = sqlx::query_scalar("SELECT token FROM leases WHERE thread_id = ?")
        .bind(thread_id)
        .fetch_optional(&mut *c)
        .await
        .map_err(be("read lease"))?;
    if fence_ok(current, fence) {
        Ok(())
    } else {
        Err(StoreError::Fenced { thread_id: thread_id.to_owned(), token: fence.unwrap_or_default(), current })
    }
}

pub(super) async fn release_in(c: &mut SqliteConnection, thread_id: &str, token: i64) -> StoreResult<()> {
    sqlx::query("UPDATE leases SET released = 1, expires_at = ? WHERE thread_id = ? AND token = ?")
        .bind(now_secs())
        .bind(thread_id)
        .bind(token)
        .execute(c)
        .await
        .map_err(be("release lease"))?;
    Ok(())
}

pub(super) fn lease_info(r: &sqlx::sqlite::SqliteRow, now: f64) -> LeaseInfo {
    LeaseInfo {
        token: r.get("token"),
        holder: r.get("holder"),
        host: r.get("host"),
        pid: r.get("pid"),
        pid_start: r.get("pid_start"),
        expires_in: r.get::<f64, _>("expires_at") - now,
        released: r.get::<i64, _>("released") != 0,
    }
}

/// When a lease taken or renewed at `now` for `ttl` lapses: `ttl` plus the longest a renewal may
/// wait for the file's write lock (`BUSY_TIMEOUT`, the store's `lease_grace`). Another connection
/// holding the lock past `ttl` (a long write of another process) kept the holder's renewal waiting
/// while its lease lapsed; when the lock came free, SQLite's busy handler (no queue: a waiter that
/// has waited longer polls less often) let a newcomer in first, who took the lapsed lease, and the
/// holder's returned tools were fenced out and ran again there (red-team, session 26: 2 of 4
/// rounds with the lock held 7 s). A live holder stuck for good is taken over that much later; a
/// dead one is taken over at once, as before (its process is gone: `engine::lease`).
fn expires_at(s: &SqliteStore, now: f64, ttl: Duration) -> f64 {
    now + ttl.as_secs_f64() + s.lease_grace.as_secs_f64()
}

pub(super) const LEASE_COLUMNS: &str =
    "SELECT token, holder, host, pid, pid_start, expires_at, released FROM leases WHERE thread_id = ?";

pub(super) async fn lease_acquire(s: &SqliteStore, thread_id: &str, req: &LeaseRequest) -> StoreResult<LeaseAttempt> {
    let mut tx = s.write_tx("acquire lease").await?;
    let attempt = take_in(s, tx.conn(), thread_id, req).await?;
    if matches!(attempt, LeaseAttempt::Acquired { .. }) {
        tx.commit("acquire lease").await?;
    }
    Ok(attempt)
}

/// The take inside the caller's write transaction (BEGIN IMMEDIATE).
pub(super) async fn take_in(
    s: &SqliteStore,
    c: &mut SqliteConnection,
    thread_id: &str,
    req: &LeaseRequest,
) -> StoreResult<LeaseAttempt> {
    if let Some(user) = req.user_id.as_deref().filter(|_| s.enforce_user_isolation || req.owner_scoped) {
        // Inside BEGIN IMMEDIATE: no writer can create or hand over the thread in between.
        let owner: Option<String> = sqlx::query_scalar("SELECT user_id FROM threads WHERE thread_id = ?")
            .bind(thread_id)
            .fetch_optional(&mut *c)
            .await
            .map_err(be("read thread"))?;
        if owner.is_some_and(|o| o != user) {
            return Err(StoreError::Forbidden { thread_id: thread_id.to_owned() });
        }
    }
    let now = now_secs();
    let cur = sqlx::query(LEASE_COLUMNS)
        .bind(thread_id)
        .fetch_optional(&mut *c)
        .await
        .map_err(be("read lease"))?
        .map(|r| lease_info(&r, now));
    if !may_take(cur.as_ref(), req) {
        return Ok(LeaseAttempt::Held(cur.expect("may_take is true without a row")));
    }
    // From the file's counter (schema v3), never below the row's own: see `store::lease`.
    let token: i64 = sqlx::query_scalar("UPDATE lease_tokens SET last = MAX(last, ?) + 1 WHERE id = 1 RETURNING last")
        .bind(cur.map_or(0, |c| c.token))
        .fetch_one(&mut *c)
        .await
        .map_err(be("draw lease token"))?;
    sqlx::query(
        "INSERT INTO leases (thread_id, token, holder, host, pid, pid_start, expires_at, released, acquired_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT (thread_id) DO UPDATE SET token = excluded.token, \
         holder = excluded.holder, host = excluded.host, pid = excluded.pid, pid_start = excluded.pid_start, \
         expires_at = excluded.expires_at, released = 0, acquired_at = excluded.acquired_at",
    )
    .bind(thread_id)
    .bind(token)
    .bind(&req.holder)
    .bind(&req.host)
    .bind(req.pid)
    .bind(req.pid_start)
    .bind(expires_at(s, now, req.ttl))
    .bind(now)
    .execute(&mut *c)
    .await
    .map_err(be("acquire lease"))?;
    Ok(LeaseAttempt::Acquired { token })
}

pub(super) async fn lease_renew(s: &SqliteStore, thread_id: &str, token: i64, ttl: Duration) -> StoreResult<bool> {
    let r = sqlx::query("UPDATE leases SET expires_at = ? WHERE thread_id = ? AND token = ? AND released = 0")
        .bind(expires_at(s, now_secs(), ttl))
        .bind(thread_id)
        .bind(token)
        .execute(&s.pool)
        .await
        .map_err(be("renew lease"))?;
    Ok(r.rows_affected() > 0)
}

pub(super) async fn lease_release(s: &SqliteStore, thread_id: &str, token: i64) -> StoreResult<()> {
    let mut c = s.pool.acquire().await.map_err(be("release lease"))?;
    // A thread deleted while this run held its lease: the row goes (nothing else would ever
    // delete it; tokens come from one counter, so a reused id is still fenced). When the row
    // went, the UPDATE below finds nothing; a thread deleted between the two statements keeps a
    // released row, as every such row did before.
    sqlx::query(
        "DELETE FROM leases WHERE thread_id = ? AND token = ?          AND NOT EXISTS (SELECT 1 FROM threads WHERE thread_id = ?)",
    )
    .bind(thread_id)
    .bind(token)
    .bind(thread_id)
    .execute(&mut *c)
    .await
    .map_err(be("release lease"))?;
    release_in(&mut c, thread_id, token).await
}

pub(super) async fn lease_get(s: &SqliteStore, thread_id: &str) -> StoreResult<Option<LeaseInfo>> {
    let now = now_secs();
    Ok(sqlx::query(LEASE_COLUMNS)
        .bind(thread_id)
        .fetch_optional(&s.pool)
        .await
        .map_err(be("read lease"))?
        .map(|r| lease_info(&r, now)))
}
