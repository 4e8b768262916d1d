//! Messages outside a step: upsert, read one, list (with search and paging), delete. Changing a
//! thread's messages here takes the write mark off its latest state row (see `unmark_latest`).

use super::nul::nul_free_json;
use super::owned::Held;
use super::{Casts, PgStore, Stmt, map_err, threads};
use crate::store::{
    ChangeMark, RawJson, StoreError, StoreResult, StoredMessage, ThreadRef, raw_json, raw_json_from_text,
};
use serde_json::Value;
use serde_json::value::RawValue;
use sqlx::types::Json;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A message row as the JSON the engine stores: `message_data` when we wrote the row, rebuilt from
/// the columns for a row 10xGraph wrote.
pub(super) fn message_json() -> &'static str {
    "COALESCE(message_data, jsonb_build_object('message_id', message_id, 'role', role::text, \
     'content', COALESCE(content, '[]')::jsonb, 'tools_calls', tool_calls, 'reasoning', reasoning, \
     'usages', NULLIF(usages, '{}'::jsonb), 'metadata', COALESCE(meta, '{}'::jsonb)))"
}

/// The messages as the JSON array `tenx_upsert_messages` and `tenx_put_step` take: each row keyed
/// by the id the engine tracks, NULs replaced. A message whose text already says so (its
/// `message_id` is that id, no NUL anywhere: every message a run writes) goes in as its text.
/// The others are fixed in their text, never through a `Value`: a decode rounded integers past
/// 64 bits (and stopped at 128 levels), so a NUL in a message silently changed its numbers.
///
/// One row per id: the last text of an id, at the place of its first. One `INSERT ... ON
/// CONFLICT DO UPDATE` may not touch a row twice (PostgreSQL refused a batch holding one id
/// twice, or `7` and `"7"`, with "ON CONFLICT DO UPDATE command cannot affect row a second
/// time"); SQLite and memory upsert in order, so the last text wins there too.
pub(super) fn message_rows(msgs: &[StoredMessage]) -> Json<Vec<Cow<'_, RawValue>>> {
    let mut rows: Vec<&StoredMessage> = Vec::with_capacity(msgs.len());
    if msgs.len() > 1 {
        let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::with_capacity(msgs.len());
        for m in msgs {
            match at.get(m.id.as_str()) {
                Some(&i) => rows[i] = m,
                None => {
                    at.insert(m.id.as_str(), rows.len());
                    rows.push(m);
                }
            }
        }
    } else {
        rows.extend(msgs);
    }
    Json(rows.into_iter().map(row_text).collect())
}

fn row_text(m: &StoredMessage) -> Cow<'_, RawValue> {
    let keyed = if keyed_as_written(m) { Cow::Borrowed(&*m.data) } else { Cow::Owned(with_key(m)) };
    if let Cow::Owned(fixed) = nul_free_json(&keyed) {
        return Cow::Owned(fixed);
    }
    keyed
}

/// The text's `message_id` is the row's key: the same string, or the integer written with the
/// key's digits (an int id stays an int, however large; a bigint id column refuses what it
/// cannot hold).
fn keyed_as_written(m: &StoredMessage) -> bool {
    #[derive(serde::Deserialize)]
    struct Head {
        message_id: Option<RawJson>,
    }
    let Ok(Head { message_id: Some(id) }) = serde_json::from_str::<Head>(m.data.get()) else { return false };
    let id = id.get();
    if id.starts_with('"') {
        serde_json::from_str::<String>(id).is_ok_and(|s| s == m.id)
    } else {
        id == m.id && is_int_text(id)
    }
}

fn is_int_text(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The message with `message_id` set to the key as a string, every other member's text as
/// written (member order may change; jsonb does not keep it). A repeated key keeps its last
/// value, as jsonb does. Not an object: left as it is, for the database to refuse.
fn with_key(m: &StoredMessage) -> RawJson {
    let Ok(mut members) = serde_json::from_str::<BTreeMap<String, RawJson>>(m.data.get()) else {
        return m.data.clone();
    };
    members.insert("message_id".into(), raw_json(&Value::String(m.id.clone())));
    serde_json::value::to_raw_value(&members).expect("a map of JSON texts always serialises")
}

pub(super) struct Stmts {
    upsert: Stmt,
    unmark: Stmt,
    get: Stmt,
    list: Stmt,
    delete: Stmt,
    /// Drops the message from the context of a latest row 10xGraph wrote (`legacy_log`): there
    /// the context is the thread's messages too, and the next load put it back.
    delete_from_legacy: Stmt,
    taken: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let t = c.id;
        let m = message_json();
        let [meta, mark] = crate::store::WRITE_MARK_PATH;
        Stmts {
            upsert: Stmt::new(format!("SELECT {s}.tenx_upsert_messages($1, $2)")),
            // The caller's own mark ($3) while the row still carries the one it read ($2;
            // `ChangeMark`), else a new one ($4).
            unmark: Stmt::new(format!(
                "UPDATE {s}.states SET state_data = jsonb_set(state_data, '{{{meta}}}', \
                   COALESCE(state_data->'{meta}', '{{}}'::jsonb) || jsonb_build_object('{mark}', \
                     CASE WHEN COALESCE(state_data->'{meta}'->>'{mark}', '') = $2::text THEN $3::text ELSE $4::text END)) \
                 WHERE thread_id = $1{t} AND version = (SELECT MAX(version) FROM {s}.states WHERE thread_id = $1{t})"
            )),
            get: Stmt::new(format!(
                "SELECT ({m})::text AS m FROM {s}.messages WHERE thread_id = $1{t} AND message_id = $2{t} ORDER BY seq, created_at"
            )),
            list: Stmt::new(format!(
                "SELECT ({m})::text AS m FROM {s}.messages \
                 WHERE thread_id = $1{t} AND ($2::text IS NULL OR strpos(lower(COALESCE(message_data->>'content', content)), lower($2)) > 0) \
                 ORDER BY seq, created_at OFFSET $3 LIMIT $4"
            )),
            delete: Stmt::new(format!("DELETE FROM {s}.messages WHERE thread_id = $1{t} AND message_id = $2{t}")),
            delete_from_legacy: Stmt::new(format!(
                "UPDATE {s}.states SET state_data = jsonb_set(state_data, '{{context}}', \
                   (SELECT COALESCE(jsonb_agg(e.v ORDER BY e.o), '[]'::jsonb) \
                    FROM jsonb_array_elements(state_data->'context') WITH ORDINALITY e(v, o) \
                    WHERE e.v->>'message_id' IS DISTINCT FROM $2::text)) \
                 WHERE thread_id = $1{t} AND jsonb_typeof(state_data->'context') = 'array' \
                   AND version = (SELECT MAX(version) FROM {s}.states WHERE thread_id = $1{t}) \
                   AND EXISTS (SELECT 1 FROM jsonb_array_elements(state_data->'context') e WHERE e->>'message_id' = $2::text)"
            )),
            // The ids as text, cast as a whole to the column's type (so the key's index answers).
            taken: Stmt::new(format!(
                "SELECT message_id::text FROM {s}.messages WHERE message_id = ANY($1::text[]{arr}) AND thread_id <> $2{t} LIMIT 1",
                arr = if t.is_empty() { String::new() } else { format!("{t}[]") }
            )),
        }
    }
}

/// `err` naming the message id another thread holds: PostgreSQL's refusal (TX003) does not say
/// which of the write's messages it was, so it is looked up (only on that failure).
pub(super) async fn name_taken_id(s: &PgStore, t: &ThreadRef, msgs: &[StoredMessage], err: StoreError) -> StoreError {
    let StoreError::MessageInOtherThread { message_id } = &err else { return err };
    if !message_id.is_empty() || msgs.is_empty() {
        return err;
    }
    let ids: Vec<&str> = msgs.iter().map(|m| m.id.as_str()).collect();
    match sqlx::query_scalar::<_, String>(s.sql.messages.taken.q())
        .bind(&ids)
        .bind(&t.thread_id)
        .fetch_optional(&s.conns)
        .await
    {
        Ok(Some(id)) => StoreError::MessageInOtherThread { message_id: id },
        _ => err,
    }
}

/// Messages changed outside a step: the latest state row no longer describes them (see
/// `clear_write_mark`).
async fn unmark_latest(
    s: &PgStore,
    tx: &mut sqlx::PgConnection,
    t: &ThreadRef,
    after: Option<&ChangeMark>,
) -> StoreResult<()> {
    sqlx::query(s.sql.messages.unmark.q())
        .bind(&t.thread_id)
        .bind(after.map(|a| a.seen.as_str()))
        .bind(after.map(|a| a.mark.as_str()))
        .bind(crate::store::messages_changed_mark())
        .execute(&mut *tx)
        .await
        .map_err(|e| map_err("write messages", e, Some(t)))?;
    Ok(())
}

pub(super) async fn put_messages(
    s: &PgStore,
    t: &ThreadRef,
    msgs: &[StoredMessage],
    after: Option<&ChangeMark>,
) -> StoreResult<()> {
    // Outside a step (no new state version): the same upsert, under the thread lock.
    let mut tx = s.conns.begin().await.map_err(|e| map_err("write messages", e, Some(t)))?;
    threads::lock_thread(s, &mut tx, t, "write messages").await?;
    sqlx::query(s.sql.messages.upsert.q())
        .bind(&t.thread_id)
        .bind(message_rows(msgs))
        .execute(&mut *tx)
        .await
        .map_err(|e| map_err("write messages", e, Some(t)))?;
    if !msgs.is_empty() {
        unmark_latest(s, &mut tx, t, after).await?;
    }
    tx.commit().await.map_err(|e| map_err("write messages", e, Some(t)))
}

/// The message's stored text, not decoded (see `stored_text`).
pub(super) async fn get_message(s: &PgStore, t: &ThreadRef, message_id: &str) -> StoreResult<Option<RawJson>> {
    let text: Option<String> = s
        .read_owned(t, "read message", None, async |c| {
            sqlx::query_scalar(s.sql.messages.get.q()).bind(&t.thread_id).bind(message_id).fetch_optional(c).await
        })
        .await?;
    text.map(|x| stored_text("read message", x)).transpose()
}

/// jsonb's text handed on as it is: a decode into a `Value` made integers past 64 bits floats
/// (an id of 2**64 then broke the thread's listing) and refused nesting past 128 levels.
fn stored_text(op: &'static str, text: String) -> StoreResult<RawJson> {
    raw_json_from_text(text).map_err(|e| StoreError::backend(op, e))
}

pub(super) async fn list_messages(
    s: &PgStore,
    t: &ThreadRef,
    search: Option<&str>,
    offset: Option<i64>,
    limit: Option<i64>,
) -> StoreResult<Vec<RawJson>> {
    let texts: Vec<String> = s
        .read_owned(t, "list messages", vec![], async |c| {
            sqlx::query_scalar(s.sql.messages.list.q())
                .bind(&t.thread_id)
                .bind(search)
                .bind(offset.unwrap_or(0).max(0))
                .bind(limit)
                .fetch_all(c)
                .await
        })
        .await?;
    texts.into_iter().map(|x| stored_text("list messages", x)).collect()
}

pub(super) async fn delete_message(
    s: &PgStore,
    t: &ThreadRef,
    message_id: &str,
    after: Option<&ChangeMark>,
) -> StoreResult<bool> {
    let mut tx = s.conns.begin().await.map_err(|e| map_err("delete message", e, Some(t)))?;
    if super::owned::hold_thread(s, &mut tx, t, "delete message").await? == Held::Nothing {
        tx.rollback().await.map_err(|e| map_err("delete message", e, Some(t)))?;
        return Ok(false);
    }
    let mut deleted = false;
    for q in [&s.sql.messages.delete, &s.sql.messages.delete_from_legacy] {
        let r = sqlx::query(q.q())
            .bind(&t.thread_id)
            .bind(message_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| map_err("delete message", e, Some(t)))?;
        deleted |= r.rows_affected() > 0;
    }
    if deleted {
        unmark_latest(s, &mut tx, t, after).await?;
    }
    tx.commit().await.map_err(|e| map_err("delete message", e, Some(t)))?;
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows(msgs: &[StoredMessage]) -> (Vec<bool>, Value) {
        let Json(r) = message_rows(msgs);
        let borrowed = r.iter().map(|c| matches!(c, Cow::Borrowed(_))).collect();
        (borrowed, serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap())
    }

    #[test]
    fn a_row_keyed_as_written_goes_in_as_its_text() {
        let text = r#"{"message_id":"m:1","role":"user","content":[{"type":"text","text":"h\u00e9 \"q\""}],"n":12345678901234567890123}"#;
        let m = StoredMessage::from_text("m:1", text.to_owned()).unwrap();
        let Json(r) = message_rows(std::slice::from_ref(&m));
        assert!(matches!(r[0], Cow::Borrowed(_)));
        // The text itself: a number past 64 bits is not rounded by a decode.
        assert_eq!(serde_json::to_string(&r).unwrap(), format!("[{text}]"));
        let int = StoredMessage::new("7", &json!({"message_id": 7, "role": "user"}));
        assert_eq!(rows(&[int]), (vec![true], json!([{"message_id": 7, "role": "user"}])));
    }

    #[test]
    fn an_id_given_twice_is_one_row_with_the_last_text_at_the_first_place() {
        let msgs = [
            StoredMessage::new("7", &json!({"message_id": 7, "t": "int"})),
            StoredMessage::new("x", &json!({"message_id": "x"})),
            StoredMessage::new("7", &json!({"message_id": "7", "t": "str"})),
        ];
        let (_, got) = rows(&msgs);
        assert_eq!(got, json!([{"message_id": "7", "t": "str"}, {"message_id": "x"}]));
    }

    #[test]
    fn other_rows_are_decoded_and_fixed() {
        let cases = [
            // another id, a missing one, an int id that is not the key, a repeated key
            (StoredMessage::new("k", &json!({"message_id": "other", "a": 1})), json!({"message_id": "k", "a": 1})),
            (StoredMessage::new("k", &json!({"a": 1})), json!({"a": 1, "message_id": "k"})),
            (StoredMessage::new("8", &json!({"message_id": 7})), json!({"message_id": "8"})),
            (
                StoredMessage::from_text("k", r#"{"message_id":"k","message_id":"j"}"#.into()).unwrap(),
                json!({"message_id": "k"}),
            ),
            // an escaped NUL anywhere is replaced
            (
                StoredMessage::new("k", &json!({"message_id": "k", "t": "a\u{0}b"})),
                json!({"message_id": "k", "t": "a\u{FFFD}b"}),
            ),
        ];
        for (m, want) in cases {
            let (borrowed, got) = rows(std::slice::from_ref(&m));
            assert_eq!((borrowed, got), (vec![false], json!([want])), "{}", m.data.get());
        }
    }
}
