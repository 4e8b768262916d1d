//! The tool ledger on PostgreSQL: lookups, fenced writes (`tenx_ledger_put`), the start of a tool
//! node (`tenx_ledger_begin`: lookup and intent records in one round trip), and the listing.

use super::{PgStore, map_err, strip_nul};
use crate::store::{LedgerEntry, StoreError, StoreResult, ThreadRef};
use serde_json::Value;
use sqlx::{AssertSqlSafe, Row};
use std::collections::HashMap;

/// Keys and values as the two arrays the functions take: the first occurrence of each key (the
/// first result wins, also within one batch), NULs replaced (PostgreSQL cannot store them).
fn columns(entries: &[(String, Value)]) -> (Vec<String>, Vec<Value>) {
    let mut seen = std::collections::HashSet::new();
    entries
        .iter()
        .filter(|(k, _)| seen.insert(k.clone()))
        .map(|(k, v)| {
            let mut v = v.clone();
            strip_nul(&mut v);
            (k.clone(), v)
        })
        .unzip()
}

fn by_key(rows: Vec<sqlx::postgres::PgRow>) -> HashMap<String, Value> {
    rows.into_iter().map(|r| (r.get::<String, _>("tool_call_id"), r.get::<Value, _>("result"))).collect()
}

impl PgStore {
    pub(super) async fn ledger_read(&self, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let rows = sqlx::query(AssertSqlSafe(self.sql.ledger_get.clone()))
            .bind(&t.thread_id)
            .bind(keys)
            .bind(self.opts.enforce_user_isolation.then_some(&t.user_id))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_err("ledger read", e, Some(t)))?;
        Ok(by_key(rows))
    }

    pub(super) async fn ledger_write(&self, t: &ThreadRef, entries: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        self.ledger_rows_put(&self.sql.ledger_put, t, entries, fence).await
    }

    pub(super) async fn ledger_remark(&self, t: &ThreadRef, marks: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        if marks.is_empty() {
            return Ok(0);
        }
        self.ledger_rows_put(&self.sql.ledger_mark, t, marks, fence).await
    }

    /// `tenx_ledger_put` or `tenx_ledger_mark`: same arguments, rows written back.
    async fn ledger_rows_put(&self, sql: &str, t: &ThreadRef, entries: &[(String, Value)], fence: Option<i64>) -> StoreResult<usize> {
        let (keys, results) = columns(entries);
        let written: i32 = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .bind(&t.thread_id)
            .bind(&t.user_id)
            .bind(self.opts.enforce_user_isolation)
            .bind(&keys)
            .bind(&results)
            .bind(fence)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_err("ledger write", e, Some(t)))?;
        Ok(written.max(0) as usize)
    }

    pub(super) async fn ledger_start(
        &self,
        t: &ThreadRef,
        intents: &[(String, Value)],
        also_read: &[String],
        fence: Option<i64>,
    ) -> StoreResult<(HashMap<String, Value>, Result<(), StoreError>)> {
        if intents.is_empty() {
            return Ok((HashMap::new(), Ok(())));
        }
        let (keys, values) = columns(intents);
        let read: Vec<String> = also_read.iter().map(|k| k.replace('\0', "\u{FFFD}")).collect();
        let rows = sqlx::query(AssertSqlSafe(self.sql.ledger_begin.clone()))
            .bind(&t.thread_id)
            .bind(&t.user_id)
            .bind(self.opts.enforce_user_isolation)
            .bind(&keys)
            .bind(&values)
            .bind(fence)
            .bind(&read)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_err("ledger write", e, Some(t)))?;
        // One transaction: the intents were written if and only if the read succeeded.
        Ok((by_key(rows), Ok(())))
    }

    pub(super) async fn ledger_rows_of(&self, t: &ThreadRef) -> StoreResult<Vec<LedgerEntry>> {
        if !self.readable(t).await? {
            return Ok(vec![]);
        }
        let rows = sqlx::query(self.q(format!(
            "SELECT tool_call_id, result, EXTRACT(EPOCH FROM created_at)::float8 AS created_at \
             FROM {}.tool_executions WHERE thread_id = $1 ORDER BY created_at, tool_call_id",
            self.sql.s
        )))
        .bind(&t.thread_id)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| map_err("ledger list", e, Some(t)))?;
        Ok(rows
            .iter()
            .map(|r| LedgerEntry {
                key: r.get("tool_call_id"),
                result: Some(r.get("result")),
                created_at: r.get("created_at"),
            })
            .collect())
    }

}
