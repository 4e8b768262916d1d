//! What a thread's history and the database's schema are at: the kept state versions of a
//! thread (the CLI's `history`) and the schema version.

use super::{Casts, PgStore, Stmt, map_err};
use crate::store::{StateVersion, StoreResult, ThreadRef};
use serde_json::Value;
use sqlx::Row;

pub(super) struct Stmts {
    states: Stmt,
    schema: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let t = c.id;
        Stmts {
            states: Stmt::new(format!(
                "SELECT version, state_data, EXTRACT(EPOCH FROM created_at)::float8 AS created_at \
                 FROM {s}.states WHERE thread_id = $1{t} ORDER BY version DESC, state_id DESC"
            )),
            schema: Stmt::new(format!("SELECT MAX(version)::int8 FROM {s}.schema_version")),
        }
    }
}

pub(super) async fn state_versions(s: &PgStore, t: &ThreadRef) -> StoreResult<Vec<StateVersion>> {
    let rows = s
        .read_owned(t, "state versions", vec![], async |c| {
            sqlx::query(s.sql.versions.states.q()).bind(&t.thread_id).fetch_all(c).await
        })
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let mut state: Value = r.get("state_data");
            // A row 10xGraph wrote carries the whole context; a version listing wants the rest.
            if let Some(o) = state.as_object_mut() {
                o.remove("context");
            }
            StateVersion { version: r.get("version"), created_at: r.get("created_at"), state }
        })
        .collect())
}

pub(super) async fn schema_version(s: &PgStore) -> StoreResult<Option<i64>> {
    sqlx::query_scalar(s.sql.versions.schema.q())
        .fetch_one(&s.conns)
        .await
        .map_err(|e| map_err("read schema version", e, None))
}
