//! Durable steps: the one-round-trip load of a thread (state row and messages), the step commit
//! (`tenx_put_step`), and dropping a thread's state.

use super::messages::{message_json, message_rows};
use super::nul::nul_free_json;
use super::owned::Held;
use super::{Casts, PgStore, Stmt, map_err};
use crate::store::legacy_log;
use crate::store::{Checkpoint, KnownHead, StepWrite, StoreError, StoreResult, ThreadRef, raw_json_from_text};
use serde_json::Value;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};

pub(super) struct Stmts {
    /// Also the inner part of `start_read`'s statement.
    pub(super) load: Stmt,
    put_step: Stmt,
    /// `put_step` with ledger rows: `tenx_ledger_put` first (an `OFFSET 0` subquery is not
    /// flattened into the outer level, so it runs before the step), then `tenx_put_step`, in the
    /// statement's one transaction.
    put_step_ledger: Stmt,
    clear_states: Stmt,
    clear_messages: Stmt,
    /// The latest row's version and write mark (a write naming the mark it read checks it under
    /// the thread lock).
    head: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let (t, u) = (c.id, c.user);
        let message_json = message_json();
        let [meta, mark] = crate::store::WRITE_MARK_PATH;
        // A commit that frees the lease takes its row for update before anything else (one row,
        // counted, so the functions run once and after it). `tenx_put_step` reads the row under
        // a share lock, locks the thread row, and only at its end updates the lease row: another
        // transaction of the run holding its own share lock (a late ledger record's fence check)
        // and then waiting for the thread row made a deadlock, which the server broke by
        // aborting one of them (a stopped run raised STORAGE_TRANSIENT_001: fresh-clone CI,
        // session 37). Taken first, the row makes one wait for the other.
        let lease = format!(
            "(SELECT count(*) FROM (SELECT 1 FROM {s}.tenx_leases WHERE $10 AND $9::bigint IS NOT NULL \
               AND thread_id = $1::text FOR NO KEY UPDATE) k) lk"
        );
        Stmts {
            // One round trip: the owner check, the latest state and the thread's messages as one
            // array of their texts (for a row written by 10xGraph, whose context is inside the
            // state, its log: see `legacy_log`). Texts, not one jsonb array: no aggregate document is built here, and
            // each text goes on to the host as it is, never decoded into a `Value`.
            // With $4/$5 naming the row the caller still holds (KnownHead), the messages are
            // not read and `known` is true.
            load: Stmt::new(format!(
                // The latest row is picked first (LIMIT 1 in a subquery): with the CASE on the
                // outer level it runs for that row only. At the level of the ORDER BY it ran for
                // every kept state row, and any older row made it read all the messages.
                "SELECT st.version, st.state_data, st.known, \
                   CASE WHEN st.known THEN NULL ELSE \
                     (SELECT COALESCE(array_agg(x.m ORDER BY x.seq, x.created_at), '{{}}'::text[]) FROM \
                       (SELECT ({message_json})::text AS m, seq, created_at FROM {s}.messages WHERE thread_id = $1{t}) x) \
                   END AS msgs, \
                   CASE WHEN st.known OR NOT st.state_data ? 'context' THEN NULL ELSE \
                     (SELECT array_agg(m.message_id::text) FROM {s}.messages m \
                      WHERE m.thread_id = $1{t} AND m.updated_at > m.created_at \
                        AND m.updated_at > (SELECT min(so.created_at) FROM {s}.states so WHERE so.thread_id = $1{t}) \
                        AND NOT EXISTS (SELECT 1 FROM {s}.states sx WHERE sx.thread_id = $1{t} AND sx.created_at = m.updated_at)) \
                   END AS edited \
                 FROM (SELECT version, state_data, \
                         COALESCE(version = $4 AND state_data->'{meta}'->>'{mark}' = $5, false) AS known \
                       FROM {s}.states WHERE thread_id = $1{t} \
                         AND (NOT $2 OR NOT EXISTS (SELECT 1 FROM {s}.threads th WHERE th.thread_id = $1{t} AND th.user_id <> $3{u})) \
                       ORDER BY version DESC, state_id DESC LIMIT 1) st"
            )),
            put_step: Stmt::new(format!(
                "SELECT {s}.tenx_put_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) FROM {lease}"
            )),
            put_step_ledger: Stmt::new(format!(
                "SELECT {s}.tenx_put_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
                 FROM (SELECT {s}.tenx_ledger_put($1, $2, $8, $12::text[], $13::jsonb[], $9) FROM {lease} OFFSET 0) l"
            )),
            clear_states: Stmt::new(format!("DELETE FROM {s}.states WHERE thread_id = $1{t}")),
            clear_messages: Stmt::new(format!("DELETE FROM {s}.messages WHERE thread_id = $1{t}")),
            head: Stmt::new(format!(
                "SELECT version, state_data->'{meta}'->>'{mark}' FROM {s}.states WHERE thread_id = $1{t} \
                 ORDER BY version DESC LIMIT 1"
            )),
        }
    }
}

pub(super) async fn load_with(
    s: &PgStore,
    t: &ThreadRef,
    known: Option<KnownHead<'_>>,
) -> StoreResult<Option<Checkpoint>> {
    let row = sqlx::query(s.sql.steps.load.q())
        .bind(&t.thread_id)
        .bind(t.isolated(s.opts.enforce_user_isolation))
        .bind(&t.user_id)
        .bind(known.map(|k| k.version))
        .bind(known.map(|k| k.mark))
        .fetch_optional(&s.conns)
        .await
        .map_err(|e| map_err("load", e, Some(t)))?;
    // A non-owner reads nothing (writes are what raise).
    let Some(row) = row else { return Ok(None) };
    checkpoint_of(&row).map(Some)
}

/// A row of the load statement (or of `start_read`'s, which carries its columns) as the
/// checkpoint it holds.
pub(super) fn checkpoint_of(row: &sqlx::postgres::PgRow) -> StoreResult<Checkpoint> {
    // A row no decode takes (a number past f64's range that jsonb printed in full): an error
    // for this load, not a panic of the store's task.
    let mut state: Value = row.try_get("state_data").map_err(|e| StoreError::backend("load state", e))?;
    let messages_known: bool = row.get("known");
    // A row written by 10xGraph carries the whole context; ours keeps messages in their rows.
    let legacy_context = state.as_object_mut().and_then(|o| o.remove("context"));
    let texts = |msgs: Vec<String>| {
        msgs.into_iter()
            .map(|m| raw_json_from_text(m).map_err(|e| StoreError::backend("load messages", e)))
            .collect::<StoreResult<Vec<_>>>()
    };
    let (messages, rewrite_messages) = match (legacy_context, row.get::<Option<Vec<String>>, _>("msgs")) {
        (Some(Value::Array(ctx)), msgs) => {
            let log = texts(msgs.unwrap_or_default())?.into_iter().map(|m| (legacy_log::logged_id(&m), m)).collect();
            // Log rows edited on their own (`legacy_log::merged_keeping_edits`): updated after
            // they were logged, in no transaction that wrote a state row. 10xGraph logs a step's
            // messages in the step's transaction (one `NOW()` for both), its `aput_messages` in
            // one of its own; "after the latest row" missed an edit made before a later turn,
            // whose row still held the old text (red-team, session 41). Only after the oldest
            // state row 10xGraph kept: its history limit deletes older rows, and a turn's final
            // upsert of its messages then matched none, so every message of those turns counted
            // as edited and the log's older copy replaced a node's edit in the context.
            let edited: std::collections::HashSet<String> =
                row.get::<Option<Vec<String>>, _>("edited").unwrap_or_default().into_iter().collect();
            (legacy_log::merged_keeping_edits(&ctx, log, &edited), true)
        }
        (_, Some(msgs)) => (texts(msgs)?, false),
        _ => (Vec::new(), false),
    };
    Ok(Checkpoint { version: row.get("version"), state, messages, rewrite_messages, messages_known })
}

/// `sql` with the arguments a step commit and an input commit (`input_lease`) share, `$1`-`$8`
/// of both statements, bound in their one order.
pub(super) fn step_head(
    s: &PgStore,
    sql: &Stmt,
    t: &ThreadRef,
    w: &StepWrite<'_>,
) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(sql.q())
        .bind(&t.thread_id)
        .bind(&t.user_id)
        .bind(w.expected_version)
        .bind(sqlx::types::Json(nul_free_json(w.state)))
        .bind(message_rows(w.new_messages))
        .bind(w.replace_messages)
        .bind(s.opts.state_history_limit)
        .bind(t.isolated(s.opts.enforce_user_isolation))
}

/// The step, and with `rows` the ledger rows, in one statement.
pub(super) async fn put_step(
    s: &PgStore,
    t: &ThreadRef,
    w: StepWrite<'_>,
    rows: &[crate::store::LedgerRow],
) -> StoreResult<i64> {
    let sql = if rows.is_empty() { &s.sql.steps.put_step } else { &s.sql.steps.put_step_ledger };
    let (keys, results) = super::ledger::columns(rows);
    let step = || {
        let q = step_head(s, sql, t, &w).bind(w.fence).bind(w.release_lease).bind(w.previous_mark);
        if rows.is_empty() { q } else { q.bind(&keys).bind(&results) }
    };
    let version = |row: PgRow| row.try_get::<i64, _>(0);
    // Sent again while the server aborts it to break a lock cycle; `Ok(Err(_))` is a refusal
    // decided here (a moved mark, an armed failpoint), which nothing sends again.
    let sent = super::errors::sent_again_if_aborted("a step commit", t, || async {
        if w.in_tx.is_none() && w.expected_mark.is_none() {
            return step().fetch_one(&s.conns).await.and_then(version).map(Ok);
        }
        // An armed failpoint (the hook runs before COMMIT) or a mark to check first: an explicit
        // transaction. The check reads the latest row under the thread lock, which message
        // writes outside a step take too, so none lands between the check and the step.
        let mut tx = s.conns.begin().await?;
        if w.expected_mark.is_some() {
            super::threads::lock_thread_in(s, &mut tx, t).await?;
            let head: Option<(i64, Option<String>)> =
                sqlx::query_as(s.sql.steps.head.q()).bind(&t.thread_id).fetch_optional(&mut *tx).await?;
            let (current, mark) = head.unzip();
            if let Err(refused) = crate::store::check_head(&w, t, current.unwrap_or(0), mark.flatten().as_deref()) {
                return Ok(Err(refused));
            }
        }
        let v = step().fetch_one(&mut *tx).await.and_then(version)?;
        if let Some(h) = w.in_tx
            && let Err(f) = h.in_transaction().await
        {
            return Ok(Err(StoreError::Failpoint(f)));
        }
        tx.commit().await?;
        Ok(Ok(v))
    })
    .await;
    let r = match sent {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(refused)) => Err(refused),
        Err(e) => Err(super::messages::name_taken_id(s, t, w.new_messages, map_err("write step", e, Some(t))).await),
    };
    if matches!(r, Err(StoreError::Stale { .. }))
        && let Some(redis) = s.redis()
    {
        redis.clear_state_cache(t).await; // a conflicting writer's cache must not be trusted
    }
    r
}

pub(super) async fn clear_state(s: &PgStore, t: &ThreadRef) -> StoreResult<()> {
    let mut tx = s.conns.begin().await.map_err(|e| map_err("clear state", e, Some(t)))?;
    if super::owned::hold_thread(s, &mut tx, t, "clear state").await? == Held::Nothing {
        return tx.rollback().await.map_err(|e| map_err("clear state", e, Some(t)));
    }
    super::threads::forget_legacy_entry(s, &mut tx, t, "clear state").await?;
    for q in [&s.sql.steps.clear_states, &s.sql.steps.clear_messages] {
        sqlx::query(q.q())
            .bind(&t.thread_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| map_err("clear state", e, Some(t)))?;
    }
    tx.commit().await.map_err(|e| map_err("clear state", e, Some(t)))
}
