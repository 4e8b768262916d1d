//! The configured schema on PostgreSQL: how its name reaches SQL (quoted, folded to the schema
//! an unquoted name named) and that the functions the migrations create read their own schema's
//! tables whatever `search_path` the calling connection has.

mod common;

use serde_json::json;
use tenxgraph::store::{Checkpointer, PgOptions, PgStore, StepWrite, ThreadRef};

fn step(expected: i64, state: &serde_json::Value) -> StepWrite<'_> {
    StepWrite {
        expected_version: expected,
        state,
        new_messages: &[],
        replace_messages: false,
        fence: None,
        release_lease: false,
        in_tx: None,
        previous_mark: None,
    }
}

async fn store(dsn: &str, schema: &str) -> PgStore {
    let opts = PgOptions { schema: schema.to_owned(), enforce_user_isolation: false, ..PgOptions::default() };
    PgStore::connect(dsn, None, opts).await.expect("connect to the test Postgres")
}

async fn schemas_like(s: &PgStore, pattern: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname ILIKE $1 ORDER BY 1")
        .bind(pattern)
        .fetch_all(s.pool())
        .await
        .unwrap()
}

/// A reserved word spliced in unquoted was a syntax error at the first migration.
#[tokio::test]
async fn a_reserved_word_is_a_usable_schema() {
    let Some(dsn) = common::pg_dsn() else { return };
    let s = store(&dsn, "user").await;
    let t = ThreadRef::new(format!("t-{}", uuid::Uuid::new_v4().simple()), "u");
    assert_eq!(s.put_step(&t, step(0, &json!({"n": 1}))).await.unwrap(), 1);
    assert_eq!(s.load(&t).await.unwrap().unwrap().state["n"], 1);
    assert_eq!(s.schema_version().await.unwrap(), Some(i64::from(tenxgraph::store::postgres::CURRENT_VERSION)));
    s.clean_thread(&t).await.unwrap();
}

/// Earlier releases spliced the name in unquoted, so PostgreSQL folded it to lower case: the same
/// configuration must keep finding the same schema.
#[tokio::test]
async fn a_mixed_case_name_names_the_lower_case_schema() {
    let Some(dsn) = common::pg_dsn() else { return };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let s = store(&dsn, &format!("Mixed_{id}")).await;
    assert_eq!(schemas_like(&s, &format!("mixed_{id}")).await, vec![format!("mixed_{id}")]);
    let t = ThreadRef::new("t", "u");
    s.put_step(&t, step(0, &json!({"n": 1}))).await.unwrap();
    let again = store(&dsn, &format!("mixed_{id}")).await;
    assert_eq!(again.load(&t).await.unwrap().unwrap().version, 1);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA mixed_{id} CASCADE"))).execute(s.pool()).await.unwrap();
}

/// The migrations name no schema; each function pins the path it was created with. Called from a
/// connection whose path leads to another schema with the same tables, it must still write its own.
#[tokio::test]
async fn functions_read_their_own_schema_whatever_the_callers_search_path() {
    let Some(dsn) = common::pg_dsn() else { return };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (a, b) = (format!("fa_{id}"), format!("fb_{id}"));
    let sa = store(&dsn, &a).await;
    let sb = store(&dsn, &b).await;
    let mut conn = sa.pool().acquire().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET search_path TO {b}"))).execute(&mut *conn).await.unwrap();
    let v: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {a}.tenx_put_step('t', 'u', 0, '{{\"n\": 1}}'::jsonb, '[]'::jsonb, false, 20, false, NULL, false, NULL)"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(v, 1);
    sqlx::raw_sql("RESET search_path").execute(&mut *conn).await.unwrap();
    drop(conn);
    let t = ThreadRef::new("t", "u");
    assert_eq!(sa.load(&t).await.unwrap().unwrap().version, 1);
    assert!(sb.load(&t).await.unwrap().is_none());
    for schema in [a, b] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(sa.pool()).await.unwrap();
    }
}
