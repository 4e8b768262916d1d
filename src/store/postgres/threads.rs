//! Thread rows: create or update, read, list (by user, search, paging), delete with everything
//! that hangs off them (cascade), the owner, the thread lock, and the threads with a run under way.

use super::nul::strip_nul;
use super::owned::Held;
use super::{Casts, PgStore, Stmt, map_err};
use crate::store::{StoreResult, ThreadRef, ThreadRow};
use serde_json::Value;
use sqlx::Row;

pub(super) struct Stmts {
    lock_thread: Stmt,
    pub(super) hold_thread: Stmt,
    exists: Stmt,
    update: Stmt,
    get: Stmt,
    list: Stmt,
    delete: Stmt,
    lock_lease: Stmt,
    pub(super) owner: Stmt,
    running: Stmt,
    legacy_possible: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let (t, u, tt, ut) = (c.id, c.user, c.id_text, c.user_text);
        let columns = format!(
            "SELECT thread_id{tt} AS thread_id, user_id{ut} AS user_id, thread_name, COALESCE(meta, '{{}}'::jsonb) AS meta, \
             EXTRACT(EPOCH FROM created_at)::float8 AS created_at, EXTRACT(EPOCH FROM updated_at)::float8 AS updated_at"
        );
        Stmts {
            lock_thread: Stmt::new(format!("SELECT {s}.tenx_lock_thread($1, $2, $3)")),
            hold_thread: Stmt::new(format!("SELECT user_id{ut} FROM {s}.threads WHERE thread_id = $1{t} FOR UPDATE")),
            exists: Stmt::new(format!("SELECT EXISTS (SELECT 1 FROM {s}.threads WHERE thread_id = $1{t})")),
            update: Stmt::new(format!(
                "UPDATE {s}.threads SET thread_name = COALESCE($2, thread_name), meta = $3, updated_at = NOW() WHERE thread_id = $1{t}"
            )),
            get: Stmt::new(format!("{columns} FROM {s}.threads WHERE thread_id = $1{t}")),
            list: Stmt::new(format!(
                "{columns} FROM {s}.threads \
                 WHERE ($1::text IS NULL OR user_id = $1{u}) AND ($2::text IS NULL OR thread_name ILIKE $2 OR thread_id{tt} ILIKE $2) \
                 ORDER BY updated_at DESC OFFSET $3 LIMIT $4"
            )),
            // The thread's lease row goes too unless somebody holds it: tokens come from one
            // sequence (version 13), so a reused id never gets back a token of its earlier life.
            delete: Stmt::new(format!(
                "WITH free AS (DELETE FROM {s}.tenx_leases l WHERE l.thread_id = $1::text \
                   AND (l.released OR l.expires_at <= clock_timestamp())) \
                 DELETE FROM {s}.threads WHERE thread_id = $1::text{t}"
            )),
            lock_lease: Stmt::new(format!("SELECT 1 FROM {s}.tenx_leases WHERE thread_id = $1::text FOR UPDATE")),
            owner: Stmt::new(format!("SELECT user_id{ut} AS user_id FROM {s}.threads WHERE thread_id = $1{t}")),
            // `Checkpointer::may_hold_legacy_run`: a latest state row 10xGraph wrote (the
            // context inside), or none and tools in the ledger.
            legacy_possible: Stmt::new(format!(
                "SELECT COALESCE((SELECT state_data ? 'context' FROM {s}.states WHERE thread_id = $1{t} \
                                  ORDER BY version DESC, state_id DESC LIMIT 1), \
                                 EXISTS (SELECT 1 FROM {s}.tool_executions WHERE thread_id = $1{t}))"
            )),
            // One index lookup (thread_id, version DESC) per thread for its latest row.
            // With the threads 10xGraph's Redis entries show a run under way in ($3-$5: thread,
            // user, the entry's version): taken where the thread's latest row is 10xGraph's at
            // that version, or where it has none and the entry no version (what a resume from the
            // entry requires; `legacy_resume`), and the thread is this user's in this database:
            // 10xGraph's keys name no database, and one Redis may serve several (10xGraph writes
            // the thread's row with a run's first tool result: a run killed before any tool
            // finished has none, and is left to the thread's own `ainvoke({})`).
            running: Stmt::new(format!(
                "SELECT x.thread_id{tt} AS thread_id, x.user_id{ut} AS user_id FROM ( \
                   SELECT t.thread_id, t.user_id FROM {s}.threads t \
                   CROSS JOIN LATERAL (SELECT state_data FROM {s}.states st WHERE st.thread_id = t.thread_id \
                                       ORDER BY version DESC, state_id DESC LIMIT 1) st \
                   WHERE st.state_data->'execution_meta'->>'status' = 'running' \
                     AND ($1::text IS NULL OR t.thread_id > $1{t}) \
                   UNION \
                   SELECT c.tid{t}, c.uid{u} FROM unnest($3::text[], $4::text[], $5::bigint[]) AS c(tid, uid, ver) \
                   WHERE ($1::text IS NULL OR c.tid{t} > $1{t}) \
                     AND EXISTS (SELECT 1 FROM {s}.threads o WHERE o.thread_id = c.tid{t} AND o.user_id = c.uid{u}) \
                     AND COALESCE((SELECT st.state_data ? 'context' AND st.version IS NOT DISTINCT FROM c.ver FROM {s}.states st \
                                   WHERE st.thread_id = c.tid{t} ORDER BY version DESC, state_id DESC LIMIT 1), \
                                  c.ver IS NULL) \
                 ) x ORDER BY x.thread_id LIMIT $2"
            )),
        }
    }
}

fn thread_row(r: &sqlx::postgres::PgRow) -> ThreadRow {
    ThreadRow {
        thread_id: r.get("thread_id"),
        user_id: r.get("user_id"),
        thread_name: r.get("thread_name"),
        meta: r.get("meta"),
        created_at: r.get::<Option<f64>, _>("created_at").unwrap_or(0.0),
        updated_at: r.get::<Option<f64>, _>("updated_at").unwrap_or(0.0),
    }
}

/// Ensures and locks the thread row inside `tx`, checking the owner (`StoreError::Forbidden`).
pub(super) async fn lock_thread(
    s: &PgStore,
    tx: &mut sqlx::PgConnection,
    t: &ThreadRef,
    op: &'static str,
) -> StoreResult<()> {
    lock_thread_in(s, tx, t).await.map_err(|e| map_err(op, e, Some(t)))
}

/// `lock_thread` with the server's error as it came (a caller that sends its transaction again
/// when the server aborted it tells that error apart).
pub(super) async fn lock_thread_in(s: &PgStore, tx: &mut sqlx::PgConnection, t: &ThreadRef) -> Result<(), sqlx::Error> {
    sqlx::query(s.sql.threads.lock_thread.q())
        .bind(&t.thread_id)
        .bind(&t.user_id)
        .bind(t.isolated(s.opts.enforce_user_isolation))
        .execute(tx)
        .await
        .map(|_| ())
}

pub(super) async fn put_thread(s: &PgStore, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
    // U+0000 as for every other stored text (states, messages, ledger): U+FFFD, with the warning.
    // The server refused it here alone, so a name or metadata SQLite and memory took failed.
    let (mut name, mut meta) = (name.map(|n| Value::String(n.to_owned())), meta.clone());
    if let Some(n) = name.as_mut() {
        strip_nul(n);
    }
    strip_nul(&mut meta);
    let name = name.as_ref().and_then(Value::as_str);
    let mut tx = s.conns.begin().await.map_err(|e| map_err("write thread", e, Some(t)))?;
    let existed: bool = sqlx::query_scalar(s.sql.threads.exists.q())
        .bind(&t.thread_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| map_err("write thread", e, Some(t)))?;
    lock_thread(s, &mut tx, t, "write thread").await?;
    sqlx::query(s.sql.threads.update.q())
        .bind(&t.thread_id)
        .bind(name)
        .bind(&meta)
        .execute(&mut *tx)
        .await
        .map_err(|e| map_err("write thread", e, Some(t)))?;
    tx.commit().await.map_err(|e| map_err("write thread", e, Some(t)))?;
    Ok(!existed)
}

pub(super) async fn get_thread(s: &PgStore, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
    let row = s
        .read_owned(t, "read threads", None, async |c| {
            sqlx::query(s.sql.threads.get.q()).bind(&t.thread_id).fetch_optional(c).await
        })
        .await?;
    Ok(row.as_ref().map(thread_row))
}

pub(super) async fn list_threads(
    s: &PgStore,
    user_id: Option<&str>,
    search: Option<&str>,
    offset: Option<i64>,
    limit: Option<i64>,
) -> StoreResult<Vec<ThreadRow>> {
    let rows = sqlx::query(s.sql.threads.list.q())
        .bind(user_id)
        // Literal: `%`, `_` and the escape character itself are escaped (ILIKE's default escape
        // is the backslash), so the search means the same as on the other stores.
        .bind(search.map(|s| format!("%{}%", s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"))))
        .bind(offset.unwrap_or(0).max(0))
        .bind(limit)
        .fetch_all(&s.conns)
        .await
        .map_err(|e| map_err("read threads", e, None))?;
    Ok(rows.iter().map(thread_row).collect())
}

pub(super) async fn clean_thread(s: &PgStore, t: &ThreadRef) -> StoreResult<()> {
    // The lease row first, then the thread: the order a run's input and step commits lock them
    // in. The delete alone locked the thread (and its rows) first and the lease row last, so it
    // could deadlock with a run taking the thread's lease (red-team, session 21).
    let mut tx = s.conns.begin().await.map_err(|e| map_err("delete thread", e, Some(t)))?;
    sqlx::query(s.sql.threads.lock_lease.q())
        .bind(&t.thread_id)
        .execute(&mut *tx)
        .await
        .map_err(|e| map_err("delete thread", e, Some(t)))?;
    if super::owned::hold_thread(s, &mut tx, t, "delete thread").await? == Held::Nothing {
        return tx.rollback().await.map_err(|e| map_err("delete thread", e, Some(t)));
    }
    forget_legacy_entry(s, &mut tx, t, "delete thread").await?;
    sqlx::query(s.sql.threads.delete.q())
        .bind(&t.thread_id)
        .execute(&mut *tx)
        .await
        .map_err(|e| map_err("delete thread", e, Some(t)))?;
    tx.commit().await.map_err(|e| map_err("delete thread", e, Some(t)))?;
    if let Some(r) = s.redis() {
        r.clear_state_cache(t).await;
    }
    Ok(())
}

/// Deletes 10xGraph's Redis entry of a thread being deleted or cleared (inside its transaction,
/// before the rows go), where the thread may have a run in it alone; Err, and nothing deleted,
/// when Redis does not answer. Left behind (Redis down, or failed moments before), the entry of
/// a deleted thread came back when Redis did: the next conversation on the id was refused as
/// busy, and `{}` resumed the deleted run, its tools fired again (red-team, session 42).
pub(super) async fn forget_legacy_entry(
    s: &PgStore,
    tx: &mut sqlx::PgConnection,
    t: &ThreadRef,
    op: &'static str,
) -> StoreResult<()> {
    let Some(r) = s.redis_configured() else { return Ok(()) };
    let possible = may_hold_legacy_run(s, &mut *tx, t).await.map_err(|e| map_err(op, e, Some(t)))?;
    if possible { r.forget_legacy_state(t).await } else { Ok(()) }
}

pub(super) async fn may_hold_legacy_run<'e>(
    s: &PgStore,
    ex: impl sqlx::PgExecutor<'e>,
    t: &ThreadRef,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(s.sql.threads.legacy_possible.q()).bind(&t.thread_id).fetch_one(ex).await
}

pub(super) async fn thread_owner(s: &PgStore, thread_id: &str) -> StoreResult<Option<String>> {
    sqlx::query_scalar(s.sql.threads.owner.q())
        .bind(thread_id)
        .fetch_optional(&s.conns)
        .await
        .map_err(|e| map_err("read thread owner", e, None))
}

pub(super) async fn running_threads(s: &PgStore, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
    // 10xGraph's runs that live only in its Redis entries, for a store that was given its Redis.
    // Redis down: the rows' runs are still listed (the entries' runs are then resumed by the
    // thread's next `ainvoke({})`, or by a later pass), with a warning.
    let scanned = match s.redis_configured() {
        Some(r) => r.legacy_running_threads().await,
        None => Ok(Vec::new()),
    };
    let mut legacy = match scanned {
        Ok(found) => {
            *s.legacy_scan_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
            found
        }
        Err(e) => {
            tracing::warn!(event = "legacy_cache_unreachable", "recovery lists the database's runs only: {e}");
            *s.legacy_scan_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            Vec::new()
        }
    };
    // An id the schema cannot hold is no thread of this database.
    legacy.retain(|(t, _)| s.check_thread(t).is_ok());
    let (tids, uids, versions): (Vec<&str>, Vec<&str>, Vec<Option<i64>>) =
        legacy.iter().map(|(t, v)| (t.thread_id.as_str(), t.user_id.as_str(), *v)).collect();
    let rows = sqlx::query(s.sql.threads.running.q())
        .bind(after)
        .bind(limit.max(0))
        .bind(tids)
        .bind(uids)
        .bind(versions)
        .fetch_all(&s.conns)
        .await
        .map_err(|e| map_err("list running threads", e, None))?;
    Ok(rows.iter().map(|r| ThreadRef::new(r.get::<String, _>("thread_id"), r.get::<String, _>("user_id"))).collect())
}
