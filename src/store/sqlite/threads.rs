//! Thread rows: owner, name, metadata, listing, and the threads a recovery pass looks at.

use super::*;

pub(super) fn thread_row(r: &sqlx::sqlite::SqliteRow) -> StoreResult<ThreadRow> {
    let meta: String = r.get("meta");
    Ok(ThreadRow {
        thread_id: r.get("thread_id"),
        user_id: r.get("user_id"),
        thread_name: r.get("thread_name"),
        meta: parse("read thread", &meta)?,
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
    })
}

pub(super) async fn put_thread(s: &SqliteStore, t: &ThreadRef, name: Option<&str>, meta: &Value) -> StoreResult<bool> {
    let mut tx = s.write_tx("write thread").await?;
    let inserted = s.own_thread(tx.conn(), t).await?;
    sqlx::query(
        "UPDATE threads SET thread_name = COALESCE(?, thread_name), meta = ?, updated_at = ? WHERE thread_id = ?",
    )
    .bind(name)
    .bind(to_text(meta))
    .bind(now_secs())
    .bind(&t.thread_id)
    .execute(tx.conn())
    .await
    .map_err(be("write thread"))?;
    tx.commit("write thread").await?;
    Ok(inserted)
}

pub(super) async fn get_thread(s: &SqliteStore, t: &ThreadRef) -> StoreResult<Option<ThreadRow>> {
    let r = sqlx::query("SELECT * FROM threads WHERE thread_id = ?")
        .bind(&t.thread_id)
        .fetch_optional(&s.pool)
        .await
        .map_err(be("read thread"))?;
    // The row carries its owner: checked on the row read, not on an earlier one.
    let row = r.as_ref().map(thread_row).transpose()?;
    Ok(row.filter(|r| !t.isolated(s.enforce_user_isolation) || r.user_id == t.user_id))
}

pub(super) async fn list_threads(
    s: &SqliteStore,
    user_id: Option<&str>,
    search: Option<&str>,
    offset: Option<i64>,
    limit: Option<i64>,
) -> StoreResult<Vec<ThreadRow>> {
    let Some(needle) = search.map(str::to_lowercase) else {
        let rows = sqlx::query(
            "SELECT * FROM threads WHERE (? IS NULL OR user_id = ?) ORDER BY updated_at DESC LIMIT ? OFFSET ?",
        )
        .bind(user_id)
        .bind(user_id)
        .bind(limit.unwrap_or(-1))
        .bind(offset.unwrap_or(0).max(0))
        .fetch_all(&s.pool)
        .await
        .map_err(be("list threads"))?;
        return rows.iter().map(thread_row).collect();
    };
    // Matched here: SQLite's LIKE took `%` and `_` in the search as wildcards ("_" listed every
    // thread) and folded ASCII only; the search is literal and ignores case, as 10xGraph's.
    let rows = sqlx::query("SELECT * FROM threads WHERE (? IS NULL OR user_id = ?) ORDER BY updated_at DESC")
        .bind(user_id)
        .bind(user_id)
        .fetch_all(&s.pool)
        .await
        .map_err(be("list threads"))?;
    let all = rows.iter().map(thread_row).collect::<StoreResult<Vec<_>>>()?;
    Ok(crate::store::page(all.into_iter().filter(|r| crate::store::thread_matches(r, &needle)), offset, limit))
}

pub(super) async fn clean_thread(s: &SqliteStore, t: &ThreadRef) -> StoreResult<()> {
    // Foreign keys cascade to states, messages and the ledger. The lease row goes too unless
    // somebody holds it (tokens come from the file's counter: a reused id gets new ones).
    let mut tx = s.write_tx("delete thread").await?;
    if !s.readable(tx.conn(), t).await? {
        return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
    }
    sqlx::query("DELETE FROM threads WHERE thread_id = ?")
        .bind(&t.thread_id)
        .execute(tx.conn())
        .await
        .map_err(be("delete thread"))?;
    sqlx::query("DELETE FROM leases WHERE thread_id = ? AND (released = 1 OR expires_at <= ?)")
        .bind(&t.thread_id)
        .bind(now_secs())
        .execute(tx.conn())
        .await
        .map_err(be("delete thread"))?;
    tx.commit("delete thread").await
}

pub(super) async fn thread_owner(s: &SqliteStore, thread_id: &str) -> StoreResult<Option<String>> {
    let mut c = s.pool.acquire().await.map_err(be("read thread owner"))?;
    owner_on(&mut c, thread_id).await
}

pub(super) async fn owner_on(c: &mut SqliteConnection, thread_id: &str) -> StoreResult<Option<String>> {
    sqlx::query_scalar("SELECT user_id FROM threads WHERE thread_id = ?")
        .bind(thread_id)
        .fetch_optional(c)
        .await
        .map_err(be("read thread owner"))
}

pub(super) async fn running_threads(s: &SqliteStore, after: Option<&str>, limit: i64) -> StoreResult<Vec<ThreadRef>> {
    let rows = sqlx::query(
        "SELECT t.thread_id, t.user_id FROM threads t JOIN states s ON s.thread_id = t.thread_id \
         WHERE s.version = (SELECT MAX(version) FROM states WHERE thread_id = t.thread_id) \
           AND json_extract(s.state_data, '$.execution_meta.status') = 'running' \
           AND (?1 IS NULL OR t.thread_id > ?1) \
         ORDER BY t.thread_id LIMIT ?2",
    )
    .bind(after)
    .bind(limit.max(0))
    .fetch_all(&s.pool)
    .await
    .map_err(be("list running threads"))?;
    Ok(rows.iter().map(|r| ThreadRef::new(r.get::<String, _>("thread_id"), r.get::<String, _>("user_id"))).collect())
}
