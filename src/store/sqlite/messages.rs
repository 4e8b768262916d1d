//! Messages written or deleted outside a step, and reads of them.

use super::*;

/// Messages changed outside a step: the latest state row no longer describes them (see
/// `clear_write_mark`).
pub(super) async fn unmark_latest(
    c: &mut SqliteConnection,
    t: &ThreadRef,
    after: Option<&crate::store::ChangeMark>,
) -> StoreResult<()> {
    // The caller's own mark while the row still carries the one it read (`ChangeMark`).
    sqlx::query(
        "UPDATE states SET state_data = json_set(state_data, ?1, \
           CASE WHEN COALESCE(json_extract(state_data, ?1), '') = ?2 THEN ?3 ELSE ?4 END) \
         WHERE thread_id = ?5 AND version = (SELECT MAX(version) FROM states WHERE thread_id = ?5)",
    )
    .bind(crate::store::write_mark_json_path())
    .bind(after.map(|a| a.seen.as_str()))
    .bind(after.map(|a| a.mark.as_str()))
    .bind(crate::store::messages_changed_mark())
    .bind(&t.thread_id)
    .execute(&mut *c)
    .await
    .map_err(be("write messages"))?;
    Ok(())
}

/// Inserts or replaces messages by id (a message keeps its place when it is rewritten).
pub(super) async fn upsert_messages(
    c: &mut SqliteConnection,
    t: &ThreadRef,
    msgs: &[StoredMessage],
) -> StoreResult<()> {
    let now = now_secs();
    for m in msgs {
        sqlx::query(
            "INSERT INTO messages (thread_id, message_id, message_data, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (thread_id, message_id) DO UPDATE SET message_data = excluded.message_data",
        )
        .bind(&t.thread_id)
        .bind(&m.id)
        .bind(m.data.get())
        .bind(now)
        .execute(&mut *c)
        .await
        .map_err(be("write message"))?;
    }
    Ok(())
}

pub(super) async fn put_messages(
    s: &SqliteStore,
    t: &ThreadRef,
    msgs: &[StoredMessage],
    after: Option<&crate::store::ChangeMark>,
) -> StoreResult<()> {
    let mut tx = s.write_tx("write messages").await?;
    s.own_thread(tx.conn(), t).await?;
    super::messages::upsert_messages(tx.conn(), t, msgs).await?;
    if !msgs.is_empty() {
        unmark_latest(tx.conn(), t, after).await?;
    }
    tx.commit("write messages").await
}

pub(super) async fn get_message(s: &SqliteStore, t: &ThreadRef, message_id: &str) -> StoreResult<Option<RawJson>> {
    let mut tx = Tx::read(&s.pool, "read message").await?;
    if !s.readable(tx.conn(), t).await? {
        return Ok(None);
    }
    let s: Option<String> =
        sqlx::query_scalar("SELECT message_data FROM messages WHERE thread_id = ? AND message_id = ?")
            .bind(&t.thread_id)
            .bind(message_id)
            .fetch_optional(tx.conn())
            .await
            .map_err(be("read message"))?;
    tx.commit("read message").await?;
    s.map(|s| stored_text("read message", s)).transpose()
}

pub(super) async fn list_messages(
    s: &SqliteStore,
    t: &ThreadRef,
    search: Option<&str>,
    offset: Option<i64>,
    limit: Option<i64>,
) -> StoreResult<Vec<RawJson>> {
    let mut tx = Tx::read(&s.pool, "list messages").await?;
    if !s.readable(tx.conn(), t).await? {
        return Ok(vec![]);
    }
    let Some(needle) = search.map(str::to_lowercase) else {
        let rows: Vec<String> =
            sqlx::query_scalar("SELECT message_data FROM messages WHERE thread_id = ? ORDER BY seq LIMIT ? OFFSET ?")
                .bind(&t.thread_id)
                .bind(limit.unwrap_or(-1))
                .bind(offset.unwrap_or(0).max(0))
                .fetch_all(tx.conn())
                .await
                .map_err(be("list messages"))?;
        tx.commit("list messages").await?;
        return rows.into_iter().map(|s| stored_text("list messages", s)).collect();
    };
    // Matched here, not by SQLite: its lower() and LIKE fold ASCII only, and the search ignores
    // case as 10xGraph's does ("été" finds "ÉTÉ"), the same test as the memory store's.
    let rows: Vec<String> = sqlx::query_scalar("SELECT message_data FROM messages WHERE thread_id = ? ORDER BY seq")
        .bind(&t.thread_id)
        .fetch_all(tx.conn())
        .await
        .map_err(be("list messages"))?;
    tx.commit("list messages").await?;
    let found: Vec<RawJson> =
        rows.into_iter().map(|s| stored_text("list messages", s)).collect::<StoreResult<Vec<_>>>()?;
    Ok(crate::store::page(found.into_iter().filter(|m| crate::store::message_matches(m, &needle)), offset, limit))
}

pub(super) async fn delete_message(
    s: &SqliteStore,
    t: &ThreadRef,
    message_id: &str,
    after: Option<&crate::store::ChangeMark>,
) -> StoreResult<bool> {
    let mut tx = s.write_tx("delete message").await?;
    if !s.readable(tx.conn(), t).await? {
        return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
    }
    let r = sqlx::query("DELETE FROM messages WHERE thread_id = ? AND message_id = ?")
        .bind(&t.thread_id)
        .bind(message_id)
        .execute(tx.conn())
        .await
        .map_err(be("delete message"))?;
    let deleted = r.rows_affected() > 0;
    if deleted {
        unmark_latest(tx.conn(), t, after).await?;
    }
    tx.commit("delete message").await?;
    Ok(deleted)
}
