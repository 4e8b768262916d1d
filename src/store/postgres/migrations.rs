//! The schema: the `.sql` files of `migrations/postgres`, 10xGraph's versions 1-3, then ours,
//! applied in order in one transaction under an advisory lock so two processes starting at once
//! apply each version exactly once. A database that 10xGraph 0.10 created (at v1, v2 or v3) is
//! upgraded in place; its `schema_version` table is the one both projects read.
//!
//! The files name no schema: the transaction sets `search_path` to the configured schema alone,
//! so every object lands there, and each function pins that path (`SET search_path FROM
//! CURRENT`), so its body reads the same tables whoever calls it. Nothing in a file is edited at
//! run time.

use super::ident::quote_schema;
use crate::store::{StoreError, StoreResult};
use sqlx::{AssertSqlSafe, PgPool};

/// 10xGraph's lock key (ASCII "AGNTFLW!"), so we also serialise against its own migrator.
const LOCK_KEY: i64 = 0x4147_4E54_464C_5721;

/// Every version in order: its number, its file name (for messages), its SQL.
const MIGRATIONS: [(i32, &str, &str); 8] = [
    (1, "0001_threads_states_messages.sql", include_str!("../../../migrations/postgres/0001_threads_states_messages.sql")),
    (2, "0002_state_versions.sql", include_str!("../../../migrations/postgres/0002_state_versions.sql")),
    (3, "0003_tool_executions.sql", include_str!("../../../migrations/postgres/0003_tool_executions.sql")),
    (4, "0004_step_functions.sql", include_str!("../../../migrations/postgres/0004_step_functions.sql")),
    (5, "0005_leases.sql", include_str!("../../../migrations/postgres/0005_leases.sql")),
    (6, "0006_inline_step_and_ledger.sql", include_str!("../../../migrations/postgres/0006_inline_step_and_ledger.sql")),
    (7, "0007_ledger_marks.sql", include_str!("../../../migrations/postgres/0007_ledger_marks.sql")),
    (8, "0008_put_input.sql", include_str!("../../../migrations/postgres/0008_put_input.sql")),
];

/// The schema version `migrate` brings a database to (the last file of `migrations/postgres`).
pub const CURRENT_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Applies every version the database lacks, in order, in one transaction: either all of them are
/// recorded in `schema_version` or none is (`StoreError::Schema` names the version that failed).
/// Idempotent; concurrent callers (ours or 10xGraph's migrator) wait on the advisory lock.
pub async fn migrate(pool: &PgPool, schema: &str) -> StoreResult<()> {
    let ident = quote_schema(schema)?;
    let err = |e: sqlx::Error| StoreError::Schema(e.to_string());
    let mut tx = pool.begin().await.map_err(err)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(LOCK_KEY).execute(&mut *tx).await.map_err(err)?;
    // The one statement with the schema in its text (an identifier cannot be bound).
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA IF NOT EXISTS {ident}"))).execute(&mut *tx).await.map_err(err)?;
    // Local to this transaction: the pooled connection goes back with its own path.
    sqlx::query("SELECT set_config('search_path', $1, true)").bind(&ident).execute(&mut *tx).await.map_err(err)?;
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS schema_version (version INT PRIMARY KEY, applied_at TIMESTAMPTZ DEFAULT NOW())")
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    let current: i32 =
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetch_one(&mut *tx).await.map_err(err)?;
    for (version, file, sql) in MIGRATIONS {
        if version <= current {
            continue;
        }
        sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(|e| {
            StoreError::Schema(format!("migration to version {version} ({file}) failed: {e}"))
        })?;
        sqlx::query("INSERT INTO schema_version (version) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(version)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
    }
    tx.commit().await.map_err(err)
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
        assert_eq!(CURRENT_VERSION, 8);
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
}
