//! Retention: old state versions, finished threads and old ledger rows, never a thread that is not
//! completed or whose lease is held. A real run deletes in batches, each its own write transaction.

use super::*;

/// Threads `prune` may clear around: latest state completed, lease not held (`?1` = now).
pub(super) const FINISHED: &str = "SELECT s.thread_id FROM states s \
     WHERE s.version = (SELECT MAX(version) FROM states WHERE thread_id = s.thread_id) \
       AND json_extract(s.state_data, '$.execution_meta.status') = 'completed' \
       AND s.thread_id NOT IN (SELECT thread_id FROM leases WHERE released = 0 AND expires_at > ?1)";

/// Rows a real run deletes per write transaction: a turn waiting for the write lock waits for one
/// batch, not for the whole prune (SQLite has one writer; its busy wait ends after 10 s).
const ROWS_PER_BATCH: i64 = 1000;
/// Threads per batch: each takes its messages, states and ledger rows with it.
const THREADS_PER_BATCH: i64 = 50;

pub(super) async fn prune(s: &SqliteStore, rules: &PruneRules) -> StoreResult<PruneReport> {
    let now = now_secs();
    let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
    // Each rule is counted with the WHERE clause it deletes with, so a dry run reports exactly
    // what the real run would remove. Every value is a bind: `?1` is now, then the rule's own.
    let mut plan: Vec<(String, Vec<f64>)> = Vec::new();
    if let Some(keep) = rules.keep_versions {
        plan.push((
            "FROM states WHERE version <= (SELECT MAX(version) FROM states s2 WHERE s2.thread_id = states.thread_id) - ?2".into(),
            vec![keep.max(1) as f64],
        ));
    }
    if let Some(age) = rules.finished_older_than {
        plan.push((format!("FROM threads WHERE updated_at < ?2 AND thread_id IN ({FINISHED})"), vec![now - age]));
    }
    if let Some(ttl) = rules.ledger_ttl {
        // Rows of threads the rule above deletes are counted there, not twice.
        let from = format!("FROM tool_executions WHERE created_at < ?2 AND thread_id IN ({FINISHED})");
        plan.push(match rules.finished_older_than {
            Some(age) => (
                format!("{from} AND thread_id NOT IN (SELECT thread_id FROM threads WHERE updated_at < ?3)"),
                vec![now - ttl, now - age],
            ),
            None => (from, vec![now - ttl]),
        });
    }
    // Every prune: expired cache entries, which reads skip and nothing else removes.
    plan.push(("FROM cache WHERE expires_at IS NOT NULL AND expires_at <= ?1".into(), vec![]));
    for (from, args) in plan {
        let threads = from.starts_with("FROM threads");
        if rules.dry_run {
            let mut tx = s.write_tx("prune").await?;
            let counted = count(&mut tx, &format!("SELECT COUNT(*) {from}"), now, &args).await?;
            // The ledger rows that go with the threads (cascade) are reported too.
            let ledger = if threads {
                count(
                    &mut tx,
                    &format!("SELECT COUNT(*) FROM tool_executions WHERE thread_id IN (SELECT thread_id {from})"),
                    now,
                    &args,
                )
                .await?
            } else {
                0
            };
            tx.commit("prune").await?;
            tally(&mut report, &from, counted, ledger);
            continue;
        }
        // The table is walked by rowid, a window of rows per write transaction: what qualifies in
        // the window is counted (ledger rows of threads) and deleted, and the next window starts
        // after it. Each window reads at most `size` rows, whatever share qualifies, so every row
        // is read once and a batch's time does not grow with the table.
        let size = if threads { THREADS_PER_BATCH } else { ROWS_PER_BATCH };
        let table = from.split_whitespace().nth(1).unwrap_or_default();
        let mut after: i64 = i64::MIN;
        loop {
            let mut tx = s.write_tx("prune").await?;
            let window = format!(
                "SELECT MAX(rowid) FROM (SELECT rowid FROM {table} WHERE rowid > {after} ORDER BY rowid LIMIT {size})"
            );
            let last: Option<i64> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(window)).fetch_one(tx.conn()).await.map_err(be("prune"))?;
            let Some(last) = last else {
                tx.commit("prune").await?;
                break;
            };
            let chosen = format!("SELECT rowid {from} AND rowid > {after} AND rowid <= {last}");
            let ledger = if threads {
                count(
                    &mut tx,
                    &format!(
                        "SELECT COUNT(*) FROM tool_executions WHERE thread_id IN \
                    (SELECT thread_id FROM threads WHERE rowid IN ({chosen}))"
                    ),
                    now,
                    &args,
                )
                .await?
            } else {
                0
            };
            if threads {
                // Their lease rows too: free (FINISHED excludes a held lease, and this write
                // transaction excludes a take), and tokens come from the file's counter.
                let leases = format!(
                    "DELETE FROM leases WHERE thread_id IN (SELECT thread_id FROM threads WHERE rowid IN ({chosen}))"
                );
                delete(&mut tx, &leases, now, &args).await?;
            }
            let deleted =
                delete(&mut tx, &format!("DELETE FROM {table} WHERE rowid IN ({chosen})"), now, &args).await?;
            tx.commit("prune").await?;
            tally(&mut report, &from, deleted, ledger);
            after = last;
        }
    }
    Ok(report)
}

fn tally(report: &mut PruneReport, from: &str, rows: i64, ledger: i64) {
    if from.starts_with("FROM threads") {
        report.threads += rows as u64;
        report.ledger_rows += ledger as u64;
    } else if from.starts_with("FROM states") {
        report.state_versions += rows as u64;
    } else if from.starts_with("FROM cache") {
        report.cache_entries += rows as u64;
    } else {
        report.ledger_rows += rows as u64;
    }
}

/// Runs a DELETE with the binds of `count`; returns the rows it deleted.
async fn delete(tx: &mut Tx, sql: &str, now: f64, args: &[f64]) -> StoreResult<i64> {
    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).bind(now);
    for a in args {
        q = q.bind(*a);
    }
    Ok(q.execute(tx.conn()).await.map_err(be("prune"))?.rows_affected() as i64)
}

async fn count(tx: &mut Tx, sql: &str, now: f64, args: &[f64]) -> StoreResult<i64> {
    bind_all(sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned())), now, args)
        .fetch_one(tx.conn())
        .await
        .map_err(be("prune"))
}

/// A count query with its binds: now, then the rule's values in order.
fn bind_all<'q>(
    mut q: sqlx::query::QueryScalar<'q, sqlx::Sqlite, i64, sqlx::sqlite::SqliteArguments>,
    now: f64,
    args: &[f64],
) -> sqlx::query::QueryScalar<'q, sqlx::Sqlite, i64, sqlx::sqlite::SqliteArguments> {
    q = q.bind(now);
    for a in args {
        q = q.bind(*a);
    }
    q
}
