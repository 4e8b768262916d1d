//! The schema: the `.sql` files of `migrations/sqlite`, applied by sqlx's migrator, and the
//! version they reached.

use super::*;
use futures::future::BoxFuture;
use sqlx::SqlSafeStr;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use std::borrow::Cow;

/// The files, embedded at build time, with the version and description sqlx's file naming gives
/// them (`0001_init.sql`: 1, "init"). They were read by `sqlx::migrate!`, whose proc-macro crate
/// made every cold build compile sqlx's drivers and the bundled SQLite a second time, for the
/// host (about two minutes of CI's 2-core build). The checksum is the same SHA-384 of the
/// file's text (`Migration::new`), so a database migrated by an earlier build is recognised.
const FILES: [(i64, &str, &str); 3] = [
    (1, "init", include_str!("../../../migrations/sqlite/0001_init.sql")),
    (2, "leases", include_str!("../../../migrations/sqlite/0002_leases.sql")),
    (3, "lease tokens", include_str!("../../../migrations/sqlite/0003_lease_tokens.sql")),
];

#[derive(Debug)]
struct Embedded;

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> BoxFuture<'static, Result<Vec<Migration>, BoxDynError>> {
        let migrations = FILES
            .iter()
            .map(|&(version, description, sql)| {
                let no_tx = sql.starts_with("-- no-transaction");
                Migration::new(version, Cow::Borrowed(description), MigrationType::Simple, sql.into_sql_str(), no_tx)
            })
            .collect();
        Box::pin(async move { Ok(migrations) })
    }
}

static MIGRATOR: tokio::sync::OnceCell<Migrator> = tokio::sync::OnceCell::const_new();

pub(super) async fn setup(s: &SqliteStore) -> StoreResult<()> {
    let migrator =
        MIGRATOR.get_or_try_init(|| Migrator::new(Embedded)).await.map_err(|e| StoreError::Schema(e.to_string()))?;
    // Several processes opening a new file at once race on the migration table (BUSY, or a
    // duplicate version row); the migrations are idempotent, so the loser retries.
    let mut attempt = 0;
    loop {
        match migrator.run(&s.pool).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 8 => {
                attempt += 1;
                tracing::debug!("sqlite migration attempt {attempt} failed, retrying: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
            }
            Err(e) => return Err(StoreError::Schema(e.to_string())),
        }
    }
}

pub(super) async fn schema_version(s: &SqliteStore) -> StoreResult<Option<i64>> {
    sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(&s.pool)
        .await
        .map_err(be("read schema version"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `sqlx::migrate!` embedded came from reading the directory: the embedded list must be
    /// exactly that (every file, same version, description, checksum and text), or a database an
    /// earlier build migrated would fail its checksum check, and a new file would be left out.
    #[tokio::test]
    async fn the_embedded_files_are_what_sqlx_reads_from_the_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
        let from_dir = Migrator::new(dir).await.unwrap();
        let embedded = Migrator::new(Embedded).await.unwrap();
        let key = |m: &Migration| {
            (
                m.version,
                m.description.to_string(),
                m.migration_type,
                m.checksum.to_vec(),
                m.no_tx,
                m.sql.as_str().to_owned(),
            )
        };
        let dir_list: Vec<_> = from_dir.iter().map(key).collect();
        assert_eq!(dir_list.len(), 3);
        assert_eq!(dir_list, embedded.iter().map(key).collect::<Vec<_>>());
    }
}
