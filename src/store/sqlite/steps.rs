//! Versioned steps: the latest state row (with or without its messages), the step write (version
//! check, state row, messages, history cap, lease release in one transaction), state versions.

use super::*;

pub(super) const STATE_HISTORY: i64 = 20;

pub(super) async fn load_with(
    s: &SqliteStore,
    t: &ThreadRef,
    known: Option<KnownHead<'_>>,
) -> StoreResult<Option<Checkpoint>> {
    // One snapshot for the owner check, the state row and the messages: read apart, another
    // connection's step could commit between them (a state row beside the next step's messages).
    let mut tx = Tx::read(&s.pool, "load").await?;
    let c = tx.conn();
    // A non-owner reads nothing (writes are what raise).
    if !s.readable(&mut *c, t).await? {
        return Ok(None);
    }
    let row = sqlx::query("SELECT version, state_data FROM states WHERE thread_id = ? ORDER BY version DESC LIMIT 1")
        .bind(&t.thread_id)
        .fetch_optional(&mut *c)
        .await
        .map_err(be("load state"))?;
    let Some(row) = row else { return Ok(None) };
    let state_text: String = row.get("state_data");
    let version: i64 = row.get("version");
    let state = parse("load state", &state_text)?;
    if known.is_some_and(|k| k.matches(version, &state)) {
        tx.commit("load").await?;
        return Ok(Some(Checkpoint {
            version,
            state,
            messages: Vec::new(),
            rewrite_messages: false,
            messages_known: true,
        }));
    }
    let msgs: Vec<String> = sqlx::query_scalar("SELECT message_data FROM messages WHERE thread_id = ? ORDER BY seq")
        .bind(&t.thread_id)
        .fetch_all(&mut *c)
        .await
        .map_err(be("load messages"))?;
    tx.commit("load").await?;
    Ok(Some(Checkpoint {
        version,
        state,
        // Each row's text goes on as stored, checked to be one JSON value (a corrupt row is still
        // the load's error), not decoded.
        messages: msgs.into_iter().map(|m| stored_text("load messages", m)).collect::<StoreResult<_>>()?,
        rewrite_messages: false,
        messages_known: false,
    }))
}

pub(super) async fn put_step(s: &SqliteStore, t: &ThreadRef, w: StepWrite<'_>, rows: &[LedgerRow]) -> StoreResult<i64> {
    let mut tx = s.write_tx("begin step").await?;
    let new_version = step_in(s, tx.conn(), t, w).await?;
    if !rows.is_empty() {
        super::ledger::rows_in(tx.conn(), t, rows).await?;
    }
    if let Some(h) = w.in_tx {
        h.in_transaction().await.map_err(StoreError::Failpoint)?; // dropping tx rolls back
    }
    tx.commit("commit step").await?;
    Ok(new_version)
}

/// The step's writes inside the caller's write transaction (which rolls back on an error).
pub(super) async fn step_in(
    s: &SqliteStore,
    c: &mut SqliteConnection,
    t: &ThreadRef,
    w: StepWrite<'_>,
) -> StoreResult<i64> {
    check_fence(&mut *c, &t.thread_id, w.fence).await?;
    s.own_thread(&mut *c, t).await?;
    let latest: Option<(i64, Option<String>)> = sqlx::query_as(
        "SELECT version, json_extract(state_data, ?) FROM states WHERE thread_id = ? \
         ORDER BY version DESC LIMIT 1",
    )
    .bind(crate::store::write_mark_json_path())
    .bind(&t.thread_id)
    .fetch_optional(&mut *c)
    .await
    .map_err(be("read version"))?;
    let current = latest.as_ref().map_or(0, |(v, _)| *v);
    // A refusal drops `tx`, which rolls back: nothing of this step is written.
    crate::store::check_head(&w, t, current, latest.as_ref().and_then(|(_, m)| m.as_deref()))?;
    let new_version = current + 1;
    let now = now_secs();
    sqlx::query("INSERT INTO states (thread_id, version, state_data, created_at) VALUES (?, ?, ?, ?)")
        .bind(&t.thread_id)
        .bind(new_version)
        .bind(crate::store::chained_state(&w, latest.as_ref().and_then(|(_, m)| m.as_deref())).0.get())
        .bind(now)
        .execute(&mut *c)
        .await
        .map_err(be("write state"))?;
    sqlx::query("DELETE FROM states WHERE thread_id = ? AND version <= ?")
        .bind(&t.thread_id)
        .bind(new_version - STATE_HISTORY)
        .execute(&mut *c)
        .await
        .map_err(be("prune states"))?;
    if w.replace_messages {
        sqlx::query("DELETE FROM messages WHERE thread_id = ?")
            .bind(&t.thread_id)
            .execute(&mut *c)
            .await
            .map_err(be("replace messages"))?;
    }
    super::messages::upsert_messages(&mut *c, t, w.new_messages).await?;
    sqlx::query("UPDATE threads SET updated_at = ? WHERE thread_id = ?")
        .bind(now)
        .bind(&t.thread_id)
        .execute(&mut *c)
        .await
        .map_err(be("touch thread"))?;
    if let (true, Some(token)) = (w.release_lease, w.fence) {
        release_in(&mut *c, &t.thread_id, token).await?;
    }
    Ok(new_version)
}

pub(super) async fn clear_state(s: &SqliteStore, t: &ThreadRef) -> StoreResult<()> {
    let mut tx = s.write_tx("clear state").await?;
    if !s.readable(tx.conn(), t).await? {
        return Err(StoreError::Forbidden { thread_id: t.thread_id.clone() });
    }
    for q in ["DELETE FROM states WHERE thread_id = ?", "DELETE FROM messages WHERE thread_id = ?"] {
        sqlx::query(q).bind(&t.thread_id).execute(tx.conn()).await.map_err(be("clear state"))?;
    }
    tx.commit("clear state").await
}

pub(super) async fn state_versions(s: &SqliteStore, t: &ThreadRef) -> StoreResult<Vec<crate::store::StateVersion>> {
    let mut tx = Tx::read(&s.pool, "state versions").await?;
    if !s.readable(tx.conn(), t).await? {
        return Ok(vec![]);
    }
    let rows =
        sqlx::query("SELECT version, state_data, created_at FROM states WHERE thread_id = ? ORDER BY version DESC")
            .bind(&t.thread_id)
            .fetch_all(tx.conn())
            .await
            .map_err(be("state versions"))?;
    tx.commit("state versions").await?;
    rows.iter()
        .map(|r| {
            Ok(crate::store::StateVersion {
                version: r.get("version"),
                created_at: Some(r.get("created_at")),
                state: parse("state versions", &r.get::<String, _>("state_data"))?,
            })
        })
        .collect()
}
