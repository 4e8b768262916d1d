//! The configured schema on PostgreSQL: how its name reaches SQL (quoted, folded to the schema
//! an unquoted name named) and that the functions the migrations create read their own schema's
//! tables whatever `search_path` the calling connection has.

mod common;

use serde_json::json;
use tenxgraph::store::{Checkpointer, PgOptions, PgStore, StepWrite, ThreadRef, shared_json};

fn step(expected: i64, state: &serde_json::Value) -> StepWrite<'_> {
    let (state_text, mark) = common::state_text(state);
    StepWrite {
        expected_version: expected,
        state: state_text,
        mark,
        new_messages: &[],
        replace_messages: false,
        fence: None,
        release_lease: false,
        in_tx: None,
        previous_mark: None,
        expected_mark: None,
    }
}

async fn store(dsn: &str, schema: &str) -> PgStore {
    let opts = PgOptions { schema: schema.to_owned(), enforce_user_isolation: false, ..PgOptions::default() };
    PgStore::connect(dsn, None, opts).await.expect("connect to the test Postgres")
}

/// A one-minute lease request of `holder` on this machine, no owner check.
fn minute_lease(holder: &str) -> tenxgraph::store::LeaseRequest {
    tenxgraph::store::LeaseRequest {
        holder: holder.into(),
        host: "h".into(),
        pid: 1,
        pid_start: 1,
        ttl: std::time::Duration::from_secs(60),
        steal: None,
        user_id: None,
        owner_scoped: false,
    }
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

/// A database that tenxgraph created before its migrations became `.sql` files (functions that
/// name their schema and pin no path) is at version 7: only the later files are applied (0008's
/// and 0009's `tenx_put_input` and 0009's `tenx_put_step`, which replace the old functions of the
/// same signatures, 0010's trigger and 0011's `tenx_put_input` with `p_on_head`), and every kind of
/// write and read goes on working on it.
#[tokio::test]
async fn a_database_made_by_the_earlier_string_migrations_keeps_working() {
    use tenxgraph::store::{LeaseAttempt, LeasedInput, PruneRules, StoredMessage, is_intent};
    let Some(dsn) = common::pg_dsn() else { return };
    let pool = sqlx::PgPool::connect(&dsn).await.expect("connect to the test Postgres");
    sqlx::raw_sql("DROP SCHEMA IF EXISTS pre_sql_files_v7 CASCADE").execute(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql(include_str!("fixtures/postgres_v7_before_sql_files.sql")).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    // Pinned: a `search_path` setting (0012 gives the old step, input and ledger functions a
    // `lock_timeout` setting of their own, which says nothing of their body).
    let pinned = "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                  WHERE n.nspname = 'pre_sql_files_v7' AND array_to_string(p.proconfig, ',') LIKE '%search_path=%'";
    let s = store(&dsn, "pre_sql_files_v7").await;
    assert_eq!(s.schema_version().await.unwrap(), Some(i64::from(tenxgraph::store::postgres::CURRENT_VERSION)));
    // Opened and migrated, yet its functions of versions 1-7 are the old ones: only the later
    // functions (pinned) are new: the 17-argument tenx_put_input (0008, 0009, a call of 0011's
    // since 0011), the 11-argument tenx_put_step (0009), 0010's trigger function, the 18-argument
    // tenx_put_input (0011, 0013), tenx_lease_acquire (replaced by 0013: tokens from a sequence)
    // and the three ledger functions (replaced by 0014: a run's write needs its thread), and
    // 0016's trigger function (a 10xGraph write over a thread tenxgraph wrote last is refused).
    assert_eq!(sqlx::query_scalar::<_, i64>(pinned).fetch_one(&pool).await.unwrap(), 9);

    let t = ThreadRef::new("old-db", "u");
    let req = minute_lease("run-1");
    // A run's first commit through 0008 on the old functions: lease and input in one statement.
    let t2 = ThreadRef::new("old-db-2", "u");
    let first = json!({"execution_meta": {"status": "running"}});
    match s.put_input_leased(&t2, &req, step(0, &first), None).await.unwrap() {
        LeasedInput::Committed { version, .. } => assert_eq!(version, 1),
        other => panic!("not committed: {other:?}"),
    }
    assert!(!s.lease_get(&t2.thread_id).await.unwrap().unwrap().released);
    let LeaseAttempt::Acquired { token } = s.lease_acquire(&t.thread_id, &req).await.unwrap() else {
        panic!("lease held")
    };
    let m = StoredMessage::new("old-db-m1", &json!({"message_id": "old-db-m1", "role": "user", "content": []}));
    let running = json!({"execution_meta": {"status": "running"}});
    let mut w = step(0, &running);
    let msgs = [m];
    w.new_messages = &msgs;
    w.fence = Some(token);
    assert_eq!(s.put_step(&t, w).await.unwrap(), 1);
    let (found, written) =
        s.ledger_begin(&t, &[("k1".into(), json!({"__kind__": "started"}))], &[], Some(token)).await.unwrap();
    assert!(found.is_empty() && written.is_ok());
    assert_eq!(
        s.ledger_put_many(&t, &[("k1".into(), shared_json(&json!({"__kind__": "raw", "value": 1})))], Some(token))
            .await
            .unwrap(),
        1
    );
    assert_eq!(s.ledger_mark(&t, &[("k1".into(), json!({"__kind__": "started"}))], Some(token)).await.unwrap(), 0);
    let completed = json!({"execution_meta": {"status": "completed"}});
    let mut last = step(1, &completed);
    last.fence = Some(token);
    last.release_lease = true;
    assert_eq!(s.put_step(&t, last).await.unwrap(), 2);
    assert!(s.lease_get(&t.thread_id).await.unwrap().unwrap().released);
    let cp = s.load(&t).await.unwrap().unwrap();
    assert_eq!((cp.version, cp.messages.len()), (2, 1));
    assert!(!is_intent(&s.ledger_get(&t, &["k1".into()]).await.unwrap()["k1"]));
    let rules =
        |dry_run| PruneRules { keep_versions: Some(1), finished_older_than: Some(0.0), ledger_ttl: None, dry_run };
    let dry = s.prune(&rules(true)).await.unwrap();
    let real = s.prune(&rules(false)).await.unwrap();
    // Thread "old-db" (completed, two versions, one ledger row); "old-db-2" is still running.
    assert_eq!((dry.state_versions, dry.threads, dry.ledger_rows), (1, 1, 1));
    assert_eq!((real.state_versions, real.threads, real.ledger_rows), (1, 1, 1));
    assert!(s.load(&t).await.unwrap().is_none());
    sqlx::raw_sql("DROP SCHEMA pre_sql_files_v7 CASCADE").execute(&pool).await.unwrap();
}

/// A process of the previous release (schema 10) calls the 17-argument `tenx_put_input`; on a
/// schema at 11 that is a call of the 18-argument one with `p_on_head` false, so during a rolling
/// deploy the old process keeps its old answers: it commits on its own read of the head, and a
/// head that carries another write mark gets a commit without one (never a refusal).
#[tokio::test]
async fn the_previous_release_s_input_call_keeps_working_on_schema_11() {
    let Some(dsn) = common::pg_dsn() else { return };
    let schema = format!("prev_{}", uuid::Uuid::new_v4().simple());
    let s = store(&dsn, &schema).await;
    let call = format!(
        "SELECT acquired, token, version FROM {schema}.tenx_put_input($1, 'u', $2, $3::jsonb, '[]'::jsonb, false, 20, false, \
         $4, 'old-run', 'h', 1, 1, 60.0, NULL, NULL, NULL)"
    );
    let put = |expected: i64, state: serde_json::Value, prev_mark: Option<&'static str>| {
        let (call, pool) = (call.clone(), s.pool().clone());
        async move {
            sqlx::query_as::<_, (bool, i64, Option<i64>)>(sqlx::AssertSqlSafe(call))
                .bind("old")
                .bind(expected)
                .bind(state)
                .bind(prev_mark)
                .fetch_one(&pool)
                .await
        }
    };
    let marked = |m: &str| json!({"n": 1, "__state_meta__": {"write": m}});
    assert_eq!(put(0, marked("a"), None).await.unwrap(), (true, 1, Some(1)));
    sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE {schema}.tenx_leases SET released = true")))
        .execute(s.pool())
        .await
        .unwrap();
    // The head's mark is "a"; the old process says it saw "z": committed, its mark left off.
    assert_eq!(put(1, marked("b"), Some("z")).await.unwrap(), (true, 2, Some(2)));
    let head = s.load(&ThreadRef::new("old", "u")).await.unwrap().unwrap();
    assert_eq!((head.version, tenxgraph::store::write_mark(&head.state)), (2, None));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(s.pool()).await.unwrap();
}

/// Version 13 on a database whose lease rows already hold tokens (per-row counts of versions
/// 5-12): the sequence starts above the greatest of them, so a thread's next take, and the first
/// take of any thread, is above every token handed out before the upgrade.
#[tokio::test]
async fn the_lease_sequence_starts_above_the_tokens_of_an_upgraded_database() {
    use tenxgraph::store::LeaseAttempt;
    let Some(dsn) = common::pg_dsn() else { return };
    let schema = format!("upg13_{}", uuid::Uuid::new_v4().simple());
    let s = store(&dsn, &schema).await;
    // Back to version 12 as it was: no sequence, and rows whose tokens their own count made.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DELETE FROM {schema}.schema_version WHERE version >= 13; DROP SEQUENCE {schema}.tenx_lease_tokens; \
         INSERT INTO {schema}.tenx_leases (thread_id, token, holder, host, pid, pid_start, expires_at, released) \
         VALUES ('busy-before', 41, 'old', 'h', 1, 1, NOW(), TRUE), ('old-thread', 7, 'old', 'h', 1, 1, NOW(), TRUE)"
    )))
    .execute(s.pool())
    .await
    .unwrap();
    let s = store(&dsn, &schema).await; // migrates 13 (and what follows) again
    assert_eq!(s.schema_version().await.unwrap(), Some(i64::from(tenxgraph::store::postgres::CURRENT_VERSION)));
    for (thread, holder) in [("old-thread", "new-1"), ("brand-new", "new-2"), ("old-thread", "new-3")] {
        s.lease_release(thread, s.lease_get(thread).await.unwrap().map_or(0, |l| l.token)).await.unwrap();
        match s.lease_acquire(thread, &minute_lease(holder)).await.unwrap() {
            LeaseAttempt::Acquired { token } => assert!(token > 41, "{thread}: {token}"),
            other => panic!("{thread}: {other:?}"),
        }
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(s.pool()).await.unwrap();
}
