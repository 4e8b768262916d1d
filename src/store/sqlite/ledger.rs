//! The tool ledger: one read of a node's calls, results (first wins over an intent), intent marks.

use super::*;

pub(super) async fn ledger_get(s: &SqliteStore, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    // One query for the whole node: the keys go in as a JSON array. A non-owner under user
    // isolation reads nothing, checked in the same query.
    let rows = sqlx::query(
        "SELECT tool_call_id, result FROM tool_executions WHERE thread_id = ?1 \
         AND tool_call_id IN (SELECT value FROM json_each(?2)) \
         AND (?3 = 0 OR NOT EXISTS (SELECT 1 FROM threads WHERE thread_id = ?1 AND user_id <> ?4))",
    )
    .bind(&t.thread_id)
    .bind(to_text(&Value::from(keys.to_vec())))
    .bind(t.isolated(s.enforce_user_isolation))
    .bind(&t.user_id)
    .fetch_all(&s.pool)
    .await
    .map_err(be("ledger read"))?;
    let mut out = HashMap::with_capacity(rows.len());
    for r in rows {
        let text: String = r.get("result");
        // A row that is not JSON is "no record": the caller runs the tool.
        if let Ok(v) = serde_json::from_str(&text) {
            out.insert(r.get("tool_call_id"), v);
        }
    }
    Ok(out)
}

pub(super) async fn ledger_put_many(
    s: &SqliteStore,
    t: &ThreadRef,
    entries: &[LedgerRow],
    fence: Option<i64>,
) -> StoreResult<usize> {
    let mut tx = s.write_tx("ledger write").await?;
    check_fence(tx.conn(), &t.thread_id, fence).await?;
    if s.own_thread(tx.conn(), t).await? && fence.is_some() {
        // A run's write: its input commit made the thread, so the thread was deleted under it
        // (its held lease row kept the fence passing). Creating it again would bring the deleted
        // thread back with this row and no state; the transaction is dropped, nothing written.
        return Err(StoreError::Fenced {
            thread_id: t.thread_id.clone(),
            token: fence.unwrap_or_default(),
            current: None,
        });
    }
    let inserted = rows_in(tx.conn(), t, entries).await?;
    tx.commit("ledger write").await?;
    Ok(inserted)
}

/// Ledger rows inside the caller's write transaction, whose fence and owner checks are done:
/// the first result wins, and a result replaces an intent.
pub(super) async fn rows_in(c: &mut SqliteConnection, t: &ThreadRef, entries: &[LedgerRow]) -> StoreResult<usize> {
    let now = now_secs();
    let mut inserted = 0;
    for (key, result) in entries {
        let r = sqlx::query(
            "INSERT INTO tool_executions (thread_id, tool_call_id, result, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (thread_id, tool_call_id) DO UPDATE SET result = excluded.result, created_at = excluded.created_at \
             WHERE json_extract(tool_executions.result, '$.__kind__') = 'started' \
               AND json_extract(excluded.result, '$.__kind__') IS NOT 'started'",
        )
        .bind(&t.thread_id)
        .bind(key)
        .bind(result.get())
        .bind(now)
        .execute(&mut *c)
        .await
        .map_err(be("ledger write"))?;
        inserted += r.rows_affected() as usize;
    }
    Ok(inserted)
}

pub(super) async fn ledger_mark(
    s: &SqliteStore,
    t: &ThreadRef,
    marks: &[(String, Value)],
    fence: Option<i64>,
) -> StoreResult<usize> {
    let mut tx = s.write_tx("ledger write").await?;
    check_fence(tx.conn(), &t.thread_id, fence).await?;
    if s.own_thread(tx.conn(), t).await? && fence.is_some() {
        // As in ledger_put_many: the thread was deleted under the run.
        return Err(StoreError::Fenced {
            thread_id: t.thread_id.clone(),
            token: fence.unwrap_or_default(),
            current: None,
        });
    }
    let now = now_secs();
    let mut written = 0;
    for (key, mark) in marks.iter().filter(|(_, m)| is_intent(m)) {
        let r = sqlx::query(
            "UPDATE tool_executions SET result = ?, created_at = ? WHERE thread_id = ? AND tool_call_id = ? \
             AND json_extract(result, '$.__kind__') = 'started'",
        )
        .bind(to_text(mark))
        .bind(now)
        .bind(&t.thread_id)
        .bind(key)
        .execute(tx.conn())
        .await
        .map_err(be("ledger write"))?;
        written += r.rows_affected() as usize;
    }
    tx.commit("ledger write").await?;
    Ok(written)
}

pub(super) async fn ledger_list(s: &SqliteStore, t: &ThreadRef) -> StoreResult<Vec<crate::store::LedgerEntry>> {
    let mut tx = Tx::read(&s.pool, "ledger list").await?;
    if !s.readable(tx.conn(), t).await? {
        return Ok(vec![]);
    }
    let rows = sqlx::query(
        "SELECT tool_call_id, result, created_at FROM tool_executions WHERE thread_id = ? ORDER BY created_at, rowid",
    )
    .bind(&t.thread_id)
    .fetch_all(tx.conn())
    .await
    .map_err(be("ledger list"))?;
    tx.commit("ledger list").await?;
    Ok(rows
        .iter()
        .map(|r| crate::store::LedgerEntry {
            key: r.get("tool_call_id"),
            // Shown as malformed rather than failing the whole listing.
            result: serde_json::from_str(&r.get::<String, _>("result")).ok(),
            created_at: Some(r.get("created_at")),
        })
        .collect())
}
