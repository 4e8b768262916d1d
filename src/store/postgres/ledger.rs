//! The tool ledger on PostgreSQL: lookups, fenced writes (`tenx_ledger_put`), intent marks
//! (`tenx_ledger_mark`), the start of a tool node (`tenx_ledger_begin`: lookup and intent records
//! in one round trip), and the listing.

use super::nul::nul_free_json;
use super::{Casts, PgStore, Stmt, map_err};
use crate::store::{LedgerEntry, LedgerRow, StoreError, StoreResult, ThreadRef, shared_json};
use serde_json::Value;
use serde_json::value::RawValue;
use sqlx::Row;
use sqlx::types::Json;
use std::borrow::Cow;
use std::collections::HashMap;

pub(super) struct Stmts {
    get: Stmt,
    put: Stmt,
    mark: Stmt,
    begin: Stmt,
    list: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let (t, u) = (c.id, c.user);
        Stmts {
            // $3: the caller's user when isolation is on (NULL otherwise); a non-owner reads nothing.
            get: Stmt::new(format!(
                "SELECT tool_call_id, result FROM {s}.tool_executions WHERE thread_id = $1{t} AND tool_call_id = ANY($2) \
                 AND ($3::text IS NULL OR NOT EXISTS (SELECT 1 FROM {s}.threads th WHERE th.thread_id = $1{t} AND th.user_id <> $3{u}))"
            )),
            put: Stmt::new(format!("SELECT {s}.tenx_ledger_put($1, $2, $3, $4::text[], $5::jsonb[], $6)")),
            mark: Stmt::new(format!("SELECT {s}.tenx_ledger_mark($1, $2, $3, $4::text[], $5::jsonb[], $6)")),
            begin: Stmt::new(format!(
                "SELECT * FROM {s}.tenx_ledger_begin($1, $2, $3, $4::text[], $5::jsonb[], $6, $7::text[])"
            )),
            list: Stmt::new(format!(
                "SELECT tool_call_id, result, EXTRACT(EPOCH FROM created_at)::float8 AS created_at \
                 FROM {s}.tool_executions WHERE thread_id = $1{t} ORDER BY created_at, tool_call_id"
            )),
        }
    }
}

/// Keys and values as the two arrays the functions take: the first occurrence of each key (the
/// first result wins, also within one batch), NULs replaced (PostgreSQL cannot store them). Each
/// value goes in as the text it came as (jsonb parses it once, on the server).
pub(super) fn columns(entries: &[LedgerRow]) -> (Vec<String>, Vec<Json<Cow<'_, RawValue>>>) {
    let mut seen = std::collections::HashSet::new();
    entries.iter().filter(|(k, _)| seen.insert(k.as_str())).map(|(k, v)| (k.clone(), Json(nul_free_json(v)))).unzip()
}

/// Intent records (made as values, on a rare path) as ledger rows.
fn as_rows(entries: &[(String, Value)]) -> Vec<LedgerRow> {
    entries.iter().map(|(k, v)| (k.clone(), shared_json(v))).collect()
}

fn by_key(rows: Vec<sqlx::postgres::PgRow>) -> HashMap<String, Value> {
    rows.into_iter().map(|r| (r.get::<String, _>("tool_call_id"), r.get::<Value, _>("result"))).collect()
}

pub(super) async fn ledger_get(s: &PgStore, t: &ThreadRef, keys: &[String]) -> StoreResult<HashMap<String, Value>> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = sqlx::query(s.sql.ledger.get.q())
        .bind(&t.thread_id)
        .bind(keys)
        .bind(t.isolated(s.opts.enforce_user_isolation).then_some(&t.user_id))
        .fetch_all(&s.conns)
        .await
        .map_err(|e| map_err("ledger read", e, Some(t)))?;
    Ok(by_key(rows))
}

pub(super) async fn ledger_put_many(
    s: &PgStore,
    t: &ThreadRef,
    entries: &[LedgerRow],
    fence: Option<i64>,
) -> StoreResult<usize> {
    write_rows(s, &s.sql.ledger.put, t, entries, fence).await
}

pub(super) async fn ledger_mark(
    s: &PgStore,
    t: &ThreadRef,
    marks: &[(String, Value)],
    fence: Option<i64>,
) -> StoreResult<usize> {
    if marks.is_empty() {
        return Ok(0);
    }
    write_rows(s, &s.sql.ledger.mark, t, &as_rows(marks), fence).await
}

/// `tenx_ledger_put` or `tenx_ledger_mark`: same arguments, rows written back.
async fn write_rows(
    s: &PgStore,
    stmt: &Stmt,
    t: &ThreadRef,
    entries: &[LedgerRow],
    fence: Option<i64>,
) -> StoreResult<usize> {
    let (keys, results) = columns(entries);
    let written: i32 = sqlx::query_scalar(stmt.q())
        .bind(&t.thread_id)
        .bind(&t.user_id)
        .bind(t.isolated(s.opts.enforce_user_isolation))
        .bind(&keys)
        .bind(&results)
        .bind(fence)
        .fetch_one(&s.conns)
        .await
        .map_err(|e| map_err("ledger write", e, Some(t)))?;
    Ok(written.max(0) as usize)
}

pub(super) async fn ledger_begin(
    s: &PgStore,
    t: &ThreadRef,
    intents: &[(String, Value)],
    also_read: &[String],
    fence: Option<i64>,
) -> StoreResult<(HashMap<String, Value>, Result<(), StoreError>)> {
    if intents.is_empty() {
        return Ok((HashMap::new(), Ok(())));
    }
    let intents = as_rows(intents);
    let (keys, values) = columns(&intents);
    let read: Vec<String> = also_read.iter().map(|k| k.replace('\0', "\u{FFFD}")).collect();
    let rows = sqlx::query(s.sql.ledger.begin.q())
        .bind(&t.thread_id)
        .bind(&t.user_id)
        .bind(t.isolated(s.opts.enforce_user_isolation))
        .bind(&keys)
        .bind(&values)
        .bind(fence)
        .bind(&read)
        .fetch_all(&s.conns)
        .await
        .map_err(|e| map_err("ledger write", e, Some(t)))?;
    // One transaction: the intents were written if and only if the read succeeded.
    Ok((by_key(rows), Ok(())))
}

pub(super) async fn ledger_list(s: &PgStore, t: &ThreadRef) -> StoreResult<Vec<LedgerEntry>> {
    let rows = s
        .read_owned(t, "ledger list", vec![], async |c| {
            sqlx::query(s.sql.ledger.list.q()).bind(&t.thread_id).fetch_all(c).await
        })
        .await?;
    Ok(rows
        .iter()
        .map(|r| LedgerEntry {
            key: r.get("tool_call_id"),
            result: Some(r.get("result")),
            created_at: r.get("created_at"),
        })
        .collect())
}
