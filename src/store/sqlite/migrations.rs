//! The schema: the `.sql` files of `migrations/sqlite`, applied by sqlx's migrator, and the
//! version they reached.

use super::*;

pub(super) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

pub(super) async fn setup(s: &SqliteStore) -> StoreResult<()> {
    // Several processes opening a new file at once race on the migration table (BUSY, or a
    // duplicate version row); the migrations are idempotent, so the loser retries.
    let mut attempt = 0;
    loop {
        match MIGRATOR.run(&s.pool).await {
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
