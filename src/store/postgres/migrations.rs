//! The schema: the `.sql` files of `migrations/postgres`, 10xGraph's versions 1-3, then ours,
//! applied in order in one transaction under an advisory lock so two processes starting at once
//! apply each version exactly once. A database that 10xGraph 0.10 created (at v1, v2 or v3) is
//! upgraded in place; its `schema_version` table is the one both projects read.
//!
//! The files name no schema: the transaction sets `search_path` to the configured schema alone,
//! so every object lands there, and each function pins that path (`SET search_path FROM
//! CURRENT`), so its body reads the same tables whoever calls it. The one edit at run time is the
//! id types (10xGraph's `id_type` / `user_id_type`): `{{ID_COLUMN}}` / `{{USER_ID_COLUMN}}` become
//! the column types 10xGraph creates, `{{ID}}` / `{{USER_ID}}` the casts of text parameters to
//! them (nothing for the string type, so a string schema gets the files' text unchanged).
//!
//! The other edit is the role type. 10xGraph creates `message_role` with an unqualified name on a
//! connection whose path is the default, so whatever its `schema=`, the type lands in `public`
//! while its tables land in the schema. A cast `::message_role` under our path (the schema alone)
//! finds no such type there, so every cast is rewritten to the type `messages.role` actually has,
//! spelled as our path resolves it (`public.message_role` for such a database, unchanged for ours).

use super::ident::quote_schema;
use super::options::IdType;
use crate::store::{StoreError, StoreResult};
use sqlx::{AssertSqlSafe, PgPool};
use std::time::Duration;

/// 10xGraph's lock key (ASCII "AGNTFLW!"), so we also serialise against its own migrator.
const LOCK_KEY: i64 = 0x4147_4E54_464C_5721;

/// Every version in order: its number, its file name (for messages), its SQL.
const MIGRATIONS: [(i32, &str, &str); 16] = [
    (
        1,
        "0001_threads_states_messages.sql",
        include_str!("../../../migrations/postgres/0001_threads_states_messages.sql"),
    ),
    (2, "0002_state_versions.sql", include_str!("../../../migrations/postgres/0002_state_versions.sql")),
    (3, "0003_tool_executions.sql", include_str!("../../../migrations/postgres/0003_tool_executions.sql")),
    (4, "0004_step_functions.sql", include_str!("../../../migrations/postgres/0004_step_functions.sql")),
    (5, "0005_leases.sql", include_str!("../../../migrations/postgres/0005_leases.sql")),
    (
        6,
        "0006_inline_step_and_ledger.sql",
        include_str!("../../../migrations/postgres/0006_inline_step_and_ledger.sql"),
    ),
    (7, "0007_ledger_marks.sql", include_str!("../../../migrations/postgres/0007_ledger_marks.sql")),
    (8, "0008_put_input.sql", include_str!("../../../migrations/postgres/0008_put_input.sql")),
    (9, "0009_lean_step_and_input.sql", include_str!("../../../migrations/postgres/0009_lean_step_and_input.sql")),
    (10, "0010_thread_names.sql", include_str!("../../../migrations/postgres/0010_thread_names.sql")),
    (11, "0011_input_on_known_head.sql", include_str!("../../../migrations/postgres/0011_input_on_known_head.sql")),
    (12, "0012_step_lock_waits.sql", include_str!("../../../migrations/postgres/0012_step_lock_waits.sql")),
    (13, "0013_lease_tokens.sql", include_str!("../../../migrations/postgres/0013_lease_tokens.sql")),
    (
        14,
        "0014_ledger_needs_its_thread.sql",
        include_str!("../../../migrations/postgres/0014_ledger_needs_its_thread.sql"),
    ),
    (15, "0015_store_id.sql", include_str!("../../../migrations/postgres/0015_store_id.sql")),
    (
        16,
        "0016_no_legacy_write_over_ours.sql",
        include_str!("../../../migrations/postgres/0016_no_legacy_write_over_ours.sql"),
    ),
];

/// A failure reading or migrating the schema. One a retry can pass (a lock not granted within
/// `lock_timeout`, a statement the server cancelled, an ended session, connection trouble) is
/// `Transient`, classified as every statement's is: as `Schema` (`STORAGE_SCHEMA_001`, "a
/// migration failed") it sent a fleet's new worker, whose `asetup()` met another session's lock
/// on `schema_version`, looking for a broken schema (red-team, session 23). A released
/// checkpointer says so, as every other call on it does. Anything else is `Schema`.
fn schema_err(e: sqlx::Error) -> StoreError {
    let text = super::errors::with_pooler_hint(&e);
    let closed = matches!(e, sqlx::Error::PoolClosed);
    match super::errors::map_err("migrate", e, None) {
        transient @ (StoreError::Transient { .. } | StoreError::LockWait { .. }) => transient,
        released if closed => released,
        _ => StoreError::Schema(text),
    }
}

/// The schema version `migrate` brings a database to (the last file of `migrations/postgres`).
pub const CURRENT_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Applies every version the database lacks, in order, in one transaction: either all of them are
/// recorded in `schema_version` or none is (`StoreError::Schema` names the version that failed).
/// Idempotent; concurrent callers (ours or 10xGraph's migrator) wait on the advisory lock.
///
/// `ids` (thread/message, user) are the types a new database gets; a database that has its
/// `threads` table keeps its own, and a different request is `StoreError::InvalidInput` before
/// anything is written. Returns the types the database has.
pub async fn migrate(
    pool: &PgPool,
    schema: &str,
    ids: (IdType, IdType),
    deadline: Duration,
) -> StoreResult<(IdType, IdType)> {
    let ident = quote_schema(schema)?;
    // The catalog holds the name as PostgreSQL folded it (quote_schema names that schema); the
    // raw `Tenant` found nothing there, which skipped the id-type check and the lock-free path.
    let folded = schema.to_ascii_lowercase();
    let schema = folded.as_str();
    let err = schema_err;
    // A database already at CURRENT_VERSION needs no lock: a running fleet's `setup()` (and every
    // new worker's first call) must not queue behind a migrator that froze holding it. Bounded
    // like any statement; the migration itself is not (it may rightly take minutes).
    let read = tokio::time::timeout(deadline, up_to_date(pool, schema, ids))
        .await
        .map_err(|_| StoreError::Transient { op: "migrate", message: super::conns::timed_out(deadline).to_string() })?;
    if let Some(found) = read? {
        return Ok(found);
    }
    let mut tx = pool.begin().await.map_err(err)?;
    // Waiting for another migrator is the point of the lock: no `lock_timeout` for it, and no
    // `statement_timeout` for the wait or the migration (it may rightly take minutes).
    sqlx::raw_sql("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(LOCK_KEY).execute(&mut *tx).await.map_err(err)?;
    // The one statement with the schema in its text (an identifier cannot be bound).
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA IF NOT EXISTS {ident}")))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    // Local to this transaction: the pooled connection goes back with its own path.
    sqlx::query("SELECT set_config('search_path', $1, true)").bind(&ident).execute(&mut *tx).await.map_err(err)?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS schema_version (version INT PRIMARY KEY, applied_at TIMESTAMPTZ DEFAULT NOW())",
    )
    .execute(&mut *tx)
    .await
    .map_err(err)?;
    let current: i32 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
    let ids = existing_id_types(&mut tx, schema).await?.map_or(Ok(ids), |found| {
        if found == ids {
            Ok(found)
        } else {
            Err(StoreError::InvalidInput(format!(
                "the database's ids are id_type={:?}, user_id_type={:?}; the checkpointer was given id_type={:?}, \
                 user_id_type={:?} (a schema keeps the id types it was created with)",
                found.0.name(),
                found.1.name(),
                ids.0.name(),
                ids.1.name()
            )))
        }
    })?;
    let role = existing_role_type(&mut tx, schema).await?;
    // A database of that kind that an earlier tenxgraph upgraded has functions whose casts find
    // no type: every run on it failed. Applying again, in order, each version from the first
    // that casts to the role type rewrites them (the files are idempotent; the later versions
    // come again so that none of their functions is left replaced by an older one).
    let repair_from = match role.as_deref() {
        Some(r) if r != "message_role" && has_unresolvable_role_casts(&mut tx, schema).await? => {
            MIGRATIONS.iter().find(|(_, _, sql)| sql.contains("::message_role")).map_or(i32::MAX, |m| m.0)
        }
        _ => i32::MAX,
    };
    for (version, file, sql) in MIGRATIONS {
        if version <= current && version < repair_from {
            continue;
        }
        sqlx::raw_sql(AssertSqlSafe(with_role_type(&with_id_types(sql, ids), role.as_deref())))
            .execute(&mut *tx)
            .await
            .map_err(|e| match schema_err(e) {
                StoreError::Schema(text) => {
                    StoreError::Schema(format!("migration to version {version} ({file}) failed: {text}"))
                }
                transient => transient,
            })?;
        sqlx::query("INSERT INTO schema_version (version) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(version)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
    }
    tx.commit().await.map_err(err)?;
    Ok(ids)
}

/// The database's id types when its schema is at `CURRENT_VERSION` with the functions our
/// statements call (read without the lock); None when `migrate` must run.
async fn up_to_date(pool: &PgPool, schema: &str, ids: (IdType, IdType)) -> StoreResult<Option<(IdType, IdType)>> {
    let mut conn = pool.acquire().await.map_err(schema_err)?;
    let table = format!("{}.schema_version", quote_schema(schema)?);
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&table)
        .fetch_one(&mut *conn)
        .await
        .map_err(schema_err)?;
    if !exists {
        return Ok(None);
    }
    let current: i32 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COALESCE(MAX(version), 0) FROM {table}")))
        .fetch_one(&mut *conn)
        .await
        .map_err(schema_err)?;
    if current < CURRENT_VERSION {
        return Ok(None);
    }
    // Other id types are refused under the lock, as before.
    let Some(found) = existing_id_types(&mut conn, schema).await?.filter(|found| *found == ids) else {
        return Ok(None);
    };
    // A role type outside the schema (10xGraph's `public.message_role` beside a custom schema)
    // with functions that cast to it unqualified is repaired under the lock (see `migrate`).
    let role_schema: Option<String> = sqlx::query_scalar(
        "SELECT tn.nspname::text FROM pg_attribute a \
         JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace tn ON tn.oid = t.typnamespace \
         WHERE n.nspname = $1 AND c.relname = 'messages' AND c.relkind IN ('r', 'p') \
         AND a.attname = 'role' AND NOT a.attisdropped",
    )
    .bind(schema)
    .fetch_optional(&mut *conn)
    .await
    .map_err(schema_err)?;
    match role_schema {
        Some(own) if own == schema => {}
        Some(_) if !has_unresolvable_role_casts(&mut conn, schema).await? => {}
        _ => return Ok(None),
    }
    Ok(Some(found))
}

/// A migration's text for these id types (see the module comment).
fn with_id_types(sql: &str, (id, user): (IdType, IdType)) -> String {
    sql.replace("{{ID_COLUMN}}", id.column())
        .replace("{{USER_ID_COLUMN}}", user.column())
        .replace("{{ID}}", id.cast())
        .replace("{{USER_ID}}", user.cast())
}

/// `sql` with each cast to the role type naming `role`, the type of an existing `messages.role`
/// (None before version 1: then version 1 creates `message_role` in the schema and the casts
/// find it there).
fn with_role_type(sql: &str, role: Option<&str>) -> String {
    match role {
        Some(role) if role != "message_role" => sql.replace("::message_role", &format!("::{role}")),
        _ => sql.to_owned(),
    }
}

/// The type of `messages.role` in `schema`, as `format_type` spells it under this transaction's
/// path: unqualified when the schema holds it, qualified (and quoted where needed) when it lives
/// elsewhere, as with a database 10xGraph created in a schema other than `public`.
async fn existing_role_type(tx: &mut sqlx::PgConnection, schema: &str) -> StoreResult<Option<String>> {
    sqlx::query_scalar(
        "SELECT format_type(a.atttypid, NULL) FROM pg_attribute a \
         JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = 'messages' AND c.relkind IN ('r', 'p') \
         AND a.attname = 'role' AND NOT a.attisdropped",
    )
    .bind(schema)
    .fetch_optional(&mut *tx)
    .await
    .map_err(schema_err)
}

/// Whether a function of `schema` casts to `message_role` unqualified (see `migrate`).
async fn has_unresolvable_role_casts(tx: &mut sqlx::PgConnection, schema: &str) -> StoreResult<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = $1 AND p.prosrc LIKE '%::message_role%')",
    )
    .bind(schema)
    .fetch_one(&mut *tx)
    .await
    .map_err(schema_err)
}

/// The id types of an existing `threads` table (thread id, user id), None before version 1.
async fn existing_id_types(tx: &mut sqlx::PgConnection, schema: &str) -> StoreResult<Option<(IdType, IdType)>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = 'threads' AND column_name IN ('thread_id', 'user_id')",
    )
    .bind(schema)
    .fetch_all(&mut *tx)
    .await
    .map_err(schema_err)?;
    let of = |col: &str| -> StoreResult<Option<IdType>> {
        match rows.iter().find(|(c, _)| c == col) {
            None => Ok(None),
            Some((_, t)) => IdType::from_data_type(t).map(Some).ok_or_else(|| {
                StoreError::Schema(format!("threads.{col} has type {t}, which is not an id type 10xGraph creates"))
            }),
        }
    };
    Ok(match (of("thread_id")?, of("user_id")?) {
        (Some(t), Some(u)) => Some((t, u)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::{CURRENT_VERSION, MIGRATIONS};

    /// A file added to migrations/postgres and not listed here would never run; a number out of
    /// order would run in the wrong place.
    #[test]
    fn every_migration_file_is_listed_in_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
        let mut files: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        files.sort();
        let listed: Vec<&str> = MIGRATIONS.iter().map(|(_, f, _)| *f).collect();
        assert_eq!(files, listed);
        for (i, (version, file, _)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*version as usize, i + 1);
            assert!(file.starts_with(&format!("{version:04}_")), "{file} is not version {version}");
        }
        assert_eq!(CURRENT_VERSION, 16);
    }

    /// The files name no schema, so they work in any; and a function that did not pin its
    /// `search_path` would resolve its tables through whatever path its caller has.
    #[test]
    fn migrations_name_no_schema_and_functions_pin_their_path() {
        for (_, file, sql) in MIGRATIONS {
            assert!(!sql.contains("public."), "{file} names the public schema");
            let functions = sql.matches("CREATE OR REPLACE FUNCTION").count();
            assert_eq!(sql.matches("SET search_path FROM CURRENT").count(), functions, "{file}");
        }
    }

    /// Every placeholder is replaced for every id type; the string type gets 10xGraph's string
    /// schema (VARCHAR ids, no casts) and the integer types its SERIAL / BIGSERIAL columns.
    #[test]
    fn id_type_placeholders_are_all_replaced() {
        use super::{IdType, with_id_types};
        for t in [IdType::String, IdType::Int, IdType::BigInt] {
            for u in [IdType::String, IdType::Int, IdType::BigInt] {
                for (_, file, sql) in MIGRATIONS {
                    let out = with_id_types(sql, (t, u));
                    assert!(!out.contains("{{"), "{file} keeps a placeholder for {t:?}/{u:?}");
                }
            }
        }
        let v1 = with_id_types(MIGRATIONS[0].2, (IdType::String, IdType::String));
        assert!(v1.contains("thread_id VARCHAR(255) PRIMARY KEY") && v1.contains("user_id VARCHAR(255) NOT NULL"));
        let step = with_id_types(MIGRATIONS[5].2, (IdType::String, IdType::String));
        assert!(!step.contains("::BIGINT,") && step.contains("WHERE thread_id = p_thread;"));
        let v1 = with_id_types(MIGRATIONS[0].2, (IdType::BigInt, IdType::Int));
        assert!(v1.contains("thread_id BIGSERIAL PRIMARY KEY") && v1.contains("message_id BIGSERIAL PRIMARY KEY"));
        assert!(v1.contains("user_id SERIAL NOT NULL"));
        let step = with_id_types(MIGRATIONS[5].2, (IdType::BigInt, IdType::Int));
        assert!(step.contains("VALUES (p_thread::BIGINT, p_user::INTEGER)"));
    }

    /// The role casts follow the column's type; a schema holding its own type keeps the files'
    /// text. Every migration that casts to the role type does it as `::message_role`, the one
    /// spelling the rewrite knows (a `CAST(... AS message_role)` would escape it).
    #[test]
    fn role_casts_name_the_type_the_column_has() {
        use super::with_role_type;
        for (_, file, sql) in MIGRATIONS {
            assert!(!sql.to_ascii_lowercase().contains("as message_role"), "{file} casts to the role type with CAST");
            assert_eq!(with_role_type(sql, None), sql, "{file}");
            assert_eq!(with_role_type(sql, Some("message_role")), sql, "{file}");
            let out = with_role_type(sql, Some("public.message_role"));
            assert!(!out.replace("::public.message_role", "").contains("::message_role"), "{file}");
        }
        let step = with_role_type(MIGRATIONS[5].2, Some("public.message_role"));
        assert!(step.contains("(e.value->>'role')::public.message_role"));
    }
}
